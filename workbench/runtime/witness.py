"""The memory witness: torch's own tracker around a plain training step, for checking the memory model.

:func:`plain_step_peak` builds nothing of the workbench's: it runs a whole
model (no pipeline, no profiler, no runtime) through ordinary training steps
-- ``zero_grad`` (torch's default, gradients set to None, or in place: the
``loop``), forward, loss, backward, optimizer step, as
:mod:`workbench.runtime.training` describes them -- under
``torch.distributed._tools.mem_tracker.MemTracker``, and returns the peak
bytes that tracker saw. The memory model's prediction for a one-device plan
of the same model (:mod:`workbench.model.memory`, from a profile) is compared
against it in ``benchmarks/memory.py`` and ``tests/test_memory.py``.

MemTracker counts the tensors created inside it and those registered with
``track_external`` (the model, the optimizer and its state, the batch, the
fp32 masters). One step runs first, untracked, so that gradients and
optimizer state exist (the steady state); the peak is that of the next
``steps`` steps.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
>>> peak = plain_step_peak(model, torch.ones(4, 8), torch.zeros(4, dtype=torch.long),
...                        lambda out, y: torch.nn.functional.cross_entropy(out, y), "sgd")
>>> peak > 2 * 288     # parameters and gradients at least
True
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from workbench.runtime.training import MasterWeights, make_optimizer, zero_grad

__all__ = ["plain_step_peak"]


def plain_step_peak(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], optimizer: str, *,
                    mixed: bool = False, steps: int = 2, foreach: bool | None = None, loop: str = "none",
                    micro_batches: int = 1) -> int:
    """Peak bytes (MemTracker, the device of ``x``) of ``steps`` plain training steps after a warm-up step.

    ``loop``: ``none`` (torch's default ``zero_grad()``: gradients set to None) or ``zeros`` (zeroed in
    place); ``micro_batches``: backwards per step (gradient accumulation: the later ones add into the
    gradients the first made).
    ``mixed``: ``model`` is in bf16 and the optimizer steps fp32 masters (:class:`MasterWeights`).
    ``foreach``: the optimizer's (:func:`~workbench.runtime.training.make_optimizer`; True for the step
    torch runs on a GPU). Under ``FakeTensorMode`` it measures a fake step: nothing is allocated.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    masters = MasterWeights(params, optimizer, loop=loop) if mixed else None
    opt = None if mixed else make_optimizer(optimizer, params, foreach=foreach)

    def step() -> None:
        zero_grad(params, loop)
        for _ in range(micro_batches):
            loss_fn(model(x), y).backward()
        if masters is not None:
            masters.step()
        elif opt is not None:
            opt.step()

    step()
    tracker = MemTracker()
    external: list = [model, x, y]
    if opt is not None:
        external.append(opt)
    if masters is not None:
        external += masters.tensors()
        if masters.optimizer is not None:
            external.append(masters.optimizer)
    tracker.track_external(*external)
    with tracker:
        for i in range(steps):
            if i:
                tracker.reset_mod_stats()
            step()
    peaks = tracker.get_tracker_snapshot("peak")
    return int(peaks[x.device]["Total"]) if x.device in peaks else int(max(d["Total"] for d in peaks.values()))
