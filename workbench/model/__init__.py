"""The values the workbench computes with (docs/model.md): the instance, what a device holds, the plan and its trace.

Read in this order:

* :mod:`~workbench.model.units` (parsing and formatting sizes, bandwidths, times) and
  :mod:`~workbench.model.tolerances` (every numerical tolerance, named);
* :mod:`~workbench.model.chain` (``Layer``, ``Chain``, ``Platform``: the instance; ``Platform`` the hardware only),
  :mod:`~workbench.model.training_setup` and :mod:`~workbench.model.target` (the set-up, and the two side by side:
  what a planner takes) and :mod:`~workbench.model.graph`
  (a DAG profile and the chain linearised from it); :mod:`~workbench.model.accelerators` (the GPUs people
  rent, as data: peak FLOP/s, memory, links);
* the memory model: :mod:`~workbench.model.memory_columns` (the profile's columns, measured or estimated),
  :mod:`~workbench.model.ties` (shared parameters), :mod:`~workbench.model.memory` (what a layer, a stage and
  a device hold), :mod:`~workbench.model.memory_zero` (what a rank of a data-parallel group holds, per ZeRO
  level), :mod:`~workbench.model.memory_bands` (the same over many stages at once, for the planners) and
  :mod:`~workbench.model.memory_views` (over a whole plan: per device, split by term);
* :mod:`~workbench.model.activations` (keep, recompute or offload per layer: the effective chain) and
  :mod:`~workbench.model.split` (a backward's input- and weight-gradient parts);
* :mod:`~workbench.model.plan` (``Plan``, its JSON and the simple lower bound), :mod:`~workbench.model.plan_extra`
  (the schema of ``Plan.extra``), :mod:`~workbench.model.training_setup` (the training set-up a plan records),
  :mod:`~workbench.model.layout` (the layout tp x pp x dp a plan may name: its ``"parallel"`` object and rank grid) and
  :mod:`~workbench.model.trace` (what a simulation or a run recorded).

Nothing here orders, plans, checks or runs: :mod:`workbench.schedules`, :mod:`workbench.planners`,
:mod:`workbench.verify` and :mod:`workbench.runtime` build on it.
"""
