"""Seconds of a layer's kernels on a named GPU, from each operation's work: the time model of fake profiles.

:class:`~workbench.profiles.roofline.WorkCounter` records, for every operation a layer's forward or backward
dispatches, its kind, precision, FLOPs, bytes and (for matmuls) whether its dimensions are aligned. Here each
kernel is priced on an :class:`~workbench.model.accelerators.Accelerator`:

* a **matmul** (cuBLAS) runs at ``t = T_GEMM + max(F / (peak[p] * a * s), B / (bandwidth * M_GEMM))``: a fixed
  latency, then the larger of its tensor-core time at ``a``, the largest fraction of the peak cuBLAS reaches on
  that GPU (:data:`PUBLISHED`: the Maximum Achievable Matmul FLOPS), times ``s`` (``Calibration.sustained``:
  what a training run sustains of it), and its memory time. Its efficiency ``F / (peak * t)`` so rises with
  the GEMM's size and arithmetic intensity and saturates at ``a * s`` (:func:`gemm_efficiency`). A 16-bit
  matmul with a dimension that is not a multiple of 8 runs ``Calibration.misaligned`` as fast (cuBLAS leaves
  its aligned tensor-core kernels); a float32 matmul runs on the CUDA cores (torch's default, no TF32) at a
  fitted fraction of the FP32 peak;
* a **convolution** (cuDNN) the same way, at a fitted fraction of the TF32 (float32 input) or bf16 peak;
* **attention** (``scaled_dot_product_attention``: torch's flash kernel, FlashAttention-2, on A100 and H100)
  at its own published fraction of the peak, forward and backward (:data:`PUBLISHED`), times ``s``; FLOPs as
  :mod:`~workbench.profiles.roofline` counts them (causal: half; growing with the square of the sequence);
* a **memory-bound** kernel (elementwise, reductions, copies) at ``t = t_min + B / (bandwidth * m)``, ``m``
  the fraction of the datasheet bandwidth STREAM-like kernels measure on that GPU (:data:`PUBLISHED`);
* a dispatch that launches no kernel (a view, an allocation) costs the CPU only.

A phase (one layer's forward or backward, timed as the profiler times it: CUDA events around it) is a
queue: the CPU issues the operations in order, ``overhead`` first, then ``launch`` seconds per kernel and
``host * launch`` per dispatch without kernel; the GPU starts each kernel when it has been issued and the
previous one has finished. The phase ends when the last kernel does::

    issue_i = overhead + launch * (operations issued up to i),   end_i = max(issue_i, end_(i-1)) + t_i

so a launch hides behind the kernels already queued: a run of tiny kernels costs its launches, a long kernel
its own time, never the sum of both (:func:`phase_seconds`, in closed form ``max_i(issue_i + sum_(j>=i) t_j)``).

The published figures are in :data:`PUBLISHED` with their sources; the rest is a :class:`Calibration`
fitted by ``benchmarks/roofline.py --fit`` (:data:`H100_CALIBRATION`, with its cases and leave-one-out
there). :data:`UNCALIBRATED` is the bare roofline: datasheet peaks and bandwidth, no latency, no launch.

>>> from workbench.model.accelerators import accelerator
>>> h100 = accelerator("h100-sxm")
>>> big, small = gemm_efficiency(2048, 4096, 4096, h100), gemm_efficiency(256, 256, 256, h100)
>>> round(big, 2), round(small, 3), big <= PUBLISHED["h100-sxm"].matmul
(0.75, 0.006, True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from workbench.model.accelerators import Accelerator

__all__ = ["KINDS", "PRECISIONS", "Published", "PUBLISHED", "published", "Calibration", "UNCALIBRATED",
           "H100_CALIBRATION", "T_GEMM", "M_GEMM", "memory_fraction", "kernel_seconds", "phase_seconds",
           "phases_seconds", "gemm_seconds", "gemm_efficiency"]

#: the kinds of operation priced apart (index = the code in ``OpWork.kind``); ``host``: no kernel;
#: ``attention_fused``: attention in a profile of fused kernels (workbench.profiles.fused), at the fused rate
KINDS = ("memory", "matmul", "conv", "attention", "host", "attention_fused")
#: the precisions (index = the code in ``OpWork.precision``)
PRECISIONS = ("float32", "tf32", "bfloat16", "float16", "float8")

#: fixed latency of one cuBLAS GEMM kernel (seconds) and the fraction of the memory bandwidth its operands and
#: result move at: fitted here (least squares in log time, compute ceiling fixed at the H100's MAMF below) to
#: the 375 bf16 rows under key "sm_90" (H100 SXM) of openxla/xla, xla/service/gpu/model/
#: matmul_interpolator_data.h (XLA's measured GEMM throughputs for b x m x n x k from 1x256^3 to 4x4096^3):
#: 5.74 us and 0.893; rms error 9.2 % in time, 92 % of the rows within 15 %, the 15 largest within 0.1 % on
#: average. Measured on an H100 only: other GPUs take the same latency.
T_GEMM, M_GEMM = 5.74e-6, 0.893


@dataclass(frozen=True)
class Published:
    """What published benchmarks say a GPU reaches: ``matmul``, the Maximum Achievable Matmul FLOPS of bf16
    over the dense bf16 peak; ``attention``, FlashAttention-2's forward over the same peak;
    ``attention_backward``, its backward; ``memory``, the bandwidth STREAM-like kernels (copy, scale, add,
    triad) measure over the datasheet's; ``source``; ``attention_fused`` and ``attention_fused_backward``: the
    fused attention kernel of a ``kernels="fused"`` profile (None: FlashAttention-2's, ``attention``)."""

    matmul: float
    attention: float
    attention_backward: float
    memory: float
    source: str
    attention_fused: float | None = None
    attention_fused_backward: float | None = None

    @property
    def fused(self) -> tuple[float, float]:
        """(forward, backward) fraction of the peak of the fused attention kernel."""
        return (self.attention if self.attention_fused is None else self.attention_fused,
                self.attention_backward if self.attention_fused_backward is None else self.attention_fused_backward)


#: FlashAttention-2 (Dao, arXiv:2307.08691, section 4.1, on an A100): forward up to 73 % of the peak, backward up
#: to 63 %; the backward's ratio to the forward (63/73) is used where only the forward is published
_FA2_BACKWARD = 63 / 73
#: MAMF: stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
#: table", BF16 rows (mean of 100 matmuls after 50 warm-up, best shape): A100 SXM 271.2 of 312 TFLOPS (86.9 %),
#: H100 SXM 794.5 of 989 (80.3 %), AMD MI300X 668.4 of 1300 (51.4 %).
#: Memory: Azure/AI-benchmarking-guide, Azure_Results/ND_<GPU>_results.md, "HBM Bandwidth" (Copy, Mul, Add,
#: Triad; their mean over the datasheet): ND A100 v4 (A100-SXM4-80GB) 1.61, 1.61, 1.70, 1.70 TB/s of 2.039;
#: ND H100 v5 (H100 80GB HBM3) 2.90, 2.90, 2.97, 2.97 of 3.35; ND H200 v5 4.01, 4.00, 4.15, 4.15 of 4.8.
_A100 = Published(271.2 / 312, 0.73, 0.63, 1.655 / 2.039,
                  "MAMF A100 SXM 271.2/312 (stas00/ml-engineering compute/accelerator/README.md); FlashAttention-2 "
                  "on A100: forward 73 %, backward 63 % (arXiv:2307.08691, sec. 4.1); HBM 1.655 of 2.039 TB/s "
                  "(Azure/AI-benchmarking-guide ND_A100_v4_results.md)")
# H100 attention: "FlashAttention-2 achieving only 35% utilization of theoretical max FLOPs on the H100 GPU"
# (pytorch.org blog "FlashAttention-3", 2024-07-11: pytorch/pytorch.github.io, _posts/2024-07-11-flashattention-3.md;
# Azure's ND_H100_v5_results.md measures FlashAttention 2.0 at 327.9 TFLOPS, 33 %, head dimension 128, batch 2,
# sequence 8192)
# H100 fused attention (Transformer Engine's cuDNN fused attention, what NeMo/Megatron-Core run on Hopper):
# FlashAttention-3 (Shah et al., arXiv:2407.08608), section 4.1, Figure 5(e) "Attention forward speed, with causal
# mask, head dim 128 (H100 80GB SXM5)", cuDNN bar at sequence length 4k: 518 TFLOPS (484 at 2k, 529 at 8k);
# Figure 6 "Attention backward speed, head dim 128", cuDNN at 4k: 499 TFLOPS (465 at 2k, 518 at 8k). At 4k, the
# sequence of the NeMo rows; over the bf16 dense peak of 989 TFLOPS. The same figures put FlashAttention-2 at 319
# (forward, causal) and 310 (backward) TFLOPS, the 35 % and 30 % used for eager attention above.
_CUDNN_H100 = (518 / 989, 499 / 989)
_H100 = Published(794.5 / 989, 0.35, 0.35 * _FA2_BACKWARD, 2.935 / 3.35,
                  "MAMF H100 SXM 794.5/989 (stas00/ml-engineering compute/accelerator/README.md); FlashAttention-2 "
                  "on H100: 35 % (pytorch.org FlashAttention-3 blog, 2024-07-11), backward x 63/73 (FA2 paper); "
                  "HBM 2.935 of 3.35 TB/s (Azure/AI-benchmarking-guide ND_H100_v5_results.md); fused attention: "
                  "cuDNN 518 (forward, causal) and 499 (backward) TFLOPS, head dim 128, sequence 4k "
                  "(FlashAttention-3 paper, arXiv:2407.08608, Figures 5 and 6)", *_CUDNN_H100)
PUBLISHED: dict[str, Published] = {
    "a100-40gb": _A100, "a100-80gb": _A100, "h100-sxm": _H100,
    # the same GH100 die as the H100 SXM, at 700 W (H200) or 350 W (H100 PCIe): no MAMF of their own
    "h200": Published(_H100.matmul, _H100.attention, _H100.attention_backward, 4.0775 / 4.8,
                      "the H100 SXM's compute figures (same die); HBM 4.08 of 4.8 TB/s (Azure/AI-benchmarking-guide "
                      "ND_H200_v5_results.md)", *_CUDNN_H100),
    "h100-pcie": dataclasses.replace(_H100, source="those of the H100 SXM (same die)"),
    "mi300x": dataclasses.replace(_H100, matmul=668.4 / 1300,
                                  source="MAMF MI300X 668.4/1300 (stas00/ml-engineering); the rest: the H100's "
                                         "(none published here)"),
}


def published(gpu: Accelerator) -> Published:
    """The published figures of ``gpu``; a GPU without any (b200, l40s) takes the H100 SXM's, and says so.

    >>> from workbench.model.accelerators import accelerator
    >>> published(accelerator("a100-80gb")).matmul > published(accelerator("h100-sxm")).matmul
    True
    >>> published(accelerator("b200")).source
    'none published: those of the H100 SXM'
    """
    if gpu.name in PUBLISHED:
        return PUBLISHED[gpu.name]
    return dataclasses.replace(_H100, source="none published: those of the H100 SXM")


@dataclass(frozen=True)
class Calibration:
    """The fitted part of the model (module docstring): ``sustained``, the fraction of the published tensor-core
    figures a training run sustains; ``compute[kind/precision]``, the fraction of the peak for kinds with no
    published figure (float32 matmuls, convolutions, float32 attention); ``misaligned``, the speed of a 16-bit
    matmul with a dimension not a multiple of 8; ``kernel_floor``, the least seconds a memory-bound kernel
    takes; ``launch`` (forward, backward) CPU seconds
    per kernel, ``host`` the cost of a dispatch without kernel relative to it, ``overhead`` CPU seconds before
    a phase's first operation; ``kernels``: False for the bare roofline (no published figures, no latency)."""

    sustained: float = 1.0
    compute: Mapping[str, float] = field(default_factory=dict)
    misaligned: float = 1.0
    kernel_floor: float = 0.0
    launch: tuple[float, float] = (0.0, 0.0)
    host: float = 0.0
    overhead: float = 0.0
    kernels: bool = True
    source: str = "none: datasheet peaks, no latency, no launch cost"

    def efficiency(self, kind: str, precision: str) -> float:
        """The fitted fraction of the peak for ``kind``/``precision`` (falls back to ``kind``, then 1).

        >>> Calibration(compute={"conv": 0.3}).efficiency("conv", "tf32")
        0.3
        """
        return float(self.compute.get(f"{kind}/{precision}", self.compute.get(kind, 1.0)))


UNCALIBRATED = Calibration(kernels=False)
#: fitted by ``benchmarks/roofline.py --fit`` on the ten H100 profiles of data/profiles/h100/ and torchtitan's
#: Llama-3.1-8B FSDP row on 8 H100s (benchmarks/roofline.py prints each case and the leave-one-out)
H100_CALIBRATION = Calibration(
    sustained=0.773, compute={"matmul/float32": 0.834, "conv/tf32": 0.384, "conv/bfloat16": 0.457,
                              "attention/float32": 0.226},
    misaligned=0.241, kernel_floor=5.7e-6, launch=(30.0e-6, 48.6e-6), host=0.0, overhead=354e-6,
    source="fitted on the H100 profiles of data/profiles/h100/ and torchtitan's Llama-3.1-8B FSDP row on 8 H100s "
           "(benchmarks/roofline.py)")


def memory_fraction(gpu: Accelerator, calibration: Calibration) -> float:
    """The fraction of ``gpu``'s datasheet bandwidth memory-bound kernels reach (1 for the bare roofline).

    >>> from workbench.model.accelerators import accelerator
    >>> round(memory_fraction(accelerator("h100-sxm"), H100_CALIBRATION), 3)
    0.876
    """
    return published(gpu).memory if calibration.kernels else 1.0


def gemm_seconds(flops: np.ndarray, nbytes: np.ndarray, peak: np.ndarray, gpu: Accelerator,
                 fraction: np.ndarray, calibration: Calibration) -> np.ndarray:
    """Seconds of GEMM-like kernels (matmuls, convolutions, attention) running at ``fraction`` of ``peak``."""
    if not calibration.kernels:
        return np.maximum(flops / peak, nbytes / gpu.memory_bandwidth)
    return T_GEMM + np.maximum(flops / (peak * fraction), nbytes / (gpu.memory_bandwidth * M_GEMM))


def gemm_efficiency(m: int, n: int, k: int, gpu: Accelerator, calibration: Calibration = Calibration(),
                    precision: str = "bfloat16") -> float:
    """The fraction of ``gpu``'s peak an m x k by k x n ``precision`` GEMM reaches (its FLOPs over peak x time).

    >>> from workbench.model.accelerators import accelerator
    >>> a100 = accelerator("a100-40gb")
    >>> [round(gemm_efficiency(s, s, s, a100), 2) for s in (512, 2048, 8192)]
    [0.11, 0.8, 0.87]
    """
    flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n) * (4 if precision == "float32" else 2)
    peak = gpu.peak(precision)
    fraction = (calibration.efficiency("matmul", precision) if precision == "float32" else
                published(gpu).matmul * calibration.sustained)
    t = gemm_seconds(np.array([flops]), np.array([nbytes]), np.array([peak]), gpu, np.array([fraction]), calibration)
    return float(flops / (peak * t[0]))


