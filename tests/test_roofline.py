"""The roofline's work counts against formulas written here, and its prices against hand arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from workbench.model.accelerators import accelerator
from workbench.profiles.roofline import (
    H100_CALIBRATION,
    KINDS,
    UNCALIBRATED,
    Calibration,
    RooflineTimes,
    WorkCounter,
    estimate,
    layer_work,
)

H100 = accelerator("h100-sxm")


def _kind(work, name):
    return work.kind == KINDS.index(name)


def test_a_linear_layers_flops_are_2mnk_forward_and_twice_that_backward():
    m, k, n = 64, 96, 80
    work = layer_work(torch.nn.Linear(k, n), torch.zeros(m, k), True, None, torch.ones(m, n))
    assert work.forward.flops.sum() == 2 * m * n * k
    assert work.backward.flops.sum() == 2 * (2 * m * n * k)      # input gradient and weight gradient
    # the first layer's input needs no gradient: only the weight's
    first = layer_work(torch.nn.Linear(k, n), torch.zeros(m, k), False, None, torch.ones(m, n))
    assert first.backward.flops.sum() == 2 * m * n * k


def test_a_convolutions_flops():
    conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False)
    work = layer_work(conv, torch.zeros(2, 8, 10, 10), True, None, torch.ones(2, 16, 10, 10))
    macs = 2 * 16 * 10 * 10 * 8 * 3 * 3
    assert work.forward.flops.sum() == 2 * macs and _kind(work.forward, "conv").any()


def test_causal_attention_counts_half_its_square():
    b, h, s, d = 2, 4, 64, 16
    q = torch.zeros(b, h, s, d)
    counter = WorkCounter()
    with counter:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    work = counter.take()
    att = work.flops[_kind(work, "attention")]
    assert att.sum() == pytest.approx(0.5 * 4 * b * h * s * s * d)


def test_bytes_of_an_elementwise_op_and_no_cost_for_views():
    counter = WorkCounter()
    x = torch.zeros(1000)
    with counter:
        y = x.view(10, 100).t()            # views: dispatched, no kernel
        z = torch.relu(y)                  # reads 4000 bytes, writes 4000
        torch.empty(10)                    # an allocation: no kernel
    work = counter.take()
    kernel = work.kind != KINDS.index("host")
    assert len(work) == 4 and work.kernels == 1 and z.shape == (100, 10)
    assert work.bytes[kernel].tolist() == [8000] and work.flops.sum() == 0 and work.bytes[~kernel].sum() == 0


def test_in_place_operations_count_what_they_write():
    counter = WorkCounter()
    xs = [torch.zeros(100), torch.zeros(50)]
    with counter:
        torch._foreach_mul_(xs, 2.0)       # returns nothing: reads and writes both tensors
    work = counter.take()
    assert work.kernels == 1 and work.bytes.sum() == 2 * 4 * 150


def test_a_16_bit_matmul_with_a_dimension_off_the_multiples_of_8_is_misaligned():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.zeros(64, 768, dtype=torch.bfloat16)
        odd = layer_work(torch.nn.Linear(768, 50257, bias=False, dtype=torch.bfloat16), x, True, None,
                         torch.zeros(64, 50257, dtype=torch.bfloat16))
        even = layer_work(torch.nn.Linear(768, 50304, bias=False, dtype=torch.bfloat16), x, True, None,
                          torch.zeros(64, 50304, dtype=torch.bfloat16))
    mm = KINDS.index("matmul")
    assert not odd.forward.aligned[odd.forward.kind == mm].any() and not odd.backward.aligned[
        odd.backward.kind == mm].any()
    assert even.forward.aligned.all() and even.backward.aligned.all()


def test_a_broadcast_operand_is_read_once():
    counter = WorkCounter()
    a, b = torch.zeros(100, 50), torch.zeros(50)
    with counter:
        a + b
    work = counter.take()
    assert work.bytes[0] == 4 * (5000 + 50 + 5000)


def test_estimate_is_a_roofline_then_the_published_kernel_times():
    from workbench.profiles.kernel_time import M_GEMM, T_GEMM, memory_fraction

    m = k = n = 2048
    work = layer_work(torch.nn.Linear(k, n, bias=False), torch.zeros(m, k), True, None, torch.ones(m, n)).forward
    flops = float(work.flops.sum())
    assert estimate(work, H100) == pytest.approx(flops / H100.flops["float32"])          # compute-bound
    cal = Calibration(compute={"matmul/float32": 0.5}, kernel_floor=1e-6, launch=(1e-5, 1e-5))
    gemm = T_GEMM + max(flops / (0.5 * H100.flops["float32"]), float(work.bytes.sum()) / (H100.memory_bandwidth
                                                                                           * M_GEMM))
    assert estimate(work, H100, cal) == pytest.approx(1e-5 + gemm)     # its launch, then the kernel
    relu = WorkCounter()
    x = torch.zeros(10**6)
    with relu:
        torch.relu(x)
    w = relu.take()
    stream = memory_fraction(H100, cal) * H100.memory_bandwidth          # what STREAM measures on an H100
    assert estimate(w, H100, cal) == pytest.approx(1e-5 + 1e-6 + 8e6 / stream)   # memory-bound


def test_bf16_runs_on_tensor_cores_and_fp32_convolutions_in_tf32():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():                   # shapes only: large enough to be compute-bound, nothing computed
        n = 4096
        fp32 = layer_work(torch.nn.Linear(n, n, bias=False), torch.zeros(n, n), True, None, torch.ones(n, n))
        lin = torch.nn.Linear(n, n, bias=False, dtype=torch.bfloat16)
        x = torch.zeros(n, n, dtype=torch.bfloat16)
        bf = layer_work(lin, x, True, None, x)
        conv = torch.nn.Conv2d(256, 256, 3, padding=1, bias=False)
        cw = layer_work(conv, torch.zeros(32, 256, 56, 56), True, None, torch.ones(32, 256, 56, 56)).forward
    assert estimate(fp32.forward, H100) / estimate(bf.forward, H100) == pytest.approx(989.5 / 66.9, rel=1e-6)
    assert estimate(cw, H100) == pytest.approx(float(cw.flops.sum()) / H100.flops["tf32"])


def test_calibration_falls_back_by_kind_then_to_the_peak():
    cal = Calibration(compute={"matmul/float32": 0.4, "conv": 0.3})
    assert cal.efficiency("matmul", "float32") == 0.4
    assert cal.efficiency("conv", "tf32") == 0.3 and cal.efficiency("attention", "float32") == 1.0
    assert UNCALIBRATED.efficiency("matmul", "float32") == 1.0
    assert all(0 < v <= 1 for v in H100_CALIBRATION.compute.values())


def test_roofline_times_keep_every_layers_work():
    times = RooflineTimes(H100, UNCALIBRATED)
    f, b = times(torch.nn.Linear(8, 8), torch.zeros(4, 8), None, True, None, torch.ones(4, 8), 0, 1)
    assert len(times.works) == 1 and f == [estimate(times.works[0].forward, H100)] and b[0] > f[0]
    assert b == [estimate(times.works[0].backward, H100, backward=True)]
    assert "estimated, not measured" in times.describe() and H100.label in times.describe()


def test_attention_is_recorded_as_the_fused_kernel_inside_fused_kernels_and_suspended_work_is_not():
    from workbench.profiles.fused import fused_kernels, suspended

    q = torch.randn(1, 2, 64, 16)
    for kernels, kind in (("eager", "attention"), ("fused", "attention_fused")):
        counter = WorkCounter()
        with fused_kernels(None, kernels), counter:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        work = counter.take()
        assert [KINDS[k] for k in work.kind] == [kind]
    counter = WorkCounter()
    with counter:
        with suspended():
            torch.relu(q) + 1
        counter.record_fused("x", 100.0, torch.bfloat16)
    work = counter.take()
    assert len(work) == 1 and work.bytes[0] == 100.0 and KINDS[work.kind[0]] == "memory"
