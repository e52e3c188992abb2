"""The accelerators people rent, as data: peak dense FLOP/s per precision, memory, links (docs/model.md, "Instance").

Every number is the vendor's public datasheet figure, its source in the comment beside it. Conventions:

* ``flops``: *dense* peak FLOP/s (datasheets print the 2:4-sparse figure for tensor cores, twice the
  dense one; the dense one is kept), per precision: ``float32`` (FP32 on the vector units: what a
  float32 matmul runs at under torch's default ``torch.backends.cuda.matmul.allow_tf32 = False``),
  ``tf32`` (tensor cores: what a float32 convolution runs at under torch's default
  ``torch.backends.cudnn.allow_tf32 = True``), ``bfloat16``, ``float16`` and ``float8`` (tensor cores);
* ``memory``: the datasheet's capacity read as 10^9 bytes per GB. The runtime reports a little more
  (an H100 SXM 80GB: 85.0e9 bytes, ``data/runs/gpu-h100/env.json``), part of which the CUDA context and
  the allocator's fragmentation take, so a plan that fits this figure has that room left;
* ``memory_bandwidth``: bytes/s of device memory;
* ``link_bandwidth``: bytes/s *one way* between two devices of one node (a pipeline sends each
  boundary's activations one way and its gradients the other): half the bidirectional figure
  datasheets print. Through NVSwitch every pair gets the GPU's whole NVLink bandwidth; PCIe cards
  without NVLink talk over PCIe; MI300X's eight OAMs are fully connected, one Infinity Fabric link
  per pair.

Between nodes: :data:`DEFAULT_NODE_BANDWIDTH`, one 400 Gb/s InfiniBand NDR port per GPU (as in a
DGX H100: eight ConnectX-7 ports for eight GPUs), 50 GB/s one way.

>>> a = accelerator("h100-sxm")
>>> a.memory / 1e9, a.flops["bfloat16"] / 1e12, a.link_bandwidth / 1e9
(80.0, 989.5, 450.0)
>>> accelerator("h100")  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: unknown GPU 'h100'; known: a100-40gb, a100-80gb, b200, h100-96gb-500w, h100-pcie, h100-sxm, h200, ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["Accelerator", "ACCELERATORS", "accelerator", "DEFAULT_NODE_BANDWIDTH", "PRECISIONS"]

#: the precisions of ``Accelerator.flops``
PRECISIONS = ("float32", "tf32", "bfloat16", "float16", "float8")

#: one 400 Gb/s InfiniBand NDR port per GPU (NVIDIA DGX H100 user guide: 8 x ConnectX-7, 400 Gb/s each,
#: https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html): 400e9 / 8 bytes/s one way
DEFAULT_NODE_BANDWIDTH = 50e9

T = 1e12
G = 1e9


@dataclass(frozen=True)
class Accelerator:
    """One GPU model: see the module docstring for what each number means."""

    name: str
    label: str
    memory: float
    memory_bandwidth: float
    link_bandwidth: float
    link: str
    flops: Mapping[str, float] = field(default_factory=dict)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s in ``precision`` (float16 falls back to bfloat16's, tf32 to float32's).

        >>> accelerator("a100-80gb").peak("float16") / 1e12
        312.0
        """
        for p in (precision, {"float16": "bfloat16", "tf32": "float32", "float8": "bfloat16"}.get(precision)):
            if p is not None and self.flops.get(p):
                return float(self.flops[p])
        raise ValueError(f"{self.name}: no peak FLOP/s known for {precision!r}")

    def describe(self) -> str:
        """One line: the name, the label, memory, bandwidths and the bf16 peak.

        >>> accelerator("l40s").describe()  # doctest: +NORMALIZE_WHITESPACE
        'l40s: NVIDIA L40S (PCIe): 48 GB, 864 GB/s, bf16 362 TFLOP/s dense, fp32 91.6;
         link 32 GB/s one way (PCIe Gen4 x16)'
        """
        return (f"{self.name}: {self.label}: {self.memory / G:.0f} GB, {self.memory_bandwidth / G:.0f} GB/s, "
                f"bf16 {self.flops['bfloat16'] / T:.0f} TFLOP/s dense, fp32 {self.flops['float32'] / T:.3g}; "
                f"link {self.link_bandwidth / G:.0f} GB/s one way ({self.link})")


