"""The profiler's backward split: a layer's input-gradient and weight-gradient parts, as torch runs them.

torch's zero-bubble schedules run a stage's backward in two calls,
``stage_backward_input`` (``I``: the input's gradient, keeping the autograd
graph and the gradients at the weight operations' outputs) and
``stage_backward_weight`` (``W``: the weights' gradients from what ``I`` kept).
:func:`layer_split` runs exactly those two functions on one layer and measures
(docs/model.md, "Backward split"):

* ``backward_weight``: the W share of the layer's backward time: its measured
  backward times ``W / (I + W)`` (medians of the timed repeats; each repeat
  runs a fresh forward, untimed, then I and W timed apart), so that
  ``I + W`` is the profile's backward;
* ``weight_pending_bytes``: the bytes alive after ``I`` above the state before
  the backward, less the input's gradient (which the stage sends on): the
  weight operations' output gradients ``I`` keeps for ``W``, at the allocator
  level (:class:`workbench.profiles.memtrace.AllocationTracker` on CPU, the CUDA
  allocator on a GPU); 0 when ``I`` frees more than it keeps.

The first layer's input is data and takes no gradient: torch's stage 0 runs
no ``I`` and its whole backward as ``W`` (so does :func:`layer_split`).

>>> import torch
>>> from workbench.profiles.timing import Timer
>>> mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
>>> cols = layer_split(mlp, torch.ones(4, 8), Timer(torch.device("cpu")), needs_input_grad=True, then=None,
...                    grad=torch.ones(4, 4), warmup=0, repeats=2)
>>> # pending: the gradient at the first Linear's output, 4 x 16 float32 (the second's is the incoming one)
>>> cols["weight_pending_bytes"]
256.0
>>> 0 < cols["backward_weight"]
True
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch
from torch import nn

from workbench.profiles.memtrace import AllocationTracker, _Cuda
from workbench.profiles.timing import Timer, leaf

__all__ = ["layer_split", "model_split", "with_split"]


def _root(out: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """What the backward starts from: the loss of the output, or the output (a copy when it is a view: torch's
    ``stage_backward_input`` detaches the stage's output in place, which a view refuses)."""
    root = then(out) if then is not None else out
    return root.clone() if root._is_view() else root


def _halves(mod: nn.Module, x: torch.Tensor, needs_input_grad: bool,
            then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None,
            timer: Timer) -> tuple[float, float]:
    """One fresh forward, then I and W timed apart (seconds)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    params = [p for p in mod.parameters() if p.requires_grad]
    inp = leaf(x, needs_input_grad)
    root = _root(mod(inp), then)
    if not root.requires_grad:
        return 0.0, 0.0
    if not inp.requires_grad:             # torch's stage 0: no I, the whole backward in W
        _, t = timer.run(lambda: torch.autograd.backward(root, grad))
        return 0.0, t
    if not params:                        # no weights: the whole backward is the input's gradient
        _, t = timer.run(lambda: torch.autograd.backward(root, grad))
        return t, 0.0
    (_, groups), ti = timer.run(lambda: stage_backward_input([root], None if grad is None else [grad], [inp],
                                                             iter(params)))
    _, tw = timer.run(lambda: stage_backward_weight(iter(params), groups))
    return ti, tw


def _pending(mod: nn.Module, x: torch.Tensor, needs_input_grad: bool,
             then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None) -> float:
    """Bytes alive after I above the state before the backward, less the input's gradient (>= 0)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    params = [p for p in mod.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)             # resident gradient buffers, as the memory model assumes
    inp = leaf(x, needs_input_grad)
    if not inp.requires_grad or not params:
        return 0.0
    known = [inp, *params, *mod.buffers(), *(p.grad for p in params), grad]
    tracker: Any = _Cuda(inp.device) if inp.device.type == "cuda" else AllocationTracker(known)
    with tracker:
        root = _root(mod(inp), then)
        if not root.requires_grad:
            return 0.0
        before = tracker.current
        _, groups = stage_backward_input([root], None if grad is None else [grad], [inp], iter(params))
        after = tracker.current
        sent = inp.grad.untyped_storage().nbytes() if inp.grad is not None else 0
        stage_backward_weight(iter(params), groups)
    for p in params:
        p.grad = None
    return float(max(after - before - sent, 0))


def layer_split(mod: nn.Module, x: torch.Tensor, timer: Timer, *, needs_input_grad: bool,
                then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None, warmup: int,
                repeats: int) -> dict[str, float]:
    """The layer's ``backward_weight`` (seconds, the W share of a backward of 1 s: scale by the layer's
    backward) and ``weight_pending_bytes`` (see the module docstring); empty when torch's split functions
    refuse the layer (the profile then estimates its split)."""
    halves = []
    for r in range(warmup + repeats):
        for p in mod.parameters():
            p.grad = None
        timer.sync()
        try:
            got = _halves(mod, x, needs_input_grad, then, grad, timer)
        except RuntimeError:          # torch's split refuses this layer: leave it to the estimate
            return {}
        if r >= warmup:
            halves.append(got)
    ti = statistics.median(h[0] for h in halves)
    tw = statistics.median(h[1] for h in halves)
    share = tw / (ti + tw) if ti + tw > 0 else 0.0
    for p in mod.parameters():
        p.grad = None
    return {"backward_weight": share, "weight_pending_bytes": _pending(mod, x, needs_input_grad, then, grad)}


def model_split(model: nn.Module, example_inputs: Any, loss: Callable | None = None, target: Any = None, *,
                warmup: int = 1, repeats: int = 5, threads: int | None = 1, grad_seed: int = 0
                ) -> list[dict[str, float]]:
    """:func:`layer_split` of every layer of ``model`` (found as the profiler finds them, the loss in the last
    layer), in chain order, on CPU: the columns a profile of the model would get, without timing the rest."""
    from workbench.profiles.discover import discover_layers
    from workbench.profiles.timing import cpu_threads

    found = discover_layers(model, example_inputs, loss, target)
    timer, gen = Timer(torch.device("cpu")), torch.Generator(device="cpu").manual_seed(grad_seed)
    out, x = [], found.input
    with cpu_threads(torch.device("cpu"), threads):
        for i, mod in enumerate(found.modules):
            mod.train()
            last = found.loss is not None and i == len(found.modules) - 1
            then = (lambda o: found.loss(o, target)) if last else None  # type: ignore[misc]
            with torch.no_grad():
                y = mod(x)
            grad = None if last else torch.randn(y.shape, generator=gen, dtype=y.dtype)
            out.append(layer_split(mod, x, timer, needs_input_grad=i > 0, then=then, grad=grad, warmup=warmup,
                                   repeats=repeats))
            x = y.detach()
    return out


def with_split(chain, columns: list[dict[str, float]], how: str):
    """``chain`` with each layer's backward split from ``columns`` (:func:`model_split`: the W share is applied
    to the layer's own backward time, which stays as it is) and the metadata ``backward_split`` set to ``how``."""
    import dataclasses

    if len(columns) != len(chain):
        raise ValueError(f"{len(columns)} layers measured for a profile of {len(chain)}")
    layers = tuple(dataclasses.replace(l, backward_weight=c["backward_weight"] * l.backward,
                                       weight_pending_bytes=c["weight_pending_bytes"]) if c else l
                   for l, c in zip(chain.layers, columns))
    return dataclasses.replace(chain, layers=layers, meta={**chain.meta, "backward_split": how})
