"""How the profiler times one layer: a clock per device, the CPU thread count, the repeats.

:func:`time_layer` runs a layer's forward and backward ``warmup`` times
untimed, then ``repeats`` times timed with a :class:`Timer`
(``time.perf_counter`` on a CPU, CUDA events and synchronisation on a GPU).
Each repeat starts from :func:`leaf` (a detached copy of the input, with
``requires_grad`` except for data) and parameter gradients reset to
``None``, so every backward allocates them afresh (docs/model.md, the
profile's columns). :func:`cpu_threads` holds the CPU thread count while
profiling.

On a CPU the :class:`Timer` reads one of two clocks (``CLOCKS``): ``"wall"``
(``time.perf_counter``, the default) or ``"cpu"`` (``time.thread_time``, the
CPU time of the calling thread: what the layer costs on a core of its own, however
many other processes share the machine; with one thread, the profiler's default,
the two agree on an idle machine). A GPU is timed with CUDA events whatever the clock.

>>> lin = torch.nn.Linear(3, 2)
>>> fwd, bwd = time_layer(lin, torch.zeros(4, 3), Timer(torch.device("cpu")), True, None, torch.ones(4, 2), 1, 3)
>>> len(fwd), len(bwd), all(t > 0 for t in fwd + bwd), lin.weight.grad.shape
(3, 3, True, torch.Size([2, 3]))
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from workbench.profiles.wrappers import ModelFailure, model_call

__all__ = ["leaf", "cpu_threads", "Timer", "time_layer", "say_how_long", "layer_forward", "RUNS_PER_REPEAT",
           "MEMORY_PASSES", "CLOCKS"]

#: the clocks a CPU profile can be timed with
CLOCKS = ("wall", "cpu")


def leaf(x: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A detached copy of ``x`` that requires a gradient when asked and floating.

    >>> leaf(torch.zeros(1), True).requires_grad, leaf(torch.zeros(1, dtype=torch.long), True).requires_grad
    (True, False)
    """
    inp = x.detach()
    if requires_grad and inp.is_floating_point():
        inp.requires_grad_(True)
    return inp


@contextmanager
def cpu_threads(device: torch.device, n: int | None) -> Iterator[None]:
    """``n`` CPU threads inside (on a CPU device, unless ``n`` is None), the previous count after.

    >>> before = torch.get_num_threads()
    >>> with cpu_threads(torch.device("cpu"), 1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    old = torch.get_num_threads()
    if n is not None and device.type == "cpu":
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Timer:
    """perf_counter (``clock="wall"``) or the thread's CPU time (``clock="cpu"``) on CPU, CUDA events on a
    GPU; ``run(fn)`` returns ``fn()``'s result and its seconds.

    >>> _, seconds = Timer(torch.device("cpu"), clock="cpu").run(lambda: time.sleep(0.05))
    >>> seconds < 0.04          # asleep: no CPU time
    True
    """

    def __init__(self, device: torch.device, clock: str = "wall") -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
        self.cuda = device.type == "cuda"
        self.device = device
        self.clock = clock
        self._now = time.thread_time if clock == "cpu" else time.perf_counter

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def run(self, fn) -> tuple[Any, float]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            torch.cuda.synchronize(self.device)
            return result, start.elapsed_time(end) / 1e3
        t0 = self._now()
        result = fn()
        return result, self._now() - t0


def time_layer(mod: nn.Module, x: torch.Tensor, timer: Timer, needs_input_grad: bool,
               then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None, warmup: int,
               repeats: int) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of ``repeats`` runs of one layer after ``warmup`` untimed ones; ``then``
    (the loss) ends the forward of the last layer, whose backward starts from it, the others' from ``grad``."""
    fwd: list[float] = []
    bwd: list[float] = []
    for r in range(warmup + repeats):
        for p in mod.parameters():
            p.grad = None
        inp = leaf(x, needs_input_grad)
        timer.sync()
        y, tf = timer.run((lambda: then(mod(inp))) if then is not None else (lambda: mod(inp)))
        if y.requires_grad:
            _, tb = timer.run(lambda: torch.autograd.backward(y, grad))
        else:  # nothing to differentiate (no parameters, input is data)
            tb = 0.0
        if r >= warmup:
            fwd.append(tf)
            bwd.append(tb)
        y = inp = None  # free them before the next repeat
    return fwd, bwd


#: a profile costs about this many forward passes of the model per timed or warm-up run (a backward is about 1.8
#: forwards), plus the passes that measure memory. Measured on CPU with 2 warm-up and 5 timed runs, on a machine
#: shared with other work (load 8 to 10 on 2 cores): GPT-2 small in bf16, batch 8 of 1024 tokens, one forward
#: 26.9 s, the profile 698 s: the estimate 14 % high; small models (profiles of 2 to 10 s: GPTs of 2 and 4 blocks
#: in float32 and bf16, resnet50 and vgg16 at 64 px) 27 % to 56 % low
RUNS_PER_REPEAT, MEMORY_PASSES = 2.8, 10.0


def layer_forward(mod: nn.Module, x: Any, where: str) -> Any:
    """``mod(x)``; an exception the layer raises becomes a
    :class:`~workbench.profiles.wrappers.ModelFailure` naming ``where`` (the model's own code failed on the
    previous layer's output, as a bare ``nn.Sequential`` whose sizes do not match does), so that ``--module``
    reports it as one line.

    >>> layer_forward(nn.Linear(2, 3), torch.zeros(1, 4), "layer 0 (Linear)")
    Traceback (most recent call last):
    ...
    workbench.profiles.wrappers.ModelFailure: layer 0 (Linear)'s forward on the previous layer's output
    """
    return model_call(mod, x, f"{where}'s forward on the previous layer's output")


def say_how_long(mods: list[nn.Module], x: torch.Tensor, warmup: int, repeats: int) -> float:
    """Print (and return) how long a profile of ``mods`` (on their device) will take: one forward of the whole
    model, timed, times the runs the profile makes (:data:`RUNS_PER_REPEAT` per warm-up or timed run, and
    :data:`MEMORY_PASSES`).

    >>> seconds = say_how_long([nn.Identity()], torch.zeros(1), 2, 5)  # doctest: +ELLIPSIS
    profiling 1 layers, 2 warm-up and 5 timed runs each, then their memory: about ... s on this machine (...)
    >>> seconds >= 0
    True
    """
    from workbench.model.units import format_seconds

    print(f"profiling {len(mods)} layers, {warmup} warm-up and {repeats} timed runs each, then their memory: ",
          end="", flush=True)
    took = []
    for _ in range(2):                     # the first forward is cold (allocations, kernel choice): the second counts
        t0, h = time.perf_counter(), x
        with torch.no_grad():
            for i, mod in enumerate(mods):
                try:
                    h = layer_forward(mod, h, f"layer {i} ({type(mod).__name__})")
                except ModelFailure:
                    print(flush=True)               # end the progress line before the error
                    raise
        if h.device.type == "cuda":
            torch.cuda.synchronize(h.device)
        took.append(time.perf_counter() - t0)
    forward = took[-1]
    estimate = forward * (RUNS_PER_REPEAT * (warmup + repeats) + MEMORY_PASSES)
    about = f"{estimate:.0f} s" if estimate < 90 else f"{estimate / 60:.0f} min"
    print(f"about {about} on this machine (one forward took {format_seconds(forward)})", flush=True)
    return estimate
