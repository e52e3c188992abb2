"""Wrappers that make any module's pieces one-tensor-in, one-tensor-out layers (used by :mod:`.discover`).

* :class:`RecordedCall`: a module called as it was during one recorded forward, its other
  arguments constants (buffers, so they move and cast with the layer), the layer's tensor in the
  one slot where the recorded call had the hidden state; it returns one tensor of the output;
* :class:`Prologue`: the model's own forward on a pruned copy of the model (:func:`prune`),
  stopped at the first block (:class:`Stop`): what runs before the blocks, as one layer;
* :class:`RebuiltLoss`: the user's ``loss(model_output, target)`` of the last layer's tensor, the
  model's output structure rebuilt around it;
* :func:`pack` and :func:`unpack`: several tensors crossing one layer boundary as one flat tensor.

>>> import torch
>>> lin = torch.nn.Linear(3, 2)
>>> call = RecordedCall(lin, (Slot(),), {})
>>> call(torch.zeros(4, 3)).shape
torch.Size([4, 2])
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import nn

__all__ = ["DiscoveryError", "ModelFailure", "model_call", "Slot", "RecordedCall", "Stop", "Absent", "Prologue",
           "RebuiltLoss", "prune", "tensor_leaves", "describe", "pack", "unpack", "check_scalar_loss"]


class DiscoveryError(ValueError):
    """The model cannot be cut into a chain; the message says which module and what it did."""


class ModelFailure(Exception):
    """The model's own forward, or the loss of its own output, raised on the example batch (its cause):
    the user's code failed, not discovery. The message says which of the two."""


def model_call(fn: Callable[[Any], Any], arg: Any, failure: str | None) -> Any:
    """``fn(arg)``; with ``failure``, what it raises becomes a :class:`ModelFailure` saying so (the model's own
    code failed, as a bare ``nn.Sequential`` whose sizes do not match does), except an operation fake tensors
    cannot run, which :mod:`workbench.profiles.fake` words itself.

    >>> model_call(nn.Linear(2, 3), torch.zeros(1, 4), "layer 0 (Linear)'s forward")
    Traceback (most recent call last):
    ...
    workbench.profiles.wrappers.ModelFailure: layer 0 (Linear)'s forward
    """
    if failure is None:
        return fn(arg)
    from torch._subclasses import fake_tensor as ft

    try:
        return fn(arg)
    except (ft.DataDependentOutputException, ft.DynamicOutputShapeException, ft.UnsupportedOperatorException):
        raise
    except Exception as e:  # noqa: BLE001 - passed on as the cause
        raise ModelFailure(failure) from e


def tensor_leaves(x: Any) -> list[torch.Tensor]:
    """The tensors in a nested structure, in order.

    >>> len(tensor_leaves((torch.zeros(1), {"a": torch.ones(2)}, 3)))
    2
    """
    return [l for l in pytree.tree_leaves(x) if isinstance(l, torch.Tensor)]


def describe(x: Any) -> str:
    """A value as a message names it.

    >>> describe(torch.zeros(2, 3, dtype=torch.int64))
    'a int64 tensor of shape (2, 3)'
    """
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).replace('torch.', '')} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def check_scalar_loss(value: Any, where: str) -> None:
    """Refuse (ValueError, one line) a loss that is not one floating value: training needs a scalar to start
    the backward from (torch's "grad can be implicitly created only for scalar outputs").

    >>> check_scalar_loss(torch.ones(4, 2), "on the model's output")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the loss returned a float32 tensor of shape (4, 2) on the model's output, not one value: reduce it ...
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return
    raise ValueError(f"the loss returned {describe(value)} {where}, not one value: reduce it (.mean() or .sum()) so "
                     "that training has a scalar to start the backward from")


class Slot:
    """Where the wrapper's tensor goes in a recorded call (a pytree leaf)."""

    def __repr__(self) -> str:
        return "<input>"


class _Const:
    """Marks where a recorded call had a tensor, kept as a buffer. A class, not an ``object()`` sentinel:
    ``copy.deepcopy`` (the runtime copies layers to the meta device) makes a new instance of either, and only
    ``isinstance`` still recognises the copy."""

    def __repr__(self) -> str:
        return "<constant>"


class RecordedCall(nn.Module):
    """Calls ``target`` with a recorded (args, kwargs) whose one ``Slot`` leaf is the input; the other
    tensors are constant buffers (moved and cast with the module). Returns the output's leaf ``pick``."""

    def __init__(self, target: nn.Module, args: tuple, kwargs: dict, pick: int | None = 0) -> None:
        super().__init__()
        self.target = target
        leaves, self._spec = pytree.tree_flatten((args, kwargs))
        self._kinds: list[Any] = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                self.register_buffer(f"_const{i}", leaf.detach(), persistent=False)
                self._kinds.append(_Const())
            else:
                self._kinds.append(leaf)
        self._pick = pick

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leaves = [x if isinstance(k, Slot) else (getattr(self, f"_const{i}") if isinstance(k, _Const) else k)
                  for i, k in enumerate(self._kinds)]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out = self.target(*args, **kwargs)
        return out if self._pick is None else tensor_leaves(out)[self._pick]


