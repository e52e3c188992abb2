"""workbench.parallel.tensor.mesh: a fake group of tp ranks, started and ended; a running group used."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from workbench.parallel.tensor.mesh import tp_mesh


def test_fake_group_is_started_and_ended():
    assert not dist.is_initialized()
    with tp_mesh(4) as mesh:
        assert mesh.size() == 4 and dist.get_world_size() == 4 and dist.get_backend() == "fake"
        assert mesh.mesh_dim_names == ("tp",)
    assert not dist.is_initialized()


def test_a_running_group_is_used_and_must_have_tp_ranks():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with tp_mesh(2) as mesh:
            assert mesh.size() == 2
        assert dist.is_initialized()                  # not ours: left running
        with pytest.raises(ValueError, match="tp=4, but the running process group has 2 ranks"):
            with tp_mesh(4):
                pass
    finally:
        dist.destroy_process_group()


def test_no_sharding_decision_made_on_the_fake_group_outlives_it():
    """A DTensor op on the fake mesh caches its sharding decision (whose output names the fake mesh, equal by
    value to a real one); ending the fake group empties the caches, so later real DTensors decide afresh."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    propagator = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
    with tp_mesh(2) as mesh:
        x = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        (x @ distribute_tensor(torch.ones(4, 4), mesh, [Replicate()])).sum()
        assert propagator.cache_info().currsize + _native_entries() > 0     # the op was decided, and cached
    assert propagator.cache_info().currsize == 0 and _native_entries() == 0


def _native_entries() -> int:
    """What torch's C++ DTensor dispatch cache reports (its counters; all 0 once cleared; 0 without one)."""
    import torch

    stats = getattr(torch._C, "_get_DTensor_sharding_propagator_cache_stats", None)
    return int(sum(stats())) if stats is not None else 0
