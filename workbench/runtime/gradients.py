"""The gradient check of a run: the whole model's gradients in one process, and how far a run's may be.

A run steps its optimizer with a learning rate of 0, so every mini-batch sees the same weights and the
gradients the ranks accumulate equal :func:`reference_gradients` (one process) up to rounding:
:func:`grad_error` measures the difference, :func:`grad_tolerance` bounds the rounding per dtype.

>>> grad_error({"w": torch.tensor([1.0, 2.5])}, {"w": torch.tensor([1.0, 2.0])})
(0.5, 0.25)
"""

from __future__ import annotations

import torch

from workbench.profiles.workload import Workload, model_loss

__all__ = ["reference_gradients", "grad_error", "grad_tolerance"]


def reference_gradients(workload: Workload, steps: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Single-process gradients of the whole model (shared parameters tied, as built) summed over
    mini-batches 0..steps-1 (the weights never change), computed on ``device``, returned on the CPU."""
    model = workload.build().to(device)
    model.train()
    for i in range(steps):
        inputs, y = workload.batch(i)
        inputs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), inputs)
        model_loss(workload, model, inputs, y.to(device) if isinstance(y, torch.Tensor) else y).backward()
    return {n: (p.grad.detach().cpu().clone() if p.grad is not None else torch.zeros_like(p, device="cpu"))
            for n, p in model.named_parameters()}


def grad_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(max absolute difference, that divided by the largest reference magnitude) over all parameters,
    computed in float64 whatever the gradients' dtype."""
    missing = sorted(set(reference) ^ set(grads))
    if missing:
        raise ValueError(f"gradient names differ: {missing[:5]}")
    abs_err = max(float((grads[n].double() - reference[n].double()).abs().max()) for n in reference)
    scale = max(float(reference[n].double().abs().max()) for n in reference)
    return abs_err, abs_err / scale if scale > 0 else abs_err


# float32: what the H100 runs reached in float32 (at most 1.4e-6) with room; bfloat16: 4 units in the last
# place of the largest gradient (8 significant bits: one unit is 2**-7 of it), see grad_tolerance
_GRAD_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2.0**-5, torch.float16: 2.0**-8}


def grad_tolerance(dtype: str | torch.dtype | None = None) -> float:
    """The largest relative :func:`grad_error` of a run against :func:`reference_gradients` that is still
    rounding, for gradients of ``dtype`` (default float32).

    The run and the reference compute the same layers with the same kernels, but
    not always in the same order of summation (a stage's backward alone against
    the whole model's; on a GPU, algorithms chosen per call and atomic adds), and
    each of the ``steps`` accumulations rounds. In float32 the committed H100
    runs differ by at most 1.4e-6; the bound is 1e-5. bfloat16 keeps 8
    significant bits, so one rounding of the largest gradient moves it by up to
    2**-7 (0.8%) of itself and a different order of summation by a few such units:
    the bound is 4 units, 2**-5 (3.1%). What it catches is then coarser than in
    float32: an error must move the largest accumulated gradient by more than
    3.1% of itself. Losing one of ``steps`` mini-batches moves the sum by about
    1/steps of it (6% at 16 steps, caught; 2.5% at 40, not reliably), a wrong
    weight version or a gradient sent to the wrong stage by far more. The H100
    bf16 runs differ by at most 0.85% (gpt-medium on 4 devices).

    >>> grad_tolerance(), grad_tolerance("bfloat16")
    (1e-05, 0.03125)
    """
    from workbench.profiles.zoo import as_dtype

    return _GRAD_TOLERANCE[as_dtype(dtype)]
