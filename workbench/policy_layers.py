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

from typing import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["Recomputed", "Offloaded", "with_policies"]


class Recomputed(nn.Module):
    """``layer`` with activation checkpointing: only its input is kept for the backward."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.layer, x, use_reentrant=False)


class Offloaded(nn.Module):
    """``layer`` whose saved tensors (parameters excepted) leave the device after they are saved
    and come back when the backward needs them."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {p.untyped_storage().data_ptr() for p in self.layer.parameters()}

        def pack(t: torch.Tensor):
            if t.untyped_storage().data_ptr() in params:     # a parameter (or a view of one) stays
                return t
            if t.device.type == "cuda":
                return ("host", t.device, t.to("cpu", non_blocking=False))
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().copy()   # any dtype, as bytes
            return ("host", t.device, raw, t.dtype, tuple(t.shape))

        def unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            if packed[1].type == "cuda":
                return packed[2].to(packed[1])
            _, _, raw, dtype, shape = packed
            return torch.from_numpy(raw).clone().view(dtype).reshape(shape)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return self.layer(x)


def with_policies(model: nn.Sequential, policies: Sequence[str]) -> nn.Sequential:
    """``model`` with each layer wrapped by its policy (``keep`` layers unchanged; same parameters)."""
    layers = list(model.children())
    if len(layers) != len(policies):
        raise ValueError(f"{len(policies)} policies for a model of {len(layers)} layers")
    wrap = {"keep": lambda m: m, "recompute": Recomputed, "offload": Offloaded}
    return nn.Sequential(*[wrap[p](m) for m, p in zip(layers, policies)])
