"""Parallel layouts: tensor x pipeline x data parallelism over the GPUs of one job (docs/model.md, "Layouts").

One module or folder per idea, as picotron keeps one per parallel dimension: :mod:`~workbench.parallel.layout`
(the :class:`~workbench.parallel.layout.Layout` value and its rank grid) and
:mod:`~workbench.parallel.collectives` (what a collective costs on its links).
"""
