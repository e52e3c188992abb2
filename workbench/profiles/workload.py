"""What a run trains: a model, its mini-batches and its loss, buildable in any process.

A :class:`Workload` is picklable (it crosses process boundaries): it holds
functions, not models. Each rank calls :meth:`Workload.layers` to build the
whole model and find its layers (:func:`~workbench.profiles.discover.discover_layers`);
the reference computes with :meth:`Workload.build` and the same batches.

* :meth:`Workload.zoo`: a zoo model (``nn.Sequential``), a fresh batch per
  mini-batch (seeded by its index);
* :meth:`Workload.module`: ``--module FILE.py:FUNC`` (:mod:`~workbench.profiles.usermodel`);
  every mini-batch is the example batch ``FUNC`` returned, in tensors of its own (a copy per call).

>>> wl = Workload.zoo("mlp", batch_size=4)
>>> tuple(wl.batch(0)[0].shape), wl.layers().names[:2]
((4, 32), ('fc1', 'relu1'))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["Workload", "model_loss"]


def _zoo_build(name: str, seed: int, config: dict, dtype: str = "float32") -> nn.Sequential:
    from workbench.profiles.zoo import build_model

    return build_model(name, seed=seed, dtype=dtype, **config)


def _zoo_batch(name: str, batch_size: int, seed: int, config: dict, i: int, dtype: str = "float32"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    from workbench.profiles.zoo import sample_batch

    return sample_batch(name, batch_size, seed=seed * 100003 + i + 1, dtype=dtype, **config)


def _zoo_loss(name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    from workbench.profiles.zoo import loss_fn

    return loss_fn(name)(out, target)


def _user_build(spec: str, seed: int) -> nn.Module:
    from workbench.profiles.usermodel import load_user_model

    return load_user_model(spec, seed).model


_USER_BATCHES: dict[tuple[str, int], tuple[Any, Any, Callable]] = {}


def _user_example(spec: str, seed: int) -> tuple[Any, Any, Callable]:
    """(inputs, targets, loss) of ``FUNC()``, once per process."""
    if (spec, seed) not in _USER_BATCHES:
        from workbench.profiles.usermodel import load_user_model

        um = load_user_model(spec, seed)
        _USER_BATCHES[(spec, seed)] = (um.inputs, um.targets, um.loss)
    return _USER_BATCHES[(spec, seed)]


def _user_batch(spec: str, seed: int, i: int) -> tuple[Any, Any]:
    """The example batch in tensors of its own: as a data loader hands out every mini-batch, so that a rank
    holding several mini-batches in flight holds their inputs apart (docs/model.md, "Memory")."""
    from torch.utils._pytree import tree_map_only

    inputs, targets, _ = _user_example(spec, seed)
    return tree_map_only(torch.Tensor, torch.clone, (inputs, targets))


def _user_loss(spec: str, seed: int, out: Any, target: Any) -> torch.Tensor:
    return _user_example(spec, seed)[2](out, target)


def model_loss(workload: "Workload", model: nn.Module, inputs: Any, target: Any) -> torch.Tensor:
    """The loss of the whole model on ``inputs`` (a tensor, a tuple or a dict, as ``model`` takes them)."""
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    else:
        out = model(inputs)
    return workload.loss(out, target)


@dataclass
class Workload:
    """What to train: ``build() -> nn.Module`` (the whole model), ``batch(i) -> (inputs, target)`` for
    mini-batch ``i`` (``inputs`` as the model takes them), ``loss(model_output, target) -> scalar``.
    All three must be picklable (module-level functions or ``functools.partial`` of them). ``dtype``
    names the precision ``build`` and ``batch`` produce (a record: it is theirs to honour); ``source``
    the ``FILE.py:FUNC`` the model came from (None for a zoo model); ``notes`` what the workbench changed in
    the model to train it (:func:`~workbench.profiles.usermodel.for_training`)."""

    build: Callable[[], nn.Module]
    batch: Callable[[int], tuple[Any, Any]]
    loss: Callable[[Any, Any], torch.Tensor]
    name: str = "model"
    batch_size: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    source: str | None = None
    notes: tuple[str, ...] = ()
    split_at: tuple[str, ...] = ()

    def layers(self):
        """The model built afresh, as a chain (:class:`~workbench.profiles.discover.Layers`), cut before the
        modules ``split_at`` names when it names any (``--split-at``, :mod:`workbench.profiles.cuts`)."""
        from workbench.profiles.discover import discover_layers

        inputs, target = self.batch(0)
        return discover_layers(self.build(), inputs, self.loss, target, split_at=self.split_at or None)

    @classmethod
    def zoo(cls, name: str, batch_size: int, seed: int = 0, dtype: str | torch.dtype | None = None,
            **config: Any) -> "Workload":
        """A zoo model (:mod:`workbench.profiles.zoo`) with its sample batches and loss, in ``dtype``
        (default float32; ``"bfloat16"``: parameters, buffers and floating inputs in bf16).

        >>> wl = Workload.zoo("mlp", 4, dtype="bf16")
        >>> wl.dtype, wl.batch(0)[0].dtype, next(wl.build().parameters()).dtype
        ('bfloat16', torch.bfloat16, torch.bfloat16)
        """
        from workbench.profiles.zoo import dtype_name

        dt = dtype_name(dtype)
        return cls(partial(_zoo_build, name, seed, config, dt), partial(_zoo_batch, name, batch_size, seed, config,
                                                                         dtype=dt),
                   partial(_zoo_loss, name), name=name, batch_size=batch_size, config=dict(config), dtype=dt)

    @classmethod
    def module(cls, spec: str, seed: int = 0, split_at: str | tuple[str, ...] | None = None) -> "Workload":
        """``FILE.py:FUNC`` (see :mod:`~workbench.profiles.usermodel`); every mini-batch is ``FUNC``'s batch (a copy);
        ``split_at``: the modules to cut before (``"a,b"`` as a profile's metadata records them, or a tuple)."""
        from workbench.profiles.cuts import parse_split_at
        from workbench.profiles.usermodel import load_user_model
        from workbench.profiles.wrappers import tensor_leaves
        from workbench.profiles.zoo import dtype_name

        um = load_user_model(spec, seed)
        x = tensor_leaves(um.inputs)
        dtype = next((p.dtype for p in um.model.parameters()), torch.float32)
        return cls(partial(_user_build, spec, seed), partial(_user_batch, spec, seed), partial(_user_loss, spec, seed),
                   name=um.name, batch_size=int(x[0].shape[0]) if x and x[0].dim() else None,
                   dtype=dtype_name(dtype), source=spec, notes=um.notes, split_at=parse_split_at(split_at or None))