def _fractions(kind: np.ndarray, precision: np.ndarray, aligned: np.ndarray, gpu: Accelerator,
               calibration: Calibration, backward: np.ndarray | bool) -> np.ndarray:
    """Per kernel, the fraction of its precision's peak it reaches (module docstring); ``backward`` per kernel
    or for all."""
    if not calibration.kernels:
        return np.ones(len(kind))
    pub, cal = published(gpu), calibration
    back = np.broadcast_to(np.asarray(backward, dtype=bool), kind.shape)
    tensor = precision >= PRECISIONS.index("bfloat16")
    out = np.ones(len(kind))
    mm, cv, at = kind == KINDS.index("matmul"), kind == KINDS.index("conv"), kind == KINDS.index("attention")
    out[mm & tensor] = pub.matmul * cal.sustained
    out[mm & tensor & ~aligned] *= cal.misaligned
    out[mm & ~tensor] = cal.efficiency("matmul", "float32")
    out[cv & tensor] = cal.efficiency("conv", "bfloat16")
    out[cv & ~tensor] = cal.efficiency("conv", "tf32")
    attention = np.where(back, pub.attention_backward, pub.attention) * cal.sustained
    out[at & tensor] = attention[at & tensor]
    float32 = cal.efficiency("attention", "float32") * np.where(back, _FA2_BACKWARD, 1.0)
    out[at & ~tensor] = float32[at & ~tensor]
    af = kind == KINDS.index("attention_fused")
    if af.any():
        fused = np.where(back, pub.fused[1], pub.fused[0]) * cal.sustained
        out[af & tensor] = fused[af & tensor]
        out[af & ~tensor] = float32[af & ~tensor]
    return out


