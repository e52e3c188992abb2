"""Layer times on a named GPU from the work of every operation: a calibrated roofline.

A fake profile (:mod:`workbench.profiles.fake`) cannot time anything: its tensors have shapes and no
values. So :class:`WorkCounter`, a ``TorchDispatchMode``, records for every operation a layer's forward
and backward dispatch (the same ``aten`` operations torch runs for them) its FLOPs
(``torch.utils.flop_counter``'s formulas; torch's ``RuntimeEstimator`` aborts on this CPU build) and the
bytes it reads and writes (its tensor arguments and results, a broadcast dimension counted once; views
and allocations move nothing). :func:`estimate` prices each operation on an
:class:`~workbench.model.accelerators.Accelerator` as a roofline plus a launch cost::

    t = max(FLOPs / (peak[precision] * efficiency[kind/precision]), bytes / (bandwidth * memory_efficiency))
        + overhead                                          (matmuls, convolutions, attention)
    t = bytes / (bandwidth * memory_efficiency) + overhead  (every other kernel)

The precision is torch's default on a GPU for the operation's dtype: a float32 matmul runs in float32
(``allow_tf32`` off for matmuls), a float32 convolution in TF32 (cuDNN's ``allow_tf32`` on); bfloat16
and float16 on tensor cores. Causal attention counts half its FLOPs (flash kernels skip the masked
half). The efficiencies and the overhead are a :class:`Calibration`: :data:`H100_CALIBRATION` is fitted
on the H100 profiles in ``data/profiles/h100/`` (``benchmarks/roofline.py`` fits it and reports the
per-layer and total error, calibrated and not); :data:`UNCALIBRATED` is the bare roofline (datasheet
peaks, no overhead). The launch cost is added to every kernel, as those profiles of small networks want
it; on large models, where launches hide behind long kernels, the estimate is likely high
(docs/model.md, "Fake profiles").

>>> lin = torch.nn.Linear(1024, 1024, bias=False)
>>> work = layer_work(lin, torch.zeros(512, 1024), True, None, torch.ones(512, 1024))
>>> float(work.forward.flops.sum()) / 1e9, float(work.backward.flops.sum()) / 1e9    # 2 m n k, then twice
(1.073741824, 2.147483648)
>>> from workbench.model.accelerators import accelerator
>>> round(estimate(work.forward, accelerator("h100-sxm"), UNCALIBRATED) * 1e6, 2)   # float32: 66.9 TFLOP/s
16.05
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.model.accelerators import Accelerator
from workbench.profiles.local import defer_to_subclass, on_meta
from workbench.profiles.timing import leaf

__all__ = ["OpWork", "LayerWork", "WorkCounter", "Calibration", "UNCALIBRATED", "H100_CALIBRATION", "layer_work",
           "estimate", "total_seconds", "RooflineTimes", "KINDS"]

aten = torch.ops.aten
#: the kinds of operation a roofline prices apart (index = the code in :attr:`OpWork.kind`)
KINDS = ("memory", "matmul", "conv", "attention")
_PRECISIONS = ("float32", "tf32", "bfloat16", "float16", "float8")
_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
              aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention}
_ATTENTION_BACKWARD = {aten._scaled_dot_product_flash_attention_for_cpu_backward,
                       aten._scaled_dot_product_flash_attention_backward,
                       aten._scaled_dot_product_efficient_attention_backward,
                       aten._scaled_dot_product_cudnn_attention_backward}
_MATMUL = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
_CONV = {aten.convolution, aten._convolution, aten.convolution_backward}
#: collectives (tensor parallelism's): priced on their link (workbench.parallel.collectives), not here
_COLLECTIVES = {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d"}
#: operations that launch no kernel: allocations (their first write is the next kernel's)
_NO_KERNEL = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
              aten.detach, aten.lift_fresh, aten._local_scalar_dense}


@dataclass(frozen=True)
class OpWork:
    """The operations of one phase (a layer's forward or its backward), one entry each: ``kind`` (an index
    into :data:`KINDS`), ``precision`` (an index into the accelerator precisions), ``flops`` and ``bytes``."""

    kind: np.ndarray
    precision: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)


@dataclass(frozen=True)
class LayerWork:
    """A layer's forward and backward work."""

    forward: OpWork
    backward: OpWork


