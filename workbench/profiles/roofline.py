"""The work of every operation a layer runs, counted under fake tensors, and its time on a named GPU.

A fake profile (:mod:`workbench.profiles.fake`) cannot time anything: its tensors have shapes and no
values. So :class:`WorkCounter`, a ``TorchDispatchMode``, records every operation a layer's forward and
backward dispatch (the same ``aten`` operations torch runs for them): its kind (matmul, convolution,
attention, memory-bound kernel, or a dispatch without kernel: a view, an allocation), its precision, its
FLOPs (``torch.utils.flop_counter``'s formulas; attention's own, halved when causal; torch's
``RuntimeEstimator`` aborts on this CPU build), the bytes it reads and writes (its tensor arguments and
results, a broadcast dimension counted once) and, for a matmul, whether every dimension is a multiple of
16 bytes' worth of elements (cuBLAS's aligned tensor-core kernels). :func:`estimate` prices one phase
(a forward or a backward) with :mod:`workbench.profiles.kernel_time`: each kernel at the published
throughput of its kind on that GPU, memory-bound ones at the memory bandwidth, and the CPU's launches
overlapping the GPU's work.

The precision is torch's default on a GPU for the operation's dtype: a float32 matmul runs in float32
(``allow_tf32`` off for matmuls), a float32 convolution in TF32 (cuDNN's ``allow_tf32`` on); bfloat16
and float16 on tensor cores.

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
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.model.accelerators import Accelerator
from workbench.profiles.fused import attention_kind
from workbench.profiles.kernel_time import (
    H100_CALIBRATION,
    KINDS,
    PRECISIONS,
    UNCALIBRATED,
    Calibration,
    phase_seconds,
)
from workbench.profiles.local import defer_to_subclass, on_meta
from workbench.profiles.recording import is_suspended
from workbench.profiles.timing import leaf

__all__ = ["OpWork", "LayerWork", "WorkCounter", "Calibration", "UNCALIBRATED", "H100_CALIBRATION", "layer_work",
           "estimate", "total_seconds", "RooflineTimes", "KINDS", "gpu_meta"]

aten = torch.ops.aten
_PRECISIONS = PRECISIONS
_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
              aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention}
_ATTENTION_BACKWARD = {aten._scaled_dot_product_flash_attention_for_cpu_backward,
                       aten._scaled_dot_product_flash_attention_backward,
                       aten._scaled_dot_product_efficient_attention_backward,
                       aten._scaled_dot_product_cudnn_attention_backward}
_MATMUL = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
#: where each matmul's two matrix operands are among its arguments
_MATMUL_OPERANDS = {aten.mm: (0, 1), aten.bmm: (0, 1), aten.addmm: (1, 2), aten.baddbmm: (1, 2)}
_CONV = {aten.convolution, aten._convolution, aten.convolution_backward}
#: collectives (tensor parallelism's): priced on their link (workbench.parallel.collectives), not here
_COLLECTIVES = {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d"}
#: operations that launch no kernel: allocations (their first write is the next kernel's) and aliases
_NO_KERNEL = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
              aten.detach, aten.lift_fresh, aten._local_scalar_dense, aten._unsafe_view, aten.alias}


@dataclass(frozen=True)
class OpWork:
    """The operations of one phase (a layer's forward or its backward), one entry each: ``kind`` (an index
    into :data:`KINDS`), ``precision`` (an index into the precisions), ``flops``, ``bytes`` and ``aligned``
    (False for a matmul with a dimension that is not a multiple of 16 bytes' worth of elements)."""

    kind: np.ndarray
    precision: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    aligned: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def kernels(self) -> int:
        """How many of the operations launch a kernel."""
        return int(np.sum(self.kind != KINDS.index("host")))


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
        self._rows: list[tuple[int, int, float, float, bool]] = []

    def take(self) -> OpWork:
        rows, self._rows = self._rows, []
        a = np.array(rows, dtype=float).reshape(-1, 5)
        return OpWork(a[:, 0].astype(int), a[:, 1].astype(int), a[:, 2], a[:, 3], a[:, 4].astype(bool))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if defer_to_subclass(types):      # a DTensor: the operations it runs on its local shards are counted
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_suspended():                     # inside a fused kernel (workbench.profiles.fused): it records itself
            return out
        packet = func.overloadpacket
        if func.namespace in _COLLECTIVES:     # tensor parallelism's collectives: priced on their link
            return out
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)] or _written(func, args, kwargs)
        if any(on_meta(t) for t in outs):      # a DTensor's shape probe: no kernel
            return out
        if packet in _NO_KERNEL or getattr(func, "is_view", False) or not outs:
            self._rows.append((KINDS.index("host"), 0, 0.0, 0.0, True))
            return out
        ins = list({id(t): t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}.values())
        kind, flops = self._flops(func, packet, args, kwargs, out)
        dtype = next((t.dtype for t in ins if t.is_floating_point()), outs[0].dtype)
        moved = sum(_distinct_bytes(t) for t in ins + outs) + _read_again(packet, args)
        aligned = _aligned(packet, args) if kind == "matmul" else True
        self._rows.append((KINDS.index(kind), _PRECISIONS.index(_precision(kind, dtype)), flops, moved, aligned))
        return out

    def record_fused(self, name: str, nbytes: float, dtype: torch.dtype) -> None:
        """One fused memory-bound kernel moving ``nbytes`` (:mod:`workbench.profiles.fused`)."""
        self._rows.append((KINDS.index("memory"), _PRECISIONS.index(_precision("memory", dtype)), 0.0, nbytes, True))

    @staticmethod
    def _flops(func: Any, packet: Any, args: tuple, kwargs: dict, out: Any) -> tuple[str, float]:
        from torch.utils.flop_counter import flop_registry

        if packet in _ATTENTION or packet in _ATTENTION_BACKWARD:
            return attention_kind(), _attention_flops(packet, args, kwargs)
        if packet in _MATMUL or packet in _CONV:
            return ("matmul" if packet in _MATMUL else "conv"), float(flop_registry[packet](*args, **kwargs,
                                                                                          out_val=out))
        return "memory", 0.0


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an operation that returns nothing writes in place (``_foreach_mul_``, fused optimizers):
    the arguments its schema marks as written."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return written


