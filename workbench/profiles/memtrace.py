"""What one layer allocates, measured at the allocator level (the profiler's memory columns).

The memory model (:mod:`workbench.model.memory`, docs/model.md "Memory") needs, per
layer, more than the bytes autograd saves: how high its forward and its
backward climb above the state they start from, whether it saves its own
input or output (so that storage shared across a layer boundary is counted
once), its gradients' bytes and its largest parameter (the optimizer step's
temporaries). :func:`layer_memory` runs the layer's forward and backward once
and reads them off:

* on a GPU, from the caching allocator (``torch.cuda.memory_allocated`` and
  ``max_memory_allocated`` after ``reset_peak_memory_stats``);
* on CPU, where the allocator keeps no statistics, from
  :class:`AllocationTracker`: a ``TorchDispatchMode`` that sees every tensor
  an operator returns and counts each new *storage* once, from its creation
  until the storage is freed (a weak reference's callback): the bytes alive
  that were created inside the measurement, and their peak.

The layer runs as in training: its input a leaf (requiring a gradient, except
for the first layer whose input is data), its parameters' gradients already
allocated (a resident accumulation buffer, as the memory model assumes, so
the backward adds into them), the incoming gradient allocated before the
backward starts (it counts in ``backward_peak_bytes``). The columns:

* ``forward_peak_bytes``: the most bytes alive during the forward that it
  allocated (its output and what it saves included);
* ``backward_peak_bytes``: the most bytes alive during the backward above the
  state before it, with the incoming gradient counted in;
* ``backward_fresh_peak_bytes``: the same when the parameters have no gradient
  yet (a second run with them set to None: the backward writes them, and
  they stay, as the first backward after torch's default ``zero_grad()``);
* ``saved_input_bytes`` / ``saved_output_bytes``: the input's (output's)
  storage if autograd saved it, else 0;
* ``grad_bytes``: bytes of the parameters that take a gradient;
* ``max_param_bytes``: the largest parameter tensor.

>>> import torch
>>> cols = layer_memory(torch.nn.ReLU(), torch.ones(4, 8), input_requires_grad=True)
>>> cols["saved_output_bytes"], cols["forward_peak_bytes"]   # ReLU saves its output: 32 float32
(128.0, 128.0)
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from workbench.profiles.local import defer_to_subclass, local_bytes, local_parts, on_meta
from workbench.profiles.recording import is_suspended

__all__ = ["AllocationTracker", "layer_memory"]

#: operations that return their input tensor itself (a functional collective's wait); under fake tensors they
#: return a new tensor, which takes over the input's bytes (:meth:`AllocationTracker._move`)
_RETURNS_INPUT = {"_c10d_functional::wait_tensor"}


class AllocationTracker(TorchDispatchMode):
    """Bytes of the storages created inside the mode that are still alive (``current``) and their
    peak (``peak``, reset by :meth:`reset_peak`). Storages of ``known`` tensors (parameters,
    inputs) are never counted, even when an operator returns a view of them.

    >>> t = AllocationTracker()
    >>> with t:
    ...     x = torch.zeros(10)          # 40 bytes
    ...     y = x + 1                     # 40 more
    ...     del x
    >>> t.current, t.peak
    (40, 80)
    """

    def __init__(self, known: Iterable[torch.Tensor | None] = ()) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._seen: dict[int, int] = {}
        for t in known:
            if t is not None:
                self._register(t, count=False)

    def _register(self, t: torch.Tensor, count: bool = True) -> None:
        for part in local_parts(t):           # a DTensor: its local shard (workbench.profiles.local)
            if not on_meta(part):             # a meta tensor allocates nothing
                self._register_storage(part, count)

    def _register_storage(self, t: torch.Tensor, count: bool) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):   # tensors without a storage
            return
        key = st._cdata
        if key in self._seen:
            return
        size = st.nbytes() if count else 0
        self._seen[key] = size
        self.current += size
        weakref.finalize(st, self._release, key)

    def _move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """``target`` is ``source`` (an operation that returns its input: a collective's wait): when it is a
        new tensor (fake tensors make one), the bytes pass to it, not counted twice."""
        try:
            src, dst = source.untyped_storage()._cdata, target.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            return
        if src != dst and src in self._seen and dst not in self._seen:
            self.current -= self._seen[src]
            self._register_storage(target, count=self._seen[src] > 0)    # an input not counted: nor is it
            self._seen[src] = 0

    def _release(self, key: int) -> None:
        self.current -= self._seen.pop(key, 0)

    def reset_peak(self) -> int:
        self.peak = self.current
        return self.current

    def carry_over(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """``target``, made while counting was suspended, takes over ``source``'s counted bytes (the reordered
        result of a collective that is its one buffer: :mod:`workbench.parallel.tensor.sequence_first`)."""
        self._move(source, target)

    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count the storages of ``tensors``, made while counting was suspended: a fused kernel's outputs
        (:mod:`workbench.profiles.fused`)."""
        for t in tensors:
            self._register(t)
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if defer_to_subclass(types):          # a DTensor runs it on its local tensors: those are seen
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if is_suspended():                    # inside a fused kernel: it adopts its outputs (workbench.profiles.fused)
            return out
        if func.name() in _RETURNS_INPUT and isinstance(out, torch.Tensor) and isinstance(args[0], torch.Tensor):
            self._move(args[0], out)
        tree_map_only(torch.Tensor, self._register, out)
        if self.current > self.peak:
            self.peak = self.current
        return out


