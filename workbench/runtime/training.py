"""The training step the memory model describes: an optimizer by name, and fp32 masters for bf16-mixed.

The memory model (:mod:`workbench.model.memory`, docs/model.md "Memory") assumes a
training step of this shape, which the runtime and the memory witness
(:mod:`workbench.runtime.witness`) both run:

* the training loop (``zero_grad``, docs/model.md "Memory"): ``none``, torch's default
  (``optimizer.zero_grad()`` sets every gradient to None: the first backward of a step
  writes them, later ones add into them), or ``zeros`` (:func:`zero_grad` zeroes them in
  place, ``set_to_none=False``: a resident accumulation buffer);
* the optimizer is torch's own, by name (:data:`OPTIMIZERS`): ``none`` (no
  step), ``sgd``, ``momentum`` (SGD with momentum 0.9), ``adam``, ``adamw``,
  with torch's default implementation (a loop over parameters on CPU,
  ``foreach`` on GPUs);
* ``bf16-mixed``: the model (parameters, gradients, activations) is bf16;
  :class:`MasterWeights` keeps an fp32 copy of every parameter and of its
  gradient (under ``none`` made at the step and freed after it), the optimizer
  (and its state) works on the fp32 copies, and the step copies the result back
  into the bf16 parameters.

A learning rate of 0 keeps the weights (and so the gradient check) exact
while every byte of the step is still allocated.

>>> import torch
>>> model = torch.nn.Linear(4, 2)
>>> opt = make_optimizer("adam", model.parameters())
>>> loss = model(torch.ones(3, 4)).sum(); loss.backward(); opt.step()
>>> sorted(opt.state[model.weight])
['exp_avg', 'exp_avg_sq', 'step']
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from workbench.model.training_setup import OPTIMIZERS

__all__ = ["OPTIMIZERS", "ZERO_GRADS", "make_optimizer", "MasterWeights", "zero_grad"]


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float = 0.0,
                   foreach: bool | None = None) -> torch.optim.Optimizer | None:
    """torch's optimizer called ``name`` over ``params`` (None for ``"none"`` or no parameters); ``foreach``
    as torch takes it (None: torch's default for the parameters' device; True: the multi-tensor step torch
    runs on GPUs, e.g. for a fake profile's witness on this CPU).

    >>> make_optimizer("momentum", torch.nn.Linear(2, 2).parameters()).defaults["momentum"]
    0.9
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    params = list(params)
    if name == "none" or not params:
        return None
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=foreach)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=foreach)
    return torch.optim.AdamW(params, lr=lr, foreach=foreach)


#: the training loops: ``none`` (torch's default ``zero_grad()``) and ``zeros`` (in place)
ZERO_GRADS = ("none", "zeros")


def zero_grad(params: Iterable[torch.nn.Parameter], loop: str = "zeros") -> None:
    """Between two steps: ``zeros`` zeroes every gradient in place, allocating the ones that do not exist yet (a
    resident buffer); ``none`` sets them to None, as torch's ``optimizer.zero_grad()`` does by default.

    >>> p = torch.nn.Parameter(torch.ones(2)); zero_grad([p]); p.grad.tolist()
    [0.0, 0.0]
    >>> zero_grad([p], "none"); p.grad is None
    True
    """
    if loop not in ZERO_GRADS:
        raise ValueError(f"zero_grad must be one of {', '.join(ZERO_GRADS)}, got {loop!r}")
    for p in params:
        if not p.requires_grad:
            continue
        if loop == "none":
            p.grad = None
        elif p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()


class MasterWeights:
    """fp32 master copies of low-precision parameters and of their gradients, stepped by an optimizer.

    >>> lin = torch.nn.Linear(2, 2).to(torch.bfloat16)
    >>> mw = MasterWeights(lin.parameters(), "adam")
    >>> zero_grad(lin.parameters()); lin(torch.ones(1, 2, dtype=torch.bfloat16)).sum().backward(); mw.step()
    >>> mw.masters[0].dtype, mw.masters[0].grad.dtype
    (torch.float32, torch.float32)
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer: str, lr: float = 0.0, loop: str = "zeros") -> None:
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().requires_grad_(True) for p in self.params]
        self.loop = loop
        if loop == "zeros":
            for m in self.masters:
                m.grad = torch.zeros_like(m)
        self.optimizer = make_optimizer(optimizer, self.masters, lr)

    def step(self) -> None:
        """Copy the gradients into the masters, step them, copy the weights back (all in place); under ``none``
        the masters' gradients are made here and freed after the step."""
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if p.grad is None:
                    continue
                if m.grad is None:
                    m.grad = p.grad.float()
                else:
                    m.grad.copy_(p.grad)
            if self.optimizer is not None:
                self.optimizer.step()
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
                if self.loop == "none":
                    m.grad = None

    def tensors(self) -> list[torch.Tensor]:
        """The masters and their resident gradients (for a memory tracker's ``track_external``)."""
        return self.masters + [m.grad for m in self.masters if m.grad is not None]
