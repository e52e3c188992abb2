"""workbench.profiles.local: the profiler counts a DTensor by the shard this rank holds."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from workbench.parallel.tensor.mesh import tp_mesh
from workbench.profiles.local import defer_to_subclass, local_bytes, local_parts
from workbench.profiles.memtrace import AllocationTracker, layer_memory
from workbench.profiles.profiler import parameter_bytes, saved_tensor_bytes


def test_a_dtensor_is_its_local_shard():
    with tp_mesh(4) as mesh:
        d = distribute_tensor(torch.zeros(8, 6), mesh, (Shard(0),))
        assert [tuple(p.shape) for p in local_parts(d)] == [(2, 6)] and local_bytes(d) == 2 * 6 * 4
        assert defer_to_subclass((DTensor,)) and not defer_to_subclass((torch.Tensor,))


def test_tracker_and_profiler_count_the_rank_s_shard():
    with tp_mesh(2) as mesh:
        lin = parallelize_module(torch.nn.Linear(16, 32, bias=False), mesh, ColwiseParallel())
        assert parameter_bytes(lin) == 16 * 16 * 4                      # half the rows
        x = torch.randn(4, 16)
        lin(x)          # a DTensor's first operation of a kind probes its shapes (workbench.parallel.tensor.times)
        with AllocationTracker([x, *lin.parameters()]) as t:     # the sharded weight: known, its shard
            y = lin(x)
        assert t.current == 4 * 16 * 4 and tuple(y.shape) == (4, 16)    # the local output only
        cols = layer_memory(lin, x, input_requires_grad=True)
        assert cols["grad_bytes"] == cols["max_param_bytes"] == 16 * 16 * 4
        saved, _ = saved_tensor_bytes(lin, x)
        assert saved == 4 * 16 * 4                                       # its input; the weight is excluded


def test_a_wait_that_returns_a_new_tensor_takes_over_the_bytes():
    t = AllocationTracker()
    with t:
        a = torch.ones(10)                     # 40 bytes
        b = torch.empty(10)
        t._move(a, b)                          # as a fake collective's wait hands back a new tensor
        t._register(b)
        del a
    assert t.current == 40 and t.peak == 80   # b's 40, counted once; (empty's own 40 at the peak)