def _storage(t: torch.Tensor) -> int:
    return local_parts(t)[0].untyped_storage()._cdata


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else sum(p.untyped_storage().nbytes() for p in local_parts(t))


class _Cuda:
    """The same two readings from the CUDA caching allocator."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> "_Cuda":
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize(self.device)

    @property
    def current(self) -> int:
        return torch.cuda.memory_allocated(self.device) - self.base

    @property
    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) - self.base

    def reset_peak(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self.current


def _run_once(module: nn.Module, inp: torch.Tensor, tracker: Any, then, gen: torch.Generator
              ) -> tuple[float, float, int, int]:
    """One forward and backward of ``module`` on ``inp`` under ``tracker``: (forward peak, backward peak above
    the state before it, saved input storage, saved output storage), with the parameters' gradients as
    the caller left them (allocated: the backward adds into them; None: it writes them)."""
    saved: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        for part in local_parts(t):
            try:
                saved.add(part.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):
                pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        tracker.reset_peak()
        start = tracker.current
        out = module(inp)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"a chain layer must return one tensor, got {type(out).__name__}")
        root = then(out) if then is not None else out
    forward_peak = tracker.peak - start
    saved_input = _nbytes(inp) if _storage(inp) in saved else 0
    saved_output = _nbytes(out) if _storage(out) in saved else 0
    grad = None
    if then is None and out.requires_grad:
        grad = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
    before = tracker.reset_peak() - _nbytes(grad)      # the incoming gradient counts in the backward
    if root.requires_grad:
        torch.autograd.backward(root, grad)
    backward_peak = max(tracker.peak - before, 0)
    del out, root, grad
    return float(forward_peak), float(backward_peak), saved_input, saved_output


def layer_memory(module: nn.Module, x: torch.Tensor, *, input_requires_grad: bool,
                 then: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 grad_seed: int = 0) -> dict[str, float]:
    """The memory columns of ``module`` run on input ``x`` (see the module docstring).

    ``then`` (a loss of the output) makes the loss part of the layer: the forward ends in it and
    the backward starts from it (no incoming gradient). The layer runs twice: with its gradients
    allocated (``backward_peak_bytes``) and with none (``backward_fresh_peak_bytes``: the backward
    writes them fresh, and they stay, as after torch's default ``zero_grad()``).
    """
    params = [p for p in module.parameters()]
    trainable = [p for p in params if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    inp = x.detach()
    if input_requires_grad and inp.is_floating_point():
        inp.requires_grad_(True)
    known = [inp, *params, *module.buffers(), *(p.grad for p in trainable)]
    cuda = inp.device.type == "cuda"
    tracker: Any = _Cuda(inp.device) if cuda else AllocationTracker(known)
    with tracker:
        fp, bp, saved_input, saved_output = _run_once(module, inp, tracker, then,
                                                       torch.Generator(device="cpu").manual_seed(grad_seed))
        for p in trainable:
            p.grad = None
        inp.grad = None
        _, fresh, _, _ = _run_once(module, inp, tracker, then, torch.Generator(device="cpu").manual_seed(grad_seed))
    for p in trainable:
        p.grad = None
    return {
        "forward_peak_bytes": fp,
        "backward_peak_bytes": bp,
        "backward_fresh_peak_bytes": fresh,
        "saved_input_bytes": float(saved_input),
        "saved_output_bytes": float(saved_output),
        "grad_bytes": float(sum(local_bytes(p) for p in trainable)),
        "max_param_bytes": float(max((local_bytes(p) for p in trainable), default=0)),
    }
