"""What discovery finds: a model as a chain of layers (:class:`Layers`), its shared parameters (:class:`Tie`),
and the small helpers every route of :mod:`workbench.profiles.discover` uses to build one.

>>> from torch import nn
>>> lin = nn.Linear(2, 2, bias=False)
>>> found = finish_layers(None, [lin, nn.Sequential(lin)], ["a", "b"], torch.zeros(1, 2), "list", None)
>>> found.names, [t.owner for t in found.tied]
(('a', 'b'), ['a'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn

from workbench.profiles.local import local_bytes
from workbench.profiles.wrappers import DiscoveryError, Slot, describe, tensor_leaves

__all__ = ["Tie", "Layers", "find_ties", "is_fake_tensor", "same_tensor", "split_inputs", "with_slot", "chain_input",
           "parameter_names", "finish_layers"]


@dataclass(frozen=True)
class Tie:
    """A parameter used by several layers: ``owner`` (the first of ``layers``) counts its ``bytes``."""

    owner: str
    layers: tuple[str, ...]
    bytes: int
    parameter: str

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "layers": list(self.layers), "bytes": self.bytes, "parameter": self.parameter}


@dataclass(frozen=True)
class Layers:
    """A model as a chain: ``modules[i]`` (named ``names[i]``) maps one tensor to one tensor.

    ``input`` is the first layer's input (from the example batch), ``loss(output, target)`` the
    loss of the last layer's output (None without one), ``parameter_names[i]`` maps each of
    layer ``i``'s own parameter names to the model's name for it (``model.named_parameters()``),
    ``tied`` the shared parameters, ``how`` the route that found the layers.
    """

    modules: tuple[nn.Module, ...]
    names: tuple[str, ...]
    input: torch.Tensor
    how: str
    parameter_names: tuple[dict[str, str], ...]
    tied: tuple[Tie, ...] = ()
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.modules)


def is_fake_tensor(t: Any) -> bool:
    """A tensor of ``FakeTensorMode`` (a fake profile, :mod:`workbench.profiles.fake`): a shape, no values."""
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(t, torch.Tensor) and is_fake(t)


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor, or equal ones; fake tensors have no values: the same storage viewed the same way
    stands for equal (a shape alone would take Gemma's soft-capped logits for its head's output).

    >>> x = torch.ones(2, 3)
    >>> same_tensor(x, x[:, :]), same_tensor(x, x.clone()), same_tensor(x, x * 2)
    (True, True, False)
    """
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if is_fake_tensor(a) or is_fake_tensor(b):
        return (is_fake_tensor(a) and is_fake_tensor(b) and a.untyped_storage()._cdata == b.untyped_storage()._cdata
                and a.stride() == b.stride() and a.storage_offset() == b.storage_offset())
    return bool(torch.equal(a.detach(), b.detach()))


def split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise DiscoveryError(f"example inputs must be a tensor, a tuple or a dict of them, got {describe(example_inputs)}")


def with_slot(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    """(args, kwargs) with the leaf that *is* ``x`` replaced by a slot."""
    slot = Slot()
    leaves, spec = pytree.tree_flatten((args, kwargs))
    hits = [i for i, l in enumerate(leaves) if l is x]
    if len(hits) != 1:
        raise DiscoveryError(f"the chain's input appears {len(hits)} times in a recorded call (expected once)")
    leaves[hits[0]] = slot
    return pytree.tree_unflatten(leaves, spec)


def chain_input(args: tuple, kwargs: dict) -> torch.Tensor:
    leaves = tensor_leaves((args, kwargs))
    if not leaves:
        raise DiscoveryError("the example inputs hold no tensor")
    return leaves[0]


def find_ties(modules: Sequence[nn.Module], names: Sequence[str], model: nn.Module | None = None) -> tuple[Tie, ...]:
    """Parameters used by more than one layer (by identity), in order of their owner.

    >>> lin = nn.Linear(2, 2, bias=False)
    >>> [t.to_dict() for t in find_ties([lin, nn.Sequential(lin)], ["a", "b"])]
    [{'owner': 'a', 'layers': ['a', 'b'], 'bytes': 16, 'parameter': 'a.weight'}]
    """
    canonical = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    users: dict[int, list[int]] = {}
    first: dict[int, tuple[str, torch.Tensor]] = {}
    for i, m in enumerate(modules):
        for n, p in m.named_parameters():
            users.setdefault(id(p), [])
            if i not in users[id(p)]:
                users[id(p)].append(i)
            first.setdefault(id(p), (canonical.get(id(p), f"{names[i]}.{n}"), p))
    ties: list[Tie] = []
    for key, idx in users.items():
        if len(idx) < 2:
            continue
        name, p = first[key]
        ties.append(Tie(names[idx[0]], tuple(names[i] for i in idx), local_bytes(p), name))
    return tuple(ties)


def parameter_names(modules: Sequence[nn.Module], names: Sequence[str], model: nn.Module | None) -> tuple[dict, ...]:
    canonical = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    return tuple({n: canonical.get(id(p), f"{names[i]}.{n}") for n, p in m.named_parameters()}
                 for i, m in enumerate(modules))


def finish_layers(model: nn.Module | None, modules: list[nn.Module], names: list[str], x: torch.Tensor, how: str,
            loss: Callable | None) -> Layers:
    if len(set(names)) != len(names):
        raise DiscoveryError(f"layer names are not unique: {names}")
    return Layers(tuple(modules), tuple(names), x, how, parameter_names(modules, names, model),
                  find_ties(modules, names, model), loss)
