"""The model the workbench computes with (docs/model.md): the instance, the plan and what a device holds.

Read in this order:

* :mod:`~workbench.model.units` (sizes, bandwidths, times) and :mod:`~workbench.model.tolerances`
  (every numerical tolerance, named);
* :mod:`~workbench.model.chain` (``Layer``, ``Chain``, ``Platform``) and :mod:`~workbench.model.graph`
  (a DAG profile and the chain linearised from it); :mod:`~workbench.model.accelerators` (the GPUs people
  rent, as data: peak FLOP/s, memory, links);
* :mod:`~workbench.model.memory` (what a layer, a stage and a device hold) and
  :mod:`~workbench.model.memory_views` (the same over a whole plan: per device, split by term);
* :mod:`~workbench.model.activations` (keep, recompute or offload per layer: the effective chain) and
  :mod:`~workbench.model.split` (a backward's input- and weight-gradient parts);
* :mod:`~workbench.model.plan` (``Plan`` and its JSON), :mod:`~workbench.model.plan_extra` (the schema of
  ``Plan.extra``) and :mod:`~workbench.model.trace` (what a simulation or a run recorded).

Nothing here plans, checks or runs: :mod:`workbench.planners`, :mod:`workbench.verify` and
:mod:`workbench.runtime` build on it.
"""