def _distinct_bytes(t: torch.Tensor) -> float:
    """Bytes a kernel touches in ``t``: every dimension but the broadcast ones (stride 0)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return float(n * t.element_size())


def _precision(kind: str, dtype: torch.dtype) -> str:
    """Torch's default GPU precision for an operation of ``kind`` on ``dtype`` (module docstring)."""
    if dtype == torch.float32:
        return "tf32" if kind == "conv" else "float32"
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float8" if dtype.itemsize == 1
                                                                      else "float32")


def _attention_flops(func: Any, args: tuple, kwargs: dict) -> float:
    """FLOPs of scaled dot-product attention (forward: QK^T and PV; backward: 2.5 times that, as
    ``torch.utils.flop_counter`` counts it), halved when causal."""
    backward = func in _ATTENTION_BACKWARD
    q, k, v = args[1:4] if backward else args[0:3]
    b, h, s_q, d = q.shape
    s_k, d_v = k.shape[-2], v.shape[-1]
    flops = 2.0 * b * h * s_q * s_k * (d + d_v) * (2.5 if backward else 1.0)
    causal = kwargs.get("is_causal", args[7] if backward and len(args) > 7 else
                        (args[4] if not backward and len(args) > 4 else False))
    return flops / 2 if causal is True else flops


class WorkCounter(TorchDispatchMode):
    """Records every operation dispatched inside it (see the module docstring); :meth:`take` returns
    what was recorded since the last call, as an :class:`OpWork`."""

    def __init__(self) -> None:
        super().__init__()
        self._rows: list[tuple[int, int, float, float]] = []

    def take(self) -> OpWork:
        rows, self._rows = self._rows, []
        a = np.array(rows, dtype=float).reshape(-1, 4)
        return OpWork(a[:, 0].astype(int), a[:, 1].astype(int), a[:, 2], a[:, 3])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if defer_to_subclass(types):      # a DTensor: the operations it runs on its local shards are counted
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if packet in _NO_KERNEL or getattr(func, "is_view", False) or func.namespace in _COLLECTIVES:
            return out
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(on_meta(t) for t in outs):  # a DTensor's shape probe: no kernel
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not outs:
            return out
        kind, flops = self._flops(func, packet, args, kwargs, out)
        dtype = next((t.dtype for t in ins if t.is_floating_point()), outs[0].dtype)
        moved = sum(_distinct_bytes(t) for t in ins + outs)
        self._rows.append((KINDS.index(kind), _PRECISIONS.index(_precision(kind, dtype)), flops, moved))
        return out

    @staticmethod
    def _flops(func: Any, packet: Any, args: tuple, kwargs: dict, out: Any) -> tuple[str, float]:
        from torch.utils.flop_counter import flop_registry

        if packet in _ATTENTION or packet in _ATTENTION_BACKWARD:
            return "attention", _attention_flops(packet, args, kwargs)
        if packet in _MATMUL or packet in _CONV:
            return ("matmul" if packet in _MATMUL else "conv"), float(flop_registry[packet](*args, **kwargs,
                                                                                          out_val=out))
        return "memory", 0.0


def layer_work(mod: nn.Module, x: torch.Tensor, needs_input_grad: bool,
               then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None) -> LayerWork:
    """The work of one forward and one backward of ``mod`` on ``x``, run as the profiler times a layer
    (:func:`workbench.profiles.timing.time_layer`: ``then``, the loss, ends the last layer's forward)."""
    for p in mod.parameters():
        p.grad = None
    inp = leaf(x, needs_input_grad)
    counter = WorkCounter()
    with counter:
        y = then(mod(inp)) if then is not None else mod(inp)
        forward = counter.take()
        if y.requires_grad:
            torch.autograd.backward(y, grad)
        backward = counter.take()
    for p in mod.parameters():
        p.grad = None
    return LayerWork(forward, backward)


