"""Bring your own model: ``--module FILE.py:FUNC``, where ``FUNC()`` builds the model and one batch.

``FUNC()`` returns ``(model, example_inputs, example_targets, loss_fn)``:
any ``torch.nn.Module``, its inputs (a tensor, a tuple or a dict of them, as
``model(*inputs)`` / ``model(**inputs)`` takes them), the targets, and
``loss_fn(model_output, targets) -> scalar``. The user writes no splitting
code: :func:`~workbench.profiles.discover.discover_layers` finds the layers.
Every process calls ``FUNC`` after ``torch.manual_seed(seed)`` so that all of
them build the same weights; a ``FUNC`` that draws its own randomness
otherwise (a fresh generator, a clock) makes the ranks disagree.

A Hugging Face model built with ``use_cache`` on (GPT-2's and Llama's default) is
switched to ``use_cache=False`` for training: a key/value cache serves
generation, and in training it would be state handed from block to block.
:attr:`UserModel.notes` says so, and the commands print it.

>>> import pathlib, tempfile
>>> src = pathlib.Path(tempfile.mkdtemp()) / "net.py"
>>> _ = src.write_text("import torch\\n"
...     "def make():\\n"
...     "    return torch.nn.Linear(4, 2), torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), "
...     "torch.nn.functional.cross_entropy\\n")
>>> um = load_user_model(f"{src}:make")
>>> type(um.model).__name__, um.name
('Linear', 'net:make')
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["UserModel", "load_user_model", "parse_spec", "for_training"]


@dataclass(frozen=True)
class UserModel:
    """What ``FUNC()`` returned, and the spec it came from."""

    spec: str
    model: nn.Module
    inputs: Any
    targets: Any
    loss: Callable[[Any, Any], torch.Tensor]
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        path, func = parse_spec(self.spec)
        return f"{Path(path).stem}:{func}"


def parse_spec(spec: str) -> tuple[str, str]:
    """``"FILE.py:FUNC"`` -> (file, function); a clear error for anything else.

    >>> parse_spec("models/gpt.py:build")
    ('models/gpt.py', 'build')
    """
    path, sep, func = str(spec).rpartition(":")
    if not sep or not path or not func or not func.isidentifier():
        raise ValueError(f"--module {spec!r}: expected FILE.py:FUNC (a Python file and a function in it)")
    return path, func


def for_training(model: nn.Module) -> tuple[str, ...]:
    """Switch off ``use_cache`` in every config ``model`` holds (a Hugging Face model's, its parts'); a note
    for each config switched.

    >>> import types
    >>> m = torch.nn.Linear(2, 2)
    >>> m.config = types.SimpleNamespace(use_cache=True)
    >>> for_training(m), m.config.use_cache
    (('Linear: config.use_cache switched off for training (a key/value cache serves generation)',), False)
    """
    notes: list[str] = []
    seen: set[int] = set()
    for path, m in model.named_modules():
        cfg = getattr(m, "config", None)
        if cfg is None or id(cfg) in seen:
            continue
        seen.add(id(cfg))
        if getattr(cfg, "use_cache", False) is True:
            cfg.use_cache = False
            notes.append(f"{type(m).__name__ if not path else path}: config.use_cache switched off for training "
                         "(a key/value cache serves generation)")
    return tuple(notes)


def _import(path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--module: no such file {path!r}")
    name = f"workbench_user_{hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"--module: cannot import {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


def load_user_model(spec: str, seed: int = 0) -> UserModel:
    """Import ``FILE.py``, call ``FUNC()`` after ``torch.manual_seed(seed)`` and check what it returned."""
    path, func = parse_spec(spec)
    module = _import(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ValueError(f"--module {spec!r}: {path} has no function {func!r}")
    torch.manual_seed(seed)
    got = fn()
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        size = f" of {len(got)}" if isinstance(got, (tuple, list)) else ""
        raise ValueError(f"--module {spec!r}: {func}() must return (model, example_inputs, example_targets, "
                         f"loss_fn), got {type(got).__name__}{size}")
    model, inputs, targets, loss = got
    if not isinstance(model, nn.Module):
        raise ValueError(f"--module {spec!r}: the model {func}() returned is a {type(model).__name__}, "
                         "not a torch.nn.Module")
    if not callable(loss):
        raise ValueError(f"--module {spec!r}: the loss_fn {func}() returned is not callable")
    notes = for_training(model)
    return UserModel(str(spec), model.train(), inputs, targets, loss, notes)
