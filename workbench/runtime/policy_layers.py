"""Layers that apply an activation policy with torch's own tools, for measuring the policies
(docs/model.md, "Activation policies"; ``benchmarks/policies.py``).

* :class:`Recomputed` runs its layer under ``torch.utils.checkpoint.checkpoint``
  (``use_reentrant=False``): autograd keeps the layer's input only and runs the
  forward again when the backward needs its saved tensors.
* :class:`Offloaded` runs its layer under ``torch.autograd.graph.saved_tensors_hooks``
  that move every saved tensor that is not a parameter off the device as it is saved
  and back when the backward unpacks it -- what ``torch.autograd.graph.save_on_cpu``
  does on a GPU (which also moves parameters: a runtime should skip them, as here).
  On CPU there is no second memory, so "host" is a NumPy copy: outside every torch
  allocator and tracker, as host memory is outside the GPU's.

:func:`with_policies` wraps the layers of an ``nn.Sequential`` (one per chain layer).

>>> import torch
>>> layer = Recomputed(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
>>> x = torch.ones(2, 4, requires_grad=True)
>>> layer(x).sum().backward()
>>> x.grad.shape
torch.Size([2, 4])
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["Recomputed", "Offloaded", "OffloadStore", "StageOffloads", "offloading", "with_policies", "with_policy"]


class Recomputed(nn.Module):
    """``layer`` with activation checkpointing: only its input is kept for the backward."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the parameters go in as inputs of the checkpointed function, so that the recomputation in the
        # backward uses the very tensors the forward used (under torch.func.functional_call, as the
        # PipeDream engine calls its stages with a weight version, they are not the module's own)
        names, tensors = zip(*self.layer.named_parameters()) if any(True for _ in self.layer.parameters()) \
            else ((), ())

        def run(inp: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self.layer, dict(zip(names, params)), (inp,))

        return checkpoint(run, x, *tensors, use_reentrant=False)


def _to_host(t: torch.Tensor):
    """A host copy of ``t`` (on CPU, NumPy bytes: outside every torch allocator and tracker)."""
    if t.device.type == "cuda":
        return ("host", t.device, t.to("cpu", non_blocking=False))
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().copy()   # any dtype, as bytes
    return ("host", t.device, raw, t.dtype, tuple(t.shape))


def _from_host(packed) -> torch.Tensor:
    if packed[1].type == "cuda":
        return packed[2].to(packed[1])
    _, _, raw, dtype, shape = packed
    return torch.from_numpy(raw).clone().view(dtype).reshape(shape)


class OffloadStore:
    """The offloaded saved tensors of one stage and one mini-batch, moved as a block: on the device
    while the stage's forward runs, on the host from the end of the forward (:meth:`move_out`) to
    the start of the backward (:meth:`move_in`), as docs/model.md ("Activation policies") schedules
    them. A runtime makes one per stage and mini-batch and runs the forward under
    :func:`offloading`.

    >>> store = OffloadStore()
    >>> h = store.pack(torch.ones(3)); store.move_out(); store.move_in()
    >>> store.unpack(h).tolist()
    [1.0, 1.0, 1.0]
    """

    def __init__(self) -> None:
        self.items: list = []
        self.out = False

    def pack(self, t: torch.Tensor) -> int:
        self.items.append(t)
        return len(self.items) - 1

    def unpack(self, handle: int) -> torch.Tensor:
        """The saved tensor, handed to autograd, which frees it once the backward has used it (as it frees a
        kept one): the store lets go of it, so a stage's offloaded bytes leave the device as its backward
        goes, not all at its end."""
        item = self.items[handle]
        self.items[handle] = None
        return _from_host(item) if isinstance(item, tuple) else item

    def move_out(self) -> None:
        self.items = [_to_host(t) if isinstance(t, torch.Tensor) else t for t in self.items]
        self.out = True

    def move_in(self) -> None:
        self.items = [_from_host(t) if isinstance(t, tuple) else t for t in self.items]
        self.out = False


_STORE: list[OffloadStore] = []


@contextmanager
def offloading(store: OffloadStore) -> Iterator[OffloadStore]:
    """While the block runs, :class:`Offloaded` layers put their saved tensors into ``store``."""
    _STORE.append(store)
    try:
        yield store
    finally:
        _STORE.pop()


class StageOffloads:
    """The offload stores of a rank's stages, one per (stage, mini-batch) in flight: their life cycle,
    the same on both engines. :meth:`forward` runs a stage's forward into a new :class:`OffloadStore`
    and moves it out as a block when the forward ends; :meth:`backward` moves it back in before the
    backward and lets it go when the backward ends. Stages outside ``stages`` keep their tensors.

    >>> offloads = StageOffloads({0})
    >>> with offloads.forward(0, 7):
    ...     y = Offloaded(nn.Linear(2, 2))(torch.ones(1, 2, requires_grad=True))
    >>> offloads.held[(0, 7)].out
    True
    >>> with offloads.backward(0, 7):
    ...     y.sum().backward()
    >>> offloads.held
    {}
    """

    def __init__(self, stages) -> None:
        self.stages = frozenset(stages)
        self.held: dict[tuple[int, int], OffloadStore] = {}

    @contextmanager
    def forward(self, stage: int, batch: int) -> Iterator[None]:
        if stage not in self.stages:
            yield
            return
        store = OffloadStore()
        with offloading(store):
            yield
        store.move_out()              # the offloaded layers' saved tensors leave as a block when the forward ends
        self.held[(stage, batch)] = store

    @contextmanager
    def backward(self, stage: int, batch: int) -> Iterator[None]:
        store = self.held.pop((stage, batch), None)
        if store is not None:         # ... and come back as a block before the backward
            store.move_in()
        try:
            yield
        finally:
            del store                 # gone with the backward's graph


class Offloaded(nn.Module):
    """``layer`` whose saved tensors (parameters excepted) leave the device and come back when the
    backward needs them: into the stage's :class:`OffloadStore` when a runtime runs it under
    :func:`offloading` (a block, moved when the stage's forward ends), else each one as it is saved."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {p.untyped_storage().data_ptr() for p in self.layer.parameters()}
        store = _STORE[-1] if _STORE else None

        def pack(t: torch.Tensor):
            if t.untyped_storage().data_ptr() in params:     # a parameter (or a view of one) stays
                return t
            return ("store", store.pack(t)) if store is not None else _to_host(t)

        def unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            if packed[0] == "store":
                return store.unpack(packed[1])
            return _from_host(packed)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return self.layer(x)


def with_policies(model: nn.Sequential, policies: Sequence[str]) -> nn.Sequential:
    """``model`` with each layer wrapped by its policy (``keep`` layers unchanged; same parameters)."""
    layers = list(model.children())
    if len(layers) != len(policies):
        raise ValueError(f"{len(policies)} policies for a model of {len(layers)} layers")
    return nn.Sequential(*[with_policy(m, p) for m, p in zip(layers, policies)])


def with_policy(module: nn.Module, policy: str) -> nn.Module:
    """``module`` as its activation policy runs it: itself (keep), :class:`Recomputed` or :class:`Offloaded`.

    >>> type(with_policy(nn.Linear(2, 2), "recompute")).__name__, type(with_policy(nn.Linear(2, 2), "keep")).__name__
    ('Recomputed', 'Linear')
    """
    return {"keep": lambda m: m, "recompute": Recomputed, "offload": Offloaded}[policy](module)
