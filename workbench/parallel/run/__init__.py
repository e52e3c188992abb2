"""Run a layout: tensor x pipeline x data parallelism on torch's own pieces, every rank measured (issue 37).

One module per idea, one transform per dimension, as picotron and torchtitan compose them:

- :mod:`~workbench.parallel.run.grid`: the process-group grid (torch's ``DeviceMesh`` of the layout) and the
  groups that keep tied parameters tied across pipeline stages;
- :mod:`~workbench.parallel.run.tensor`: ``tp``, the sharding plan of :mod:`workbench.parallel.tensor`;
- :mod:`~workbench.parallel.run.data`: ``dp``, ``zero`` 0-3 as DDP, ``ZeroRedundancyOptimizer``, FSDP2;
- :mod:`~workbench.parallel.run.pipeline`: ``pp``, ``PipelineStage`` and the plan's schedule;
- :mod:`~workbench.parallel.run.memory`: every rank's peak by torch's ``MemTracker`` / ``FSDPMemTracker``;
- :mod:`~workbench.parallel.run.config`, :mod:`~workbench.parallel.run.rank`: what a rank needs, what it does;
- :mod:`~workbench.parallel.run.launch`: the ranks started and concluded (one machine, or ``torchrun``);
- :mod:`~workbench.parallel.run.checks`: what is refused before any rank starts;
- :mod:`~workbench.parallel.run.summary`: predicted against measured, per rank;
- :mod:`~workbench.parallel.run.command`: ``python -m workbench run`` for a layout plan.

Importing this package does not import torch.

>>> import workbench.parallel.run as run
>>> run.__name__
'workbench.parallel.run'
"""
