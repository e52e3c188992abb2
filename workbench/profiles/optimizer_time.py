"""Seconds of an optimizer step on a GPU: memory-bound passes over the parameters, gradients and states.

An optimizer step does almost no arithmetic per byte: it is priced as the bytes its kernels read and write
at the GPU's memory bandwidth (the fraction of it STREAM-like kernels reach,
:func:`~workbench.profiles.kernel_time.memory_fraction`), plus the least time of each kernel. What it moves
per parameter, in elements (:data:`ACCESSES`), is counted from torch's implementations
(``torch/optim/adam.py``, ``adamw.py``, ``sgd.py``, torch 2.x; ``tests/test_optimizer_time.py`` counts the
bytes torch's own steps move under :class:`~workbench.profiles.roofline.WorkCounter` and finds the same):

* ``foreach`` (torch's default on CUDA), AdamW: ``_foreach_mul_`` (weight decay, 2: read and write the
  parameter), ``_foreach_lerp_`` (first moment, 3), ``_foreach_mul_`` and ``_foreach_addcmul_`` (second
  moment, 2 + 3), ``_foreach_sqrt``, ``_foreach_div_``, ``_foreach_add_`` (the denominator, 2 + 2 + 2),
  ``_foreach_addcdiv_`` (the update, 4): 20 elements, 80 bytes a parameter in float32; Adam skips the weight
  decay (18); SGD with momentum 8 (``_foreach_mul_``, ``_foreach_add_`` twice), plain SGD 3;
* ``fused`` (``fused=True``): one kernel reads the parameter, gradient and states and writes them back:
  Adam/AdamW 7 elements, SGD with momentum 5, SGD 3.

``precision``: ``fp32`` (everything float32), ``bf16`` (everything bfloat16: torch keeps the states in the
parameters' dtype) or ``bf16-mixed`` (the step on float32 masters, plus casting the bf16 gradients up, 2 + 4
bytes, and the masters back down, 4 + 2 bytes, per parameter). :func:`grad_clip_seconds` prices
``clip_grad_norm_`` (foreach: the norm reads every gradient, the scaling reads and writes it: 3 elements).

>>> from workbench.model.accelerators import accelerator
>>> h100 = accelerator("h100-sxm")
>>> one, two = (optimizer_step_seconds(n, "adamw", "fp32", h100) for n in (1e9, 2e9))
>>> round(two / one, 2), one > optimizer_step_seconds(1e9, "adamw", "fp32", h100, implementation="fused")
(2.0, True)
"""

from __future__ import annotations

import math

from workbench.model.accelerators import Accelerator, accelerator
from workbench.profiles.kernel_time import H100_CALIBRATION, Calibration, memory_fraction

__all__ = ["ACCESSES", "KERNELS", "IMPLEMENTATIONS", "optimizer_step_seconds", "grad_clip_seconds",
           "step_bytes_per_parameter"]

IMPLEMENTATIONS = ("foreach", "fused")
#: elements read or written per parameter by one step, (optimizer, implementation) -> count (module docstring)
ACCESSES = {("none", "foreach"): 0, ("sgd", "foreach"): 3, ("momentum", "foreach"): 8, ("adam", "foreach"): 18,
            ("adamw", "foreach"): 20, ("none", "fused"): 0, ("sgd", "fused"): 3, ("momentum", "fused"): 5,
            ("adam", "fused"): 7, ("adamw", "fused"): 7}
#: kernels one step launches per group of tensors (foreach: one per ``_foreach_*`` call; fused: one)
KERNELS = {("none", "foreach"): 0, ("sgd", "foreach"): 1, ("momentum", "foreach"): 3, ("adam", "foreach"): 8,
           ("adamw", "foreach"): 9, ("none", "fused"): 0, ("sgd", "fused"): 1, ("momentum", "fused"): 1,
           ("adam", "fused"): 2, ("adamw", "fused"): 2}
_PRECISION_BYTES = {"fp32": 4, "bf16": 2, "bf16-mixed": 4}
#: torch's multi_tensor_apply launches one kernel per this many tensors (its depth-4 list limit, 36)
_TENSORS_PER_LAUNCH = 36


def _gpu(gpu: str | Accelerator) -> Accelerator:
    return gpu if isinstance(gpu, Accelerator) else accelerator(gpu)


def step_bytes_per_parameter(optimizer: str, precision: str, implementation: str = "foreach") -> float:
    """Bytes one step moves per parameter (module docstring).

    >>> step_bytes_per_parameter("adamw", "fp32"), step_bytes_per_parameter("adamw", "bf16-mixed", "fused")
    (80, 40)
    """
    key = (optimizer, implementation)
    if key not in ACCESSES:
        raise ValueError(f"optimizer {optimizer!r} with implementation {implementation!r}: known optimizers "
                         f"{sorted({o for o, _ in ACCESSES})}, implementations {list(IMPLEMENTATIONS)}")
    if precision not in _PRECISION_BYTES:
        raise ValueError(f"precision {precision!r}: known {sorted(_PRECISION_BYTES)}")
    moved = ACCESSES[key] * _PRECISION_BYTES[precision]
    return moved + (12 if precision == "bf16-mixed" and moved else 0)


def optimizer_step_seconds(params: float, optimizer: str = "adamw", precision: str = "fp32",
                           gpu: str | Accelerator = "h100-sxm", *, implementation: str = "foreach",
                           tensors: int = 1, calibration: Calibration = H100_CALIBRATION) -> float:
    """Seconds of one optimizer step over ``params`` parameters (elements) held in ``tensors`` tensors on one
    ``gpu``: the larger of the kernels' memory traffic and the CPU's launches of them."""
    acc = _gpu(gpu)
    moved = params * step_bytes_per_parameter(optimizer, precision, implementation)
    launches = KERNELS[(optimizer, implementation)] * math.ceil(max(tensors, 1) / _TENSORS_PER_LAUNCH)
    if precision == "bf16-mixed" and moved:
        launches += 2 * math.ceil(max(tensors, 1) / _TENSORS_PER_LAUNCH)
    gpu_s = moved / (acc.memory_bandwidth * memory_fraction(acc, calibration)) + launches * calibration.kernel_floor
    return max(gpu_s, launches * calibration.launch[0])


def grad_clip_seconds(params: float, precision: str = "fp32", gpu: str | Accelerator = "h100-sxm", *,
                      calibration: Calibration = H100_CALIBRATION) -> float:
    """Seconds of ``clip_grad_norm_`` (foreach) over ``params`` gradients of ``precision`` (``bf16-mixed``:
    the float32 masters' gradients).

    >>> round(grad_clip_seconds(1e9, "fp32", "h100-sxm") / grad_clip_seconds(1e9, "bf16", "h100-sxm"), 1)
    2.0
    """
    moved = 3 * params * _PRECISION_BYTES[precision]
    acc = _gpu(gpu)
    return moved / (acc.memory_bandwidth * memory_fraction(acc, calibration)) + 2 * calibration.kernel_floor
