"""A tensor-parallel group to shard on: ``tp`` ranks of a fake process group, or the real one a rank runs in.

Under fake tensors nothing runs on other ranks, so torch's fake process group stands for them
(``torch.testing._internal.distributed.fake_pg``: every collective returns at once with its output's shape,
which is all a fake tensor needs); the device mesh over it is a CPU one, as torchtitan's memory estimator
makes. :func:`tp_mesh` starts that group when none is running and ends it after, with DTensor's caches of
what it decided on that mesh (:func:`forget_dtensor_meshes`); inside a real job (gloo
ranks started by :mod:`workbench.parallel.tensor.real`, or torchrun) it uses the group that is running.
The mesh is made outside any fake-tensor mode (it reads its rank map's values).

>>> with tp_mesh(2) as mesh:
...     mesh.size(), dist.get_backend()
(2, 'fake')
>>> dist.is_initialized()
False
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.distributed as dist

__all__ = ["tp_mesh", "forget_dtensor_meshes"]


@contextlib.contextmanager
def tp_mesh(tp: int, rank: int = 0) -> Iterator[object]:
    """A CPU ``DeviceMesh`` of ``tp`` ranks (this process is ``rank``): over the running process group if
    there is one (its world must be ``tp``), else over a fake group started here and ended on exit."""
    from torch.distributed.device_mesh import init_device_mesh

    started = False
    if dist.is_initialized():
        if dist.get_world_size() != tp:
            raise ValueError(f"tensor parallelism: tp={tp}, but the running process group has "
                             f"{dist.get_world_size()} ranks")
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp)
        started = True
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
        yield mesh
    finally:
        if started:
            dist.destroy_process_group()
            forget_dtensor_meshes()


def forget_dtensor_meshes() -> None:
    """Clear DTensor's caches of sharding decisions and redistribution plans. They are keyed by device mesh, and
    a ``DeviceMesh`` compares equal by its ranks, shape and names, not its process group: a process that profiled
    under a fake group of ``tp`` ranks (:mod:`workbench.parallel.tensor.profile`), or a rank forked from it, would
    otherwise take the fake mesh's cached results for its own mesh of the same shape and send its collectives to
    the fake group (measured: TP 4 x PP 1 x DP 1, whose ``tp`` mesh is the whole world, every gradient wrong by a
    relative 1.0-1.7 against one process)."""
    import torch
    from torch.distributed.tensor import DTensor, _redistribute

    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:         # the C++ dispatch's own cache (torch 2.10 on)
        clear_native()
    prop = DTensor._op_dispatcher.sharding_propagator
    prop.propagate_op_sharding.cache_clear()
    for cached in (getattr(type(prop), "_propagate_tensor_meta_cached", None),
                   getattr(_redistribute, "_gen_transform_infos", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
