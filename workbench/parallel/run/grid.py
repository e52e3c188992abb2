"""The process-group grid of a layout: torch's ``DeviceMesh`` over the ranks, and the groups of tied parameters.

A rank of a :class:`~workbench.model.layout.Layout` joins one mesh of shape ``(pp, dp, tp)`` with the
dimension names ``("pp", "dp", "tp")`` (torchtitan's order, tp innermost), built by torch's
``init_device_mesh``: rank ``r`` sits at :meth:`Layout.coords(r) <workbench.model.layout.Layout.coords>`,
so the mesh and the layout number the ranks alike (:func:`mesh_coords` says where torch put this rank).
Each transform takes the sub-mesh of its dimension: ``mesh["tp"]`` for tensor parallelism, ``mesh["dp"]``
for DDP and FSDP, ``mesh["pp"].get_group()`` for the pipeline's sends and receives.

Tied parameters (an embedding and its LM head) whose layers sit on several pipeline stages are kept tied as
Megatron's embedding group keeps them: the ranks that hold a copy and share their ``dp`` and ``tp``
coordinates all-reduce the copy's gradient before the optimizer's step (:func:`tie_ranks`). Under ``tp``
each copy is sharded alike (vocabulary-parallel: rows of the embedding, rows of the head's weight), so the
ranks of one group hold the same rows and add them; under FSDP each holds the same shard.

>>> from workbench.model.layout import Layout
>>> lay = Layout(tp=2, pp=3, dp=2)
>>> tie_ranks(lay, holders=(0, 2), rank=5)      # rank 5 is pp 1: it holds no copy
()
>>> tie_ranks(lay, holders=(0, 2), rank=9), lay.coords(9)
((1, 9), (2, 0, 1))
>>> [g for g in all_tie_ranks(lay, holders=(0, 2))]
[(0, 8), (1, 9), (2, 10), (3, 11)]
"""

from __future__ import annotations

from typing import Any, Sequence

from workbench.model.layout import DIMENSIONS, Layout

__all__ = ["build_mesh", "mesh_coords", "tie_ranks", "all_tie_ranks", "tie_groups"]


def build_mesh(layout: Layout, device_type: str = "cpu") -> Any:
    """torch's ``DeviceMesh`` of the layout over the started process group: shape (pp, dp, tp), names
    ``("pp", "dp", "tp")``; it creates every dimension's process groups (a collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, tuple(layout.degree(d) for d in DIMENSIONS), mesh_dim_names=DIMENSIONS)


def mesh_coords(mesh: Any) -> tuple[int, int, int]:
    """This rank's (pp, dp, tp) coordinates as torch's mesh places it."""
    return tuple(int(mesh[d].get_local_rank()) for d in DIMENSIONS)  # type: ignore[return-value]


def all_tie_ranks(layout: Layout, holders: Sequence[int]) -> list[tuple[int, ...]]:
    """For one tied parameter held by the pipeline coordinates ``holders``: one group of ranks per (dp, tp)
    coordinate, the ranks at those pipeline coordinates, in the order every rank creates them."""
    pps = sorted(set(int(h) for h in holders))
    return [tuple(layout.rank(pp=p, dp=d, tp=t) for p in pps) for d in range(layout.dp) for t in range(layout.tp)]


def tie_ranks(layout: Layout, holders: Sequence[int], rank: int) -> tuple[int, ...]:
    """The group of ``rank`` for a tied parameter held at pipeline coordinates ``holders`` (empty when
    ``rank`` holds no copy)."""
    return next((g for g in all_tie_ranks(layout, holders) if rank in g), ())


def tie_groups(layout: Layout, holders_per_tie: Sequence[Sequence[int]], rank: int) -> list[Any]:
    """Per tie held on two or more pipeline coordinates: this rank's process group (None where it holds no
    copy). Every rank creates every group in the same order (``new_group`` is collective)."""
    import torch.distributed as dist

    mine: list[Any] = []
    for holders in holders_per_tie:
        group = None
        if len(set(holders)) > 1:
            for ranks in all_tie_ranks(layout, holders):
                g = dist.new_group(list(ranks))
                if rank in ranks:
                    group = g
        mine.append(group)
    return mine
