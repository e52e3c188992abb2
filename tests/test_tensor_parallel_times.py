"""workbench.parallel.tensor.times: the roofline of a rank's local operations plus its collectives on NVLink."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from workbench.model.accelerators import accelerator
from workbench.parallel.tensor.comm import Collective, waited_collectives
from workbench.parallel.tensor.mesh import tp_mesh
from workbench.parallel.tensor.times import TensorParallelTimes
from workbench.profiles.roofline import RooflineTimes, estimate
from workbench.profiles.timing import Timer

H100 = accelerator("h100-sxm")


class MLP(nn.Module):
    def __init__(self, h=256, f=1024):
        super().__init__()
        self.up, self.down = nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _time(times, module, x):
    with waited_collectives():           # real tensors on a fake group: as a profile runs them
        return times(module, x, Timer(torch.device("cpu")), True, None, torch.ones(x.shape), 0, 1)


@pytest.mark.parametrize("tp", [2, 4])
def test_local_work_plus_ring_all_reduce_on_the_link(tp):
    x = torch.randn(64, 256)
    whole = RooflineTimes(H100)
    _time(whole, MLP(), x)
    with tp_mesh(tp) as mesh:
        module = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        times = TensorParallelTimes(H100, tp)
        (fwd,), (bwd,) = _time(times, module, x)
    work, records = times.works[0], times.collectives[0]
    # each rank multiplies 1/tp of the matmuls: its FLOPs, counted independently from the shapes
    assert work.forward.flops.sum() == pytest.approx(2 * 64 * 256 * 1024 * 2 / tp)
    assert whole.works[0].forward.flops.sum() == pytest.approx(2 * 64 * 256 * 1024 * 2)
    assert records == [Collective("forward", "all_reduce", 64 * 256 * 4), Collective("backward", "all_reduce",
                                                                                     64 * 256 * 4)]
    ring = 2 * (tp - 1) / tp * 64 * 256 * 4 / H100.link_bandwidth        # bytes each rank sends, at NVLink's rate
    assert fwd == pytest.approx(estimate(work.forward, H100, times.calibration) + ring)
    assert bwd == pytest.approx(estimate(work.backward, H100, times.calibration, backward=True) + ring)


def test_a_layer_without_collectives_is_its_roofline():
    x = torch.randn(16, 256)
    with tp_mesh(2):
        times = TensorParallelTimes(H100, 2)
        got = _time(times, MLP(), x)
    assert times.collectives == [[]]
    assert got == _time(RooflineTimes(H100), MLP(), x)


def test_bandwidth_and_latency_can_be_set():
    times = TensorParallelTimes(H100, 8, bandwidth=100e9, latency=1e-6)
    one = [Collective("forward", "all_reduce", 1e9)]
    assert times.collective_seconds(one) == pytest.approx(14 * 1e-6 + 2 * 7 / 8 * 1e9 / 100e9)
    assert "100 GB/s" in times.describe() and "not overlapped" in times.describe()


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_keeps_its_collectives_seconds_and_their_overlapped_cost(tp):
    import numpy as np
    from torch.distributed.tensor import Shard

    from workbench.parallel.tensor.overlap import overlapped_seconds
    from workbench.profiles.kernel_time import KINDS, kernel_seconds

    x = torch.randn(64, 256)
    with tp_mesh(tp) as mesh:
        plan = {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel(output_layouts=Shard(0))}
        module = parallelize_module(MLP(), mesh, plan)
        times = TensorParallelTimes(H100, tp)
        (fwd,), (bwd,) = _time(times, module, x)
    work = times.works[0]
    comm_f, comm_b, exposed_f, exposed_b = times.overlap[0]
    gathered = tp * 64 * 256 * 4     # x is one rank's tokens: the all-gather's output, the reduce-scatter's input
    ring = (tp - 1) / tp * gathered / H100.link_bandwidth
    assert comm_f == pytest.approx(2 * ring) and comm_b == pytest.approx(2 * ring)
    # not overlapped, as before: the work plus every collective on the critical path
    assert fwd == pytest.approx(estimate(work.forward, H100, times.calibration) + comm_f)
    assert bwd == pytest.approx(estimate(work.backward, H100, times.calibration, backward=True) + comm_b)
    # overlapped: the forward's all-gather beside up's matmul, its reduce-scatter beside down's (TE's methods)
    mm = work.forward.kind == KINDS.index("matmul")
    up, down = kernel_seconds(work.forward.kind, work.forward.precision, work.forward.flops, work.forward.bytes,
                              work.forward.aligned, H100, times.calibration, False)[mm]
    want = (overlapped_seconds("forward", "all_gather", ring, up, tp, 132) - up
            + overlapped_seconds("forward", "reduce_scatter", ring, down, tp, 132) - down)
    assert exposed_f == pytest.approx(want)
    assert exposed_f >= 0 and exposed_b >= 0 and np.isfinite(exposed_b)


def test_without_collectives_nothing_to_overlap():
    x = torch.randn(16, 256)
    with tp_mesh(2):
        times = TensorParallelTimes(H100, 2)
        _time(times, MLP(), x)
    assert times.overlap == [(0.0, 0.0, 0.0, 0.0)]
