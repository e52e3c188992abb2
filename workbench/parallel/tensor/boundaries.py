"""The chain's boundaries under tensor parallelism: each rank sends its local tensor, whatever the layers pass.

Sharded by Megatron's plan without sequence parallelism, every layer takes and returns a plain tensor (the
hidden state is whole on every rank). With sequence parallelism, or a vocabulary-parallel loss, the layers
of a Hugging Face model pass ``DTensor``\\ s: the embedding's output must keep its global shape, since the
model reads the sequence length from it (position ids, the causal mask). A chain boundary holds what a rank
holds, so :func:`local_chain` wraps each layer that receives or returns a ``DTensor`` in a
:class:`LocalView`: it takes the rank's local tensor and rebuilds the ``DTensor`` the layer expects
(``DTensor.from_local`` with the placements seen on the example batch: a view, no copy, no collective) and
hands on its output's local tensor (``to_local``). A stage boundary in a pipeline of such layers moves
``1 / tp`` of the hidden state, as Megatron's sequence-parallel pipeline sends it. The loss of a
vocabulary-parallel head gets its logits back as the ``DTensor`` torch's ``loss_parallel`` works on
(:class:`LocalLoss`).

>>> import torch
>>> from torch.distributed.tensor import DTensor, Shard
>>> from workbench.parallel.tensor.mesh import tp_mesh
>>> with tp_mesh(2) as mesh:
...     view = LocalView(torch.nn.Identity(), mesh, (Shard(1),))
...     tuple(view(torch.ones(2, 3, 4)).shape)          # the local shard in, the local shard out
(2, 3, 4)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["LocalView", "LocalLoss", "local_chain"]


class LocalView(nn.Module):
    """``layer`` on the rank's local tensor: rebuilt as a ``DTensor`` of ``placements`` on the way in (None:
    passed as it is), its output's local tensor on the way out."""

    def __init__(self, layer: nn.Module, mesh: Any, placements: Sequence[Any] | None) -> None:
        super().__init__()
        self.layer = layer
        self.mesh = mesh
        self.placements = None if placements is None else tuple(placements)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.placements is not None and not isinstance(x, DTensor):
            x = DTensor.from_local(x, self.mesh, self.placements, run_check=False)
        y = self.layer(x)
        return y.to_local() if isinstance(y, DTensor) else y


class LocalLoss:
    """The chain's loss of the rank's local logits, handed to ``loss`` as the ``DTensor`` of ``placements``."""

    def __init__(self, loss: Callable[[Any, Any], torch.Tensor], mesh: Any, placements: Sequence[Any]) -> None:
        self.loss, self.mesh, self.placements = loss, mesh, tuple(placements)

    def __call__(self, out: torch.Tensor, target: Any) -> torch.Tensor:
        if not isinstance(out, DTensor):
            out = DTensor.from_local(out, self.mesh, self.placements, run_check=False)
        got = self.loss(out, target)
        return got.full_tensor() if isinstance(got, DTensor) else got


def local_chain(modules: Sequence[nn.Module], x: torch.Tensor, mesh: Any,
                loss: Callable | None) -> tuple[list[nn.Module], Callable | None]:
    """``modules`` (a chain's layers, run in order from ``x``) with a :class:`LocalView` on each that receives
    or returns a ``DTensor``, and the loss (a :class:`LocalLoss` when the last layer returns one)."""
    out: list[nn.Module] = []
    h: Any = x
    with torch.no_grad():
        for m in modules:
            placements = h.placements if isinstance(h, DTensor) else None
            y = m(h)
            out.append(LocalView(m, mesh, placements) if placements is not None or isinstance(y, DTensor) else m)
            h = y
    if isinstance(h, DTensor) and loss is not None:
        loss = LocalLoss(loss, mesh, h.placements)
    return out, loss
