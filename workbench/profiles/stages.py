"""A plan's stages timed as the runtime runs them, but alone: each stage's layers as one module, no engine.

A profile times every layer alone (:mod:`~workbench.profiles.profiler`): on a copy of its input, repeat
after repeat, its weights and activations hot in the cache. A stage runs its layers one after another,
and a runtime adds its own code around them. :func:`time_stages` measures the step between the two: each
stage of a plan as one ``nn.Sequential`` of its layers, the loss ending the last stage, timed like a
profiled layer (:func:`~workbench.profiles.timing.time_layer`: warm-up, the median of the repeats, fresh
gradients each repeat; by default the thread's CPU time, one thread). Against the profile's summed layer
times it says what running the layers together changes; against a run's operations, what the engine adds
(:mod:`workbench.runtime.period_budget`).

>>> from workbench.profiles.workload import Workload
>>> times = time_stages(Workload.zoo("mlp", 4), [(0, 2), (3, 4)], warmup=0, repeats=1)
>>> len(times), all(f > 0 and b > 0 for f, b in times)
(2, True)
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch
from torch import nn

from workbench.profiles.timing import Timer, cpu_threads, time_layer

__all__ = ["time_stages"]


def _layer_inputs(modules: Sequence[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """The input of every layer (and the last one's output) on the example batch, without autograd."""
    out = [x]
    with torch.no_grad():
        for m in modules:
            out.append(m(out[-1]))
    return out


def time_stages(workload: Any, stages: Sequence[Any], *, warmup: int = 2, repeats: int = 5, clock: str = "cpu",
                threads: int = 1) -> list[tuple[float, float]]:
    """(forward, backward) seconds of each stage (a ``Stage`` or a ``(first, last)`` pair of layers) of
    ``workload``'s chain run as one module alone: medians of ``repeats`` after ``warmup``, on ``clock``
    (``"cpu"``: the thread's CPU time, as ``profile --clock cpu``; ``"wall"``)."""
    if clock == "cpu" and threads != 1:
        raise ValueError(f"clock 'cpu' times the calling thread alone: use threads=1, got {threads}")
    layers = workload.layers()
    target = workload.batch(0)[1]
    cpu = torch.device("cpu")
    timer = Timer(cpu, clock)
    gen = torch.Generator().manual_seed(0)
    spans = [(s.first, s.last) if hasattr(s, "first") else (int(s[0]), int(s[1])) for s in stages]
    out: list[tuple[float, float]] = []
    with cpu_threads(cpu, threads):
        inputs = _layer_inputs(layers.modules, layers.input)
        for first, last in spans:
            if not 0 <= first <= last < len(layers):
                raise ValueError(f"stage {first}..{last} is not within the chain's {len(layers)} layers")
            module = nn.Sequential(*layers.modules[first:last + 1]).train()
            ends = last == len(layers) - 1 and layers.loss is not None
            then = (lambda o: layers.loss(o, target)) if ends else None   # noqa: E731
            grad = None if ends else torch.randn(inputs[last + 1].shape, generator=gen, dtype=inputs[last + 1].dtype)
            fwd, bwd = time_layer(module, inputs[first], timer, first > 0, then, grad, warmup, repeats)
            for p in module.parameters():
                p.grad = None
            out.append((statistics.median(fwd), statistics.median(bwd)))
    return out