def _read_again(packet: Any, args: tuple) -> float:
    """Bytes torch's CUDA kernels for normalisation and softmax read a second (third) time: batch norm in training
    reduces its input, then normalises it (``Normalization.cuh``: collect_statistics, then transform_input; its
    backward reduces the input and gradient, then writes the input's gradient); layer norm's backward writes the
    input's gradient, then reduces the weight's and bias's (``layer_norm_kernel.cu``: GammaBetaBackward); a
    softmax over rows longer than 1024 reads each row for its maximum, its sum, then its output
    (``SoftMax.cu``: cunn_SoftMaxForward; the backward reads the gradient and output for the sum, then again)."""
    if packet is aten.native_batch_norm and len(args) > 5 and args[5] is True:
        return _distinct_bytes(args[0])
    if packet is aten.native_batch_norm_backward:
        return _distinct_bytes(args[0]) + _distinct_bytes(args[1])
    if packet is aten.native_layer_norm_backward and any(args[7][1:]):
        return _distinct_bytes(args[0]) + _distinct_bytes(args[1])
    if packet in (aten._softmax, aten._log_softmax) and args[0].shape[args[1]] > 1024:
        return 2 * _distinct_bytes(args[0])
    if packet in (aten._softmax_backward_data, aten._log_softmax_backward_data) and args[0].shape[args[2]] > 1024:
        return _distinct_bytes(args[0]) + _distinct_bytes(args[1])
    return 0.0


def _aligned(packet: Any, args: tuple) -> bool:
    """Whether a matmul's m, k and n are multiples of 16 bytes' worth of elements (8 in 16-bit)."""
    a, b = (args[i] for i in _MATMUL_OPERANDS[packet])
    step = max(16 // a.element_size(), 1)
    return all(int(d) % step == 0 for d in (*a.shape[-2:], b.shape[-1]))


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


def estimate(work: OpWork, gpu: Accelerator, calibration: Calibration = UNCALIBRATED, *,
             backward: bool = False) -> float:
    """Seconds of one phase's operations on ``gpu`` (:func:`workbench.profiles.kernel_time.phase_seconds`)."""
    return phase_seconds(work.kind, work.precision, work.flops, work.bytes, work.aligned, gpu, calibration, backward)


class RooflineTimes:
    """The profiler's timing step for a fake profile (``profile_model(times=...)``): each layer's forward and
    backward seconds on ``gpu``, estimated from its work; every layer's :class:`LayerWork` is kept in
    ``works`` (for calibration and to store in the profile)."""

    def __init__(self, gpu: Accelerator, calibration: Calibration = H100_CALIBRATION) -> None:
        self.gpu, self.calibration = gpu, calibration
        self.works: list[LayerWork] = []

    def __call__(self, mod: nn.Module, x: torch.Tensor, timer: Any, needs_input_grad: bool,
                 then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None, warmup: int,
                 repeats: int) -> tuple[list[float], list[float]]:
        work = layer_work(mod, x, needs_input_grad, then, grad)
        self.works.append(work)
        return ([estimate(work.forward, self.gpu, self.calibration)],
                [estimate(work.backward, self.gpu, self.calibration, backward=True)])

    def describe(self) -> str:
        """What the profile's ``timing`` metadata says."""
        return (f"estimated, not measured: every operation's FLOPs and bytes priced on {self.gpu.label} "
                f"(datasheet peaks, published GEMM and attention throughput, launches overlapping the work: "
                f"workbench.profiles.kernel_time), calibration: {self.calibration.source}")


def total_seconds(works: list[LayerWork], gpu: Accelerator, calibration: Calibration) -> float:
    """Forward and backward seconds of every layer in ``works`` on ``gpu``."""
    return math.fsum(estimate(w.forward, gpu, calibration) + estimate(w.backward, gpu, calibration, backward=True)
                     for w in works)


def gpu_meta(acc: Accelerator, calibration: Calibration = H100_CALIBRATION) -> dict[str, str]:
    """The metadata that says a profile's times are estimates for ``acc``."""
    return {"device": f"cuda ({acc.label}; fake tensors on this machine)", "gpu": acc.name, "times": "estimated",
            "timing": RooflineTimes(acc, calibration).describe()}
