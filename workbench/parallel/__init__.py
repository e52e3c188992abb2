"""Parallel layouts: tensor x pipeline x data parallelism over the GPUs of one job (docs/model.md, "Layouts").

One module or folder per idea, as picotron keeps one per parallel dimension. The layout itself (the
:class:`~workbench.model.layout.Layout` value and its rank grid) is part of the plan, its JSON's ``"parallel"``
object, and lives with it in :mod:`workbench.model.layout`. Here: :mod:`~workbench.parallel.collectives` (what a
collective costs on its links), a folder per dimension (:mod:`~workbench.parallel.tensor`,
:mod:`~workbench.parallel.data`), :mod:`~workbench.parallel.profiles` (the chain of one rank, cached),
:mod:`~workbench.parallel.evaluate` (one layout's step, throughput and per-rank memory),
:mod:`~workbench.parallel.search` (the fastest layout that fits), :mod:`~workbench.parallel.run` (a layout on CPU
ranks) and :mod:`~workbench.parallel.export` (a layout in torchtitan's and Megatron-LM's terms).
"""