def _a100(gb: int, bandwidth: float) -> Accelerator:
    # NVIDIA A100 Tensor Core GPU datasheet (SXM column), https://www.nvidia.com/content/dam/en-zz/Solutions/
    # Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf: FP32 19.5 TFLOPS, TF32 156
    # (312 sparse), BF16/FP16 312 (624 sparse); 40GB HBM2 1,555 GB/s, 80GB HBM2e 2,039 GB/s; NVLink 600 GB/s
    # (bidirectional, through NVSwitch in HGX A100)
    return Accelerator(f"a100-{gb}gb", f"NVIDIA A100 SXM4 {gb}GB", gb * G, bandwidth, 300 * G, "NVLink 3, NVSwitch",
                       {"float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T})


# NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
# (H100 SXM): FP32 67 TFLOPS (66.9: 132 SMs x 128 FP32 lanes x 2 x 1.98 GHz), TF32 989 (sparse), BF16/FP16 1,979
# (sparse), FP8 3,958 (sparse); 80GB HBM3, 3.35 TB/s; NVLink 900 GB/s (bidirectional)
_H100_SXM_FLOPS = {"float32": 66.9 * T, "tf32": 494.5 * T, "bfloat16": 989.5 * T, "float16": 989.5 * T,
                   "float8": 1979 * T}

#: the clock of an H100 SXM held to 500 W instead of its datasheet's 700 W: (500/700)^(1/3) (h100-96gb-500w below)
_POWER_CAPPED_CLOCK = (500 / 700) ** (1 / 3)

ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    _a100(40, 1555 * G),
    _a100(80, 2039 * G),
    Accelerator("h100-sxm", "NVIDIA H100 SXM5 80GB", 80 * G, 3350 * G, 450 * G, "NVLink 4, NVSwitch",
                _H100_SXM_FLOPS),
    # the H100s of Meta's Grand Teton hosts that torchtitan benchmarks on (pytorch/torchtitan,
    # benchmarks/llama3_h100_202412_torchtitan.md, "Hardware": 8 H100s per host fully connected with NVLink, 96GB
    # HBM2e at 2.4 TB/s, "the default 500W power limit"): the H100 SXM's links, its peaks at the clock of a 500 W
    # limit. Dynamic power grows with the clock times the voltage squared, the voltage with the clock, so P ~ f^3
    # and f(500 W) / f(700 W) = (500/700)^(1/3) = 0.894 (a physical estimate, not a fit; torchtitan: "the actual
    # peak TFLOPs number is between SXM and NVL, and we don't know its exact value")
    Accelerator("h100-96gb-500w", "NVIDIA H100 SXM 96GB HBM2e, 500 W limit", 96 * G, 2400 * G, 450 * G,
                "NVLink 4, NVSwitch", {k: v * _POWER_CAPPED_CLOCK for k, v in _H100_SXM_FLOPS.items()}),
    # same datasheet, H100 PCIe column (the 2022 edition): FP32 51 TFLOPS, TF32 756 (sparse), BF16/FP16 1,513
    # (sparse), FP8 3,026 (sparse); 80GB HBM2e, 2 TB/s; PCIe Gen5 128 GB/s (bidirectional; the NVLink bridge
    # joins pairs of cards only, so a pipeline of more than two talks over PCIe)
    Accelerator("h100-pcie", "NVIDIA H100 PCIe 80GB", 80 * G, 2000 * G, 64 * G, "PCIe Gen5 x16",
                {"float32": 51 * T, "tf32": 378 * T, "bfloat16": 756.5 * T, "float16": 756.5 * T,
                 "float8": 1513 * T}),
    # NVIDIA H200 Tensor Core GPU, https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM): the H100 SXM's
    # FLOP/s (FP32 67, TF32 989 sparse, BF16 1,979 sparse, FP8 3,958 sparse); 141GB HBM3e, 4.8 TB/s; NVLink 900 GB/s
    Accelerator("h200", "NVIDIA H200 SXM 141GB", 141 * G, 4800 * G, 450 * G, "NVLink 4, NVSwitch",
                _H100_SXM_FLOPS),
    # NVIDIA HGX B200 (8 GPUs), https://www.nvidia.com/en-us/data-center/hgx/: FP32 600 TFLOPS, TF32 18 PFLOPS
    # (sparse), BF16/FP16 36 PFLOPS (sparse), FP8 72 PFLOPS (sparse), 1.4 TB HBM3e, NVLink 5 1.8 TB/s per GPU
    # (bidirectional); DGX B200, https://www.nvidia.com/en-us/data-center/dgx-b200/: 1,440 GB, 64 TB/s in all
    # (per GPU: 180 GB, 8 TB/s)
    Accelerator("b200", "NVIDIA B200 (HGX) 180GB", 180 * G, 8000 * G, 900 * G, "NVLink 5, NVSwitch",
                {"float32": 75 * T, "tf32": 1125 * T, "bfloat16": 2250 * T, "float16": 2250 * T,
                 "float8": 4500 * T}),
    # NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/: FP32 91.6 TFLOPS, TF32 183 (366
    # sparse), BF16/FP16 362.05 (733 sparse), FP8 733 (1,466 sparse); 48GB GDDR6, 864 GB/s; PCIe Gen4 x16
    # 64 GB/s bidirectional, no NVLink
    Accelerator("l40s", "NVIDIA L40S (PCIe)", 48 * G, 864 * G, 32 * G, "PCIe Gen4 x16",
                {"float32": 91.6 * T, "tf32": 183 * T, "bfloat16": 362.05 * T, "float16": 362.05 * T,
                 "float8": 733 * T}),
    # AMD Instinct MI300X data sheet, https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html:
    # FP32 (vector and matrix) 163.4 TFLOPS, TF32 653.7, BF16/FP16 1,307.4, FP8 2,614.9 (dense; sparsity doubles
    # them); 192GB HBM3, 5.3 TB/s; 7 Infinity Fabric links of 128 GB/s (bidirectional), one per peer in an
    # 8-GPU platform
    Accelerator("mi300x", "AMD Instinct MI300X (OAM) 192GB", 192 * G, 5300 * G, 64 * G,
                "Infinity Fabric, 1 link per pair",
                {"float32": 163.4 * T, "tf32": 653.7 * T, "bfloat16": 1307.4 * T, "float16": 1307.4 * T,
                 "float8": 2614.9 * T}),
)}


def accelerator(name: str) -> Accelerator:
    """The accelerator called ``name`` (case-insensitive); a ``ValueError`` listing the known names otherwise."""
    key = str(name).strip().lower()
    if key not in ACCELERATORS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(ACCELERATORS))}")
    return ACCELERATORS[key]
