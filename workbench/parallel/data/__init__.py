"""Data parallelism, one module per concern (docs/model.md, "Layouts"). What a rank of a data-parallel group
holds under each ZeRO level is part of the memory model (:mod:`workbench.model.memory_zero`); here: what its
collectives cost and how much of them compute hides (:mod:`~workbench.parallel.data.time`), and torch's
own trackers around a real FSDP2 or DDP step on a fake world, the independent check of the memory terms
(:mod:`~workbench.parallel.data.witness`), and every rank's predicted peak for the runtime that measures it
(:mod:`~workbench.parallel.data.ranks`: :func:`rank_memory`, :func:`rank_memory_terms`).
"""

from workbench.parallel.data.ranks import rank_memory, rank_memory_terms

__all__ = ["rank_memory", "rank_memory_terms"]