@dataclass(frozen=True)
class Calibration:
    """How far below the roofline a GPU runs: ``compute[kind/precision]`` (or ``compute[kind]``) the fraction
    of the peak FLOP/s, ``memory`` the fraction of the memory bandwidth, ``overhead`` seconds per kernel;
    ``source`` says where the numbers come from."""

    compute: Mapping[str, float] = field(default_factory=dict)
    memory: float = 1.0
    overhead: float = 0.0
    source: str = "none: datasheet peaks, no launch cost"

    def efficiency(self, kind: str, precision: str) -> float:
        """The fraction of the peak an operation of ``kind`` in ``precision`` reaches (1 if not calibrated).

        >>> H100_CALIBRATION.efficiency("attention", "float16") == H100_CALIBRATION.efficiency("matmul", "bfloat16")
        True
        """
        kind = "matmul" if kind == "attention" else kind
        precision = "bfloat16" if precision == "float16" else precision
        return float(self.compute.get(f"{kind}/{precision}", self.compute.get(kind, 1.0)))


UNCALIBRATED = Calibration()
#: fitted by ``benchmarks/roofline.py --fit`` on the ten H100 profiles of data/profiles/h100/ (float32 and
#: bfloat16: resnet50, resnet101, vgg16 at batch 32, gpt-small and gpt-medium at batch 8 of 512 tokens)
H100_CALIBRATION = Calibration(
    compute={"matmul/float32": 0.844, "matmul/bfloat16": 0.396, "conv/tf32": 0.380, "conv/bfloat16": 0.250},
    memory=0.331, overhead=38.2e-6,
    source="fitted on the H100 profiles of data/profiles/h100/ (benchmarks/roofline.py)")


def estimate(work: OpWork, gpu: Accelerator, calibration: Calibration = UNCALIBRATED) -> float:
    """Seconds of one phase's operations on ``gpu`` (the module docstring's formula)."""
    if len(work) == 0:
        return 0.0
    peak = np.array([gpu.peak(p) for p in _PRECISIONS])[work.precision]
    eff = np.array([[calibration.efficiency(k, p) for p in _PRECISIONS] for k in KINDS])[work.kind, work.precision]
    compute = np.where(work.kind > 0, work.flops / (peak * eff), 0.0)
    memory = work.bytes / (gpu.memory_bandwidth * calibration.memory)
    return float(np.sum(np.maximum(compute, memory)) + calibration.overhead * len(work))


class RooflineTimes:
    """The profiler's timing step for a fake profile (``profile_model(times=...)``): each layer's forward and
    backward seconds on ``gpu``, estimated from its work; every layer's :class:`LayerWork` is kept in
    ``works`` (for calibration)."""

    def __init__(self, gpu: Accelerator, calibration: Calibration = H100_CALIBRATION) -> None:
        self.gpu, self.calibration = gpu, calibration
        self.works: list[LayerWork] = []

    def __call__(self, mod: nn.Module, x: torch.Tensor, timer: Any, needs_input_grad: bool,
                 then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None, warmup: int,
                 repeats: int) -> tuple[list[float], list[float]]:
        work = layer_work(mod, x, needs_input_grad, then, grad)
        self.works.append(work)
        return [estimate(work.forward, self.gpu, self.calibration)], [estimate(work.backward, self.gpu,
                                                                               self.calibration)]

    def describe(self) -> str:
        """What the profile's ``timing`` metadata says."""
        return (f"estimated, not measured: a roofline over every operation's FLOPs (torch.utils.flop_counter) and "
                f"bytes on {self.gpu.label} (datasheet peaks), calibration: {self.calibration.source}")


def total_seconds(works: list[LayerWork], gpu: Accelerator, calibration: Calibration) -> float:
    """Forward and backward seconds of every layer in ``works`` on ``gpu``."""
    return math.fsum(estimate(w.forward, gpu, calibration) + estimate(w.backward, gpu, calibration) for w in works)