def kernel_seconds(kind: np.ndarray, precision: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
                   aligned: np.ndarray, gpu: Accelerator, calibration: Calibration,
                   backward: np.ndarray | bool) -> np.ndarray:
    """GPU seconds of each kernel (0 for a dispatch without kernel)."""
    peaks = np.array([gpu.peak(p) for p in PRECISIONS])[precision]
    gemm = gemm_seconds(flops, nbytes, peaks, gpu, _fractions(kind, precision, aligned, gpu, calibration, backward),
                        calibration)
    memory = calibration.kernel_floor + nbytes / (gpu.memory_bandwidth * memory_fraction(gpu, calibration))
    host = kind == KINDS.index("host")
    return np.where(host, 0.0, np.where(kind == KINDS.index("memory"), memory, gemm))


def phases_seconds(kind: np.ndarray, precision: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
                   aligned: np.ndarray, backward: np.ndarray, starts: np.ndarray, gpu: Accelerator,
                   calibration: Calibration) -> np.ndarray:
    """Seconds of many phases at once: their operations one after the other, phase i from ``starts[i]`` to the
    next start (each non-empty), ``backward`` per operation; each phase the launch queue of the module
    docstring, in closed form ``max_i(issue_i + sum_(j>=i) t_j)``."""
    work = kernel_seconds(kind, precision, flops, nbytes, aligned, gpu, calibration, backward)
    host = kind == KINDS.index("host")
    cost = np.where(host, calibration.host, 1.0) * np.where(backward, calibration.launch[1], calibration.launch[0])
    ends = np.append(starts[1:], len(kind)) - 1
    segment = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(kind))))
    cum_cost, cum_work = np.cumsum(cost), np.cumsum(work)
    issued = calibration.overhead + cum_cost - (cum_cost[starts] - cost[starts])[segment]
    remaining = cum_work[ends][segment] - cum_work + work            # the GPU work from each operation on
    start_at = np.where(host, 0.0, issued + remaining)
    return np.maximum(np.maximum.reduceat(start_at, starts), issued[ends])


def phase_seconds(kind: np.ndarray, precision: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
                  aligned: np.ndarray, gpu: Accelerator, calibration: Calibration, backward: bool) -> float:
    """Seconds of one phase, its operations in the order they run: the launch queue of the module docstring.

    >>> from workbench.model.accelerators import accelerator
    >>> cal, h100 = Calibration(launch=(10e-6, 10e-6)), accelerator("h100-sxm")
    >>> tiny = dict(kind=np.zeros(100, int), precision=np.zeros(100, int), flops=np.zeros(100),
    ...             nbytes=np.full(100, 1e3), aligned=np.ones(100, bool))
    >>> round(phase_seconds(**tiny, gpu=h100, calibration=cal, backward=False) * 1e6)   # 100 launches
    1000
    """
    if len(kind) == 0:
        return 0.0
    return float(phases_seconds(kind, precision, flops, nbytes, aligned, np.full(len(kind), backward),
                                np.array([0]), gpu, calibration)[0])
