"""A tensor-parallel group to shard on: ``tp`` ranks of a fake process group, or the real one a rank runs in.

Under fake tensors nothing runs on other ranks, so torch's fake process group stands for them
(``torch.testing._internal.distributed.fake_pg``: every collective returns at once with its output's shape,
which is all a fake tensor needs); the device mesh over it is a CPU one, as torchtitan's memory estimator
makes. :func:`tp_mesh` starts that group when none is running and ends it after; inside a real job (gloo
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

__all__ = ["tp_mesh", "forget_sharding_decisions"]


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
            forget_sharding_decisions()


def forget_sharding_decisions() -> None:
    """Empty DTensor's caches of sharding propagation (torch's C++ fast path and its Python LRU cache). A fake
    mesh equals, by value, a real mesh of the same ranks and names, so a decision cached under the fake group
    (its output specs name the fake mesh) would be reused by real DTensors made later in this process, or in
    processes forked from it, and their collectives would go to the fake group: no communication, wrong
    gradients (measured: a tp=2 layout forked after a fake profile, relative gradient error 0.75 instead of 3e-7)."""
    import torch
    from torch.distributed.tensor import DTensor

    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
