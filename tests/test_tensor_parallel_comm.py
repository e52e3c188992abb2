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


class _MLP(torch.nn.Module):
    def __init__(self, h=16, f=32):
        super().__init__()
        self.up, self.down = torch.nn.Linear(h, f, bias=False), torch.nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _paired(module_plan):
    from torch.distributed.tensor.parallel import parallelize_module

    from workbench.parallel.tensor.comm import PairedCollectives, waited_collectives

    with tp_mesh(2) as mesh, waited_collectives():
        mlp = parallelize_module(_MLP(), mesh, module_plan())
        x = torch.randn(8, 16, requires_grad=True)
        mlp(x).sum().backward()         # once unrecorded: a DTensor's first run probes shapes at the global sizes
        with PairedCollectives() as comm:
            y = mlp(x)
            y.sum().backward()
    return comm


def test_sequence_parallel_gathers_pair_with_the_matmuls_they_feed_and_scatters_with_those_they_reduce():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def plan():   # Megatron's sequence parallelism: the tokens split before up and after down
        return {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel(output_layouts=Shard(0))}

    comm = _paired(plan)
    got = [(c.phase, c.kind, p) for c, p in zip(comm.records, comm.pairs)]
    assert comm.matmuls == {"forward": 2, "backward": 4}     # up, down; each an input- and a weight-gradient matmul
    assert got[:2] == [("forward", "all_gather", (0,)), ("forward", "reduce_scatter", (1,))]
    (ag, ag_mm), (rs, rs_mm) = [(c.kind, p) for c, p in zip(comm.records, comm.pairs) if c.phase == "backward"]
    # the gathered gradient of down's output feeds down's input gradient (its rows: not the weight gradient,
    # which reads it transposed); up's input gradient is what the reduce-scatter reduces
    assert (ag, rs) == ("all_gather", "reduce_scatter")
    assert len(ag_mm) == 1 and len(rs_mm) == 1 and ag_mm != rs_mm


def test_all_reduces_pair_with_nothing():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    comm = _paired(lambda: {"up": ColwiseParallel(), "down": RowwiseParallel()})
    assert [c.kind for c in comm.records] == ["all_reduce", "all_reduce"]
    assert comm.pairs == [(), ()]
