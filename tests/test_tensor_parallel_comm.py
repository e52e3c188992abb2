"""workbench.parallel.tensor.comm: every collective's phase, kind and bytes, counted as CommDebugMode counts."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from workbench.parallel.tensor.comm import Collective, CollectiveBytes, summary
from workbench.parallel.tensor.mesh import tp_mesh


def test_kinds_and_bytes_of_redistributions():
    with tp_mesh(4) as mesh, CollectiveBytes() as comm:
        local = torch.ones(8, 16)                                  # 512 bytes on each rank
        DTensor.from_local(local, mesh, (Partial(),)).redistribute(mesh, (Replicate(),))
        DTensor.from_local(local, mesh, (Shard(0),)).redistribute(mesh, (Replicate(),))
        DTensor.from_local(local, mesh, (Partial(),)).redistribute(mesh, (Shard(0),))
    assert comm.records == [Collective("forward", "all_reduce", 512),
                            Collective("forward", "all_gather", 4 * 512),     # the gathered tensor
                            Collective("forward", "reduce_scatter", 512)]     # the tensor before it is split
    assert comm.get_total_counts() == 3                        # CommDebugMode's own count agrees
    assert comm.total("forward") == 3072 and comm.total("backward") == 0


def test_backward_collectives_are_told_apart():
    from torch.distributed.tensor import distribute_tensor

    with tp_mesh(2) as mesh:
        weight = distribute_tensor(torch.ones(8, 4), mesh, (Shard(0),)).requires_grad_()   # column-wise
        with CollectiveBytes() as comm:
            x = torch.ones(3, 4, requires_grad=True)                  # 48 bytes
            out = torch.nn.functional.linear(DTensor.from_local(x, mesh, (Replicate(),)), weight)
            assert comm.records == []                                  # the forward needs no collective
            out.to_local().sum().backward()
    assert comm.records == [Collective("backward", "all_reduce", 48)]  # the input's gradient, summed
    assert comm.take() and comm.records == []


def test_summary_counts_each_kind():
    records = [Collective("forward", "all_reduce", 10), Collective("backward", "all_gather", 5),
               Collective("backward", "all_gather", 5)]
    assert summary(records) == "forward: 1 all_reduce (10 B); backward: 2 all_gather (10 B)"
    assert summary([]) == ""


def test_waited_collectives_wait_where_issued():
    import torch.distributed._functional_collectives as funcol

    from workbench.parallel.tensor.comm import waited_collectives

    with tp_mesh(2) as mesh:
        lazy = funcol.all_reduce(torch.ones(2), "sum", mesh)
        with waited_collectives():
            waited = funcol.all_reduce(torch.ones(2), "sum", mesh)
        lazy.wait()
    assert isinstance(lazy, funcol.AsyncCollectiveTensor) and type(waited) is torch.Tensor
