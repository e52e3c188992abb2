"""The operation-level time model: GEMMs saturate toward the published ceiling, launches hide behind long
kernels, attention grows with the sequence, and GPUs differ by their datasheets and published figures."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from workbench.model.accelerators import accelerator
from workbench.profiles.kernel_time import (
    H100_CALIBRATION,
    KINDS,
    M_GEMM,
    PUBLISHED,
    T_GEMM,
    UNCALIBRATED,
    Calibration,
    gemm_efficiency,
    phase_seconds,
    published,
)
from workbench.profiles.roofline import WorkCounter, estimate

H100, A100, H200 = accelerator("h100-sxm"), accelerator("a100-40gb"), accelerator("h200")
#: the fitted calibration without the CPU: kernels alone
KERNELS_ONLY = dataclasses.replace(H100_CALIBRATION, launch=(0.0, 0.0), overhead=0.0)


def _ops(kinds, flops, nbytes, precision="bfloat16"):
    n = len(kinds)
    p = ["float32", "tf32", "bfloat16", "float16", "float8"].index(precision)
    return dict(kind=np.array([KINDS.index(k) for k in kinds]), precision=np.full(n, p), flops=np.array(flops, float),
                nbytes=np.array(nbytes, float), aligned=np.ones(n, bool))


def test_gemm_efficiency_rises_with_size_and_stays_below_the_published_ceiling():
    for gpu in (H100, A100):
        sizes = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
        eff = [gemm_efficiency(s, s, s, gpu, H100_CALIBRATION) for s in sizes]
        ceiling = published(gpu).matmul * H100_CALIBRATION.sustained
        assert all(a < b for a, b in zip(eff, eff[1:]))                  # monotone in size
        assert all(0 < e <= ceiling for e in eff) and eff[-1] > 0.97 * ceiling   # bounded, and it saturates
        assert eff[0] < 0.05 * ceiling                                    # a tiny GEMM is all latency


def test_a_thin_gemm_is_priced_by_its_bytes():
    """m = 1 (a matrix-vector product): 2 k n FLOPs against 2 k n bytes, memory-bound on any GPU."""
    k = n = 8192
    flops, nbytes = 2.0 * k * n, 2.0 * (k + k * n + n)
    t = phase_seconds(**_ops(["matmul"], [flops], [nbytes]), gpu=H100, calibration=Calibration(), backward=False)
    assert t == pytest.approx(T_GEMM + nbytes / (H100.memory_bandwidth * M_GEMM), rel=1e-9)


def test_the_fixed_gemm_constants_reproduce_published_rows():
    """Rows of the XLA H100 table the constants were fitted to (openxla/xla matmul_interpolator_data.h, key sm_90,
    bf16): the model within 15 % of each (their fit: 92 % of the 375 rows within 15 %)."""
    rows = [(1, 4096, 4096, 4096, 783.3e12), (1, 2048, 2048, 2048, 632.0e12), (1, 1024, 1024, 1024, 236.3e12),
            (2, 4096, 4096, 4096, 807.7e12), (1, 2048, 4096, 1024, 594.2e12), (4, 1024, 1024, 1024, 489.8e12)]
    for b, m, n, k, measured in rows:
        model = gemm_efficiency(b * m, n, k, H100, Calibration()) * H100.peak("bfloat16")
        assert model == pytest.approx(measured, rel=0.15), (b, m, n, k)


def test_launches_dominate_a_tiny_phase_and_hide_behind_a_large_one():
    cal = Calibration(launch=(20e-6, 20e-6), kernel_floor=2e-6)
    tiny = phase_seconds(**_ops(["memory"] * 50, [0] * 50, [1e4] * 50), gpu=H100, calibration=cal, backward=False)
    assert tiny == pytest.approx(50 * 20e-6, rel=0.01)                   # launch-bound: 50 launches
    big_flops = 2.0 * 8192 ** 3
    ops = _ops(["matmul"] * 10 + ["memory"] * 10, [big_flops] * 10 + [0] * 10, [4e8] * 10 + [1e4] * 10)
    with_launch = phase_seconds(**ops, gpu=H100, calibration=cal, backward=False)
    without = phase_seconds(**ops, gpu=H100, calibration=Calibration(kernel_floor=2e-6), backward=False)
    launches = 20 * 20e-6
    assert with_launch - without < 0.05 * launches                       # hidden: not added
    assert with_launch < without + launches                               # never the sum


def test_causal_attention_time_grows_with_the_square_of_the_sequence_and_halves():
    def attention(seq, causal):
        q = torch.zeros(1, 32, seq, 128, dtype=torch.bfloat16)
        counter = WorkCounter()
        with counter:
            F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        return estimate(counter.take(), H100, KERNELS_ONLY)

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t8, t16, full16 = attention(8192, True), attention(16384, True), attention(16384, False)
    assert t16 / t8 == pytest.approx(4.0, rel=0.02)
    assert full16 / t16 == pytest.approx(2.0, rel=0.02)
    work_at_peak = 4 * 32 * 16384 ** 2 * 128 / 2 / H100.peak("bfloat16")
    assert t16 == pytest.approx(work_at_peak / (PUBLISHED["h100-sxm"].attention * H100_CALIBRATION.sustained),
                                rel=0.02)


def test_gpus_differ_by_their_peaks_and_bandwidths():
    flops = 2.0 * 8192 ** 3
    gemm = _ops(["matmul"], [flops], [3 * 2 * 8192 ** 2])
    t = {g.name: phase_seconds(**gemm, gpu=g, calibration=KERNELS_ONLY, backward=False) for g in (H100, A100)}
    rate = {g.name: g.peak("bfloat16") * published(g).matmul for g in (H100, A100)}
    assert t["a100-40gb"] / t["h100-sxm"] == pytest.approx(rate["h100-sxm"] / rate["a100-40gb"], rel=0.01)
    copy = _ops(["memory"], [0], [4e9])
    m = {g.name: phase_seconds(**copy, gpu=g, calibration=KERNELS_ONLY, backward=False) for g in (H100, H200)}
    assert m["h100-sxm"] / m["h200"] == pytest.approx(4.0775 / 2.935, rel=0.01)   # STREAM: 4.08 against 2.94 TB/s


def test_the_bare_roofline_is_the_datasheet():
    flops, nbytes = 2.0 * 4096 ** 3, 1e6
    t = phase_seconds(**_ops(["matmul"], [flops], [nbytes]), gpu=H100, calibration=UNCALIBRATED, backward=False)
    assert t == flops / H100.peak("bfloat16")


def test_the_fitted_calibration_is_physical():
    c = H100_CALIBRATION
    assert 0.3 <= c.sustained <= 1.0 and 0 < c.misaligned <= 1.0
    assert all(0 < v <= 1 for v in c.compute.values())
    assert 0 < c.launch[0] < 1e-3 and 0 < c.launch[1] < 1e-3 and c.kernel_floor < 20e-6
    for name, figures in PUBLISHED.items():
        assert 0 < figures.attention_backward <= figures.attention < figures.matmul < 1, name
        assert 0.7 < figures.memory < 0.95, name


def _simulated_queue(work, host, cal, backward):
    """The launch queue simulated event by event (no closed form): the CPU issues, the GPU runs in order."""
    cpu, gpu_free = cal.overhead, 0.0
    launch = cal.launch[1 if backward else 0]
    for w, h in zip(work, host):
        cpu += launch * (cal.host if h else 1.0)
        if not h:
            gpu_free = max(gpu_free, cpu) + w
    return max(gpu_free, cpu)


def test_the_launch_queue_matches_an_event_by_event_simulation():
    from workbench.profiles.kernel_time import kernel_seconds, phases_seconds

    rng = np.random.default_rng(0)
    cal = dataclasses.replace(H100_CALIBRATION, host=0.3)
    phases = []
    for _ in range(40):
        n = int(rng.integers(1, 30))
        kinds = rng.choice(["memory", "matmul", "attention", "host"], size=n, p=[0.5, 0.2, 0.05, 0.25])
        flops = np.where(np.isin(kinds, ["matmul", "attention"]), 10 ** rng.uniform(6, 12, n), 0.0)
        nbytes = np.where(kinds == "host", 0.0, 10 ** rng.uniform(3, 9, n))
        phases.append((_ops(list(kinds), flops, nbytes), bool(rng.integers(2))))
    one_by_one = [phase_seconds(**ops, gpu=H100, calibration=cal, backward=b) for ops, b in phases]
    simulated = []
    for ops, b in phases:
        work = kernel_seconds(ops["kind"], ops["precision"], ops["flops"], ops["nbytes"], ops["aligned"], H100,
                              cal, b)
        simulated.append(_simulated_queue(work, ops["kind"] == KINDS.index("host"), cal, b))
    assert one_by_one == pytest.approx(simulated, rel=1e-12)
    cat = {k: np.concatenate([ops[k] for ops, _ in phases]) for k in phases[0][0]}
    back = np.concatenate([np.full(len(ops["kind"]), b) for ops, b in phases])
    starts = np.cumsum([0] + [len(ops["kind"]) for ops, _ in phases[:-1]])
    together = phases_seconds(cat["kind"], cat["precision"], cat["flops"], cat["nbytes"], cat["aligned"], back,
                              starts, H100, cal)
    assert together.tolist() == pytest.approx(one_by_one, rel=1e-12)


def test_fused_attention_runs_at_cudnns_published_rate_on_hopper_and_fa2s_elsewhere():
    """attention_fused (a --kernels fused profile): cuDNN's 518 / 499 TFLOPS on the H100 (FlashAttention-3 paper,
    Figures 5 and 6), the same on the H200 (same die); the A100 keeps FlashAttention-2's rate."""
    flops = [1e13]
    for gpu, forward, backward in ((H100, 518 / 989, 499 / 989), (H200, 518 / 989, 499 / 989),
                                   (A100, published(A100).attention, published(A100).attention_backward)):
        for back, fraction in ((False, forward), (True, backward)):
            fused = phase_seconds(**_ops(["attention_fused"], flops, [1e6]), gpu=gpu, calibration=KERNELS_ONLY,
                                  backward=back)
            expected = T_GEMM + 1e13 / (gpu.peak("bfloat16") * fraction * KERNELS_ONLY.sustained)
            assert fused == pytest.approx(expected, rel=1e-9)
    eager = phase_seconds(**_ops(["attention"], flops, [1e6]), gpu=H100, calibration=KERNELS_ONLY, backward=False)
    fused = phase_seconds(**_ops(["attention_fused"], flops, [1e6]), gpu=H100, calibration=KERNELS_ONLY,
                          backward=False)
    assert eager / fused == pytest.approx((518 / 989) / 0.35, rel=0.01)
    assert KINDS.index("host") == 4 and KINDS[-1] == "attention_fused"      # the codes stored in profiles stay
