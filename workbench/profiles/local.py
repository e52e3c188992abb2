"""Tensors as one rank holds them: a distributed tensor (torch's ``DTensor``) is its local shard.

Under tensor parallelism (:mod:`workbench.parallel.tensor`) a layer's parameters, and some of its
activations, are ``DTensor``\\ s: wrapper subclasses whose ``shape`` is the global one and whose memory is
the local shard they wrap. The profiler measures what a rank holds, so it counts a wrapper subclass by the
plain tensors it wraps (:func:`local_parts`, torch's ``__tensor_flatten__``, as torch's ``MemTracker``
does), and its dispatch modes (the allocation tracker, the roofline's work counter) let the subclass run
first (:func:`defer_to_subclass`) so that they see the operations it runs on its local tensors; the
shape probes it runs on the ``meta`` device (its sharding propagation) allocate and compute nothing
(:func:`on_meta`). A plain tensor (a fake one included) is its own local part: nothing changes for a
profile without tensor parallelism.

>>> import torch
>>> t = torch.zeros(3, 4)
>>> [p is t for p in local_parts(t)], local_bytes(t), defer_to_subclass((torch.Tensor,))
([True], 48, False)
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass, is_traceable_wrapper_subclass_type

__all__ = ["local_parts", "local_bytes", "tensor_bytes", "parameter_bytes", "storage_keys", "defer_to_subclass",
           "on_meta"]


def local_parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors ``t`` holds: ``t`` itself, or a wrapper subclass's inner tensors, recursively."""
    out: list[torch.Tensor] = []
    todo = [t]
    while todo:
        x = todo.pop()
        if is_traceable_wrapper_subclass(x):
            names, _ = x.__tensor_flatten__()
            todo.extend(v for v in (getattr(x, n) for n in names) if isinstance(v, torch.Tensor))  # not the mesh
        else:
            out.append(x)
    return out


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of the elements this rank holds of ``t`` (a ``DTensor``: its local shard's)."""
    return sum(p.numel() * p.element_size() for p in local_parts(t))


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements this rank holds (not of its storage; a DTensor: its local shard).

    >>> tensor_bytes(torch.zeros(3, 4))
    48
    """
    return local_bytes(t)


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters (each shared parameter once).

    >>> parameter_bytes(torch.nn.Linear(3, 2))
    32
    """
    return sum(tensor_bytes(p) for p in module.parameters())


def storage_keys(t: torch.Tensor) -> list[tuple[str, int]]:
    """The identities of the storages ``t`` holds (the same for every tensor viewing them; a fake tensor's
    storage has one too; a DTensor's are its local shard's)."""
    return [(str(p.device), p.untyped_storage()._cdata) for p in local_parts(t)]


def defer_to_subclass(types: Iterable[type]) -> bool:
    """Whether a dispatch mode should return ``NotImplemented`` for an operation on these types: one of them is
    a wrapper subclass (a ``DTensor``), which then runs the operation on its local tensors, seen by the mode."""
    return any(is_traceable_wrapper_subclass_type(t) for t in types)


def on_meta(t: torch.Tensor) -> bool:
    """A tensor of the ``meta`` device: shapes only, the probes a ``DTensor`` runs to propagate its sharding."""
    return t.device.type == "meta"