class _Reached(Exception):
    """Raised by :class:`Stop` to end the prologue's forward at the first block."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("first block reached")
        self.hidden = hidden


class Stop(nn.Module):
    """Stands for the blocks in the prologue's copy of the model: ends its forward with the hidden state."""

    def __init__(self, where: int | str) -> None:
        super().__init__()
        self.where = where

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise _Reached(kwargs[self.where] if isinstance(self.where, str) else args[self.where])


class Absent(nn.Module):
    """A module the prologue does not run (it lives in later layers); calling it is an error."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise DiscoveryError(f"the prologue (the model's forward before its first block) called {self.path!r}, "
                             "which it did not call while the layers were discovered")


class Prologue(nn.Module):
    """The model's own forward on a pruned copy of it, ended at the first block (see :class:`Stop`)."""

    def __init__(self, skeleton: nn.Module, args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.call = RecordedCall(skeleton, args, kwargs, pick=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            self.call(x)
        except _Reached as r:
            return r.hidden
        raise DiscoveryError("the prologue's forward returned without reaching the first block")


def prune(model: nn.Module, keep: set[str], block_path: str, stop: nn.Module) -> nn.Module:
    """A copy of ``model`` sharing the modules in ``keep`` (and their parameters), the block list
    replaced by ``stop`` modules and every other module by :class:`Absent`."""
    ancestors = {block_path.rsplit(".", i)[0] for i in range(1, block_path.count(".") + 1)} | {""}

    def rebuild(m: nn.Module, path: str) -> nn.Module:
        if path == block_path:
            return nn.ModuleList([stop] * len(m))
        if path in keep and path not in ancestors:
            return m
        if path not in ancestors:
            return Absent(path)
        new = copy.copy(m)
        new.__dict__ = {k: (v.copy() if isinstance(v, dict) else v) for k, v in m.__dict__.items()}
        new._modules = {n: (rebuild(c, f"{path}.{n}" if path else n) if c is not None else None)
                        for n, c in m._modules.items()}
        return new

    return rebuild(model, "")


def pack(*tensors: torch.Tensor) -> torch.Tensor:
    """Several tensors of one dtype as one flat tensor (differentiable: the gradient splits back).

    >>> pack(torch.ones(2, 2), torch.zeros(3)).tolist()
    [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    """
    return torch.cat([t.reshape(-1) for t in tensors])


def unpack(flat: torch.Tensor, shapes: tuple[tuple[int, ...], ...]) -> tuple[torch.Tensor, ...]:
    """The tensors :func:`pack` flattened, as views of ``flat``.

    >>> [tuple(t.shape) for t in unpack(torch.arange(7.0), ((2, 2), (3,)))]
    [(2, 2), (3,)]
    """
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[at:at + n].view(shape))
        at += n
    return tuple(out)


class RebuiltLoss:
    """``loss(output, target)`` where ``output`` is the model's own output structure (a dict, a tuple, a
    ``ModelOutput``) rebuilt around the last layer's tensor: the model's tensors at ``slots`` (the one
    tensor, or the packed ones unpacked: ``shapes``), its other leaves as the model returned them, and
    ``None`` for a tensor the chain does not carry. Built by :meth:`around`.

    >>> rl = RebuiltLoss.around(lambda out, y: out["logits"].sum(), {"logits": torch.ones(2), "n": 3}, [0])
    >>> float(rl(torch.ones(2), None)), rl.given()
    (2.0, "a dict with ['logits'] from the last layer, ['n'] as the model returned it")
    """

    def __init__(self, loss: Callable, spec: Any, template: list[Any], slots: list[int],
                 shapes: tuple[tuple[int, ...], ...] | None, paths: list[str], kind: str) -> None:
        self.loss, self.spec, self.template, self.slots, self.shapes = loss, spec, template, slots, shapes
        self.paths, self.kind = paths, kind

    @classmethod
    def around(cls, loss: Callable, output: Any, slots: list[int], packed: bool = False) -> "RebuiltLoss":
        """The loss of ``output``'s leaves at ``slots`` (tensors; ``packed``: all of them in one flat tensor)."""
        keyed, spec = pytree.tree_flatten_with_path(output)
        leaves = [l for _, l in keyed]
        template = [None if isinstance(l, torch.Tensor) else l for l in leaves]
        shapes = tuple(tuple(leaves[i].shape) for i in slots) if packed else None
        return cls(loss, spec, template, list(slots), shapes, [pytree.keystr(k) for k, _ in keyed],
                   type(output).__name__)

    def __call__(self, t: torch.Tensor, target: Any) -> torch.Tensor:
        leaves = list(self.template)
        for i, v in zip(self.slots, [t] if self.shapes is None else unpack(t, self.shapes)):
            leaves[i] = v
        return self.loss(pytree.tree_unflatten(leaves, self.spec), target)

    def carried(self) -> str:
        """The leaves the chain carries to the loss, as the model's output names them."""
        return " and ".join(self.paths[i] for i in self.slots)

    def given(self) -> str:
        """What the loss receives, in words: which leaves come from the last layer, which are None."""
        filled = [self.paths[i] for i in self.slots]
        empty = [p for i, p in enumerate(self.paths) if i not in self.slots and self.template[i] is None]
        kept = [p for i, p in enumerate(self.paths) if i not in self.slots and self.template[i] is not None]
        text = f"a {self.kind} with {', '.join(filled)} from the last layer"
        if kept:
            text += f", {', '.join(kept)} as the model returned it"
        return text + (f", {', '.join(empty)} None" if empty else "")
