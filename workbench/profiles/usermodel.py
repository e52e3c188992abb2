"""Bring your own model: ``--module FILE.py:FUNC``, where ``FUNC()`` builds the model and one batch.

``FUNC()`` returns ``(model, example_inputs, example_targets, loss_fn)``:
any ``torch.nn.Module``, its inputs (a tensor, a tuple or a dict of them, as
``model(*inputs)`` / ``model(**inputs)`` takes them), the targets, and
``loss_fn(model_output, targets) -> scalar``. The user writes no splitting
code: :func:`~workbench.profiles.discover.discover_layers` finds the layers.
FILE's folder is importable (``import helpers`` finds ``helpers.py`` beside it).
A profile records FILE relative to its own folder (:func:`spec_relative_to`).
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
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

__all__ = ["UserModel", "UserCodeError", "load_user_model", "parse_spec", "for_training", "spec_relative_to",
           "resolve_spec", "user_failure", "user_code"]


class UserCodeError(ValueError):
    """An exception raised in the user's ``--module`` code, as one line: their frame (file:line) and message."""


_PYTHON = os.path.dirname(os.__file__)
_TORCH = os.path.dirname(torch.__file__)
_WORKBENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _frame_kind(filename: str) -> str:
    """``"pass"`` (torch, Python's own library, frozen import machinery: look further out), ``"ours"`` (the
    workbench) or ``"user"`` (the user's file and the libraries their model comes from)."""
    if filename.startswith("<") or filename.startswith(_TORCH + os.sep) or (
            filename.startswith(_PYTHON + os.sep) and "site-packages" not in filename):
        return "pass"
    return "ours" if filename.startswith(_WORKBENCH + os.sep) else "user"


def _short_path(filename: str) -> str:
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


def user_failure(e: BaseException, spec: str) -> UserCodeError | None:
    """The one-line error for ``e`` when the user's code raised it: the innermost frame outside torch and
    Python's library, if that frame is not the workbench's (a syntax error: its file and line); else None.

    >>> print(user_failure(SyntaxError("invalid syntax", ("/models/net.py", 3, 5, "x = = 1")), "net.py:build"))
    --module net.py:build: /models/net.py:3: SyntaxError: invalid syntax
    >>> user_failure(ValueError("raised here, in the doctest (no file)"), "net.py:build") is None
    True
    """
    from workbench.profiles.wrappers import ModelFailure

    if isinstance(e, SyntaxError) and e.filename and _frame_kind(e.filename) == "user":
        return UserCodeError(f"--module {spec}: {_short_path(e.filename)}:{e.lineno}: {type(e).__name__}: {e.msg}")
    what = ""
    if isinstance(e, ModelFailure) and e.__cause__ is not None:
        what, e = f"{e} failed: ", e.__cause__
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    message = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    mine = None
    for code, line in reversed(frames):
        kind = _frame_kind(code.co_filename)
        if kind == "ours":
            break
        if kind == "user":
            mine = (code, line)
            break
    if mine is None and what:       # the model's forward or loss failed in torch's own code (an nn.Sequential):
        in_torch = [(c, l) for c, l in reversed(frames) if c.co_filename.startswith(_TORCH + os.sep)]
        modules = os.path.join(_TORCH, "nn", "")     # the torch module's forward, not the checks under it
        mine = next((f for f in in_torch if f[0].co_filename.startswith(modules)), in_torch[0] if in_torch else None)
    if mine is None:
        return None
    code, line = mine
    return UserCodeError(f"--module {spec}: {what}{_short_path(code.co_filename)}:{line} in {code.co_name}: {message}")


@contextmanager
def user_code(spec: str | None) -> Iterator[None]:
    """Inside, an exception raised in the user's ``--module`` code becomes one :class:`UserCodeError`
    (:func:`user_failure`), and so does ``sys.exit`` called there; every other exception passes unchanged.
    ``spec`` None: nothing changes.

    >>> with user_code("net.py:build"):
    ...     pass
    """
    try:
        yield
    except UserCodeError:
        raise
    except SystemExit as e:     # the user's code ended the process (sys.exit): say so, in one line
        if not spec:
            raise
        err = user_failure(e, spec)
        raise UserCodeError(f"{err or f'--module {spec}'}: the code called sys.exit({e.code!r}); "
                            f"{parse_spec(spec)[1]}() must return (model, example_inputs, example_targets, "
                            "loss_fn)") from None
    except Exception as e:  # noqa: BLE001 - only what the user's code raised is translated
        err = user_failure(e, spec) if spec else None
        if err is None:
            raise
        raise err from None


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


def spec_relative_to(spec: str, folder: str | Path) -> str:
    """``FILE.py:FUNC`` with FILE relative to ``folder`` (where a profile is written: the profile names its
    model from where it lies, so the two can move together).

    >>> spec_relative_to("/work/models/gpt.py:build", "/work/profiles")
    '../models/gpt.py:build'
    """
    path, func = parse_spec(spec)
    rel = os.path.relpath(Path(path).resolve(), Path(folder).resolve())
    return f"{Path(rel).as_posix()}:{func}"


def resolve_spec(spec: str, folder: str | Path) -> str:
    """A spec a profile in ``folder`` records: FILE relative to ``folder`` when it is there, else as written
    (profiles that recorded it relative to the working folder).

    >>> resolve_spec("no/such/file.py:build", "/tmp")
    'no/such/file.py:build'
    """
    path, func = parse_spec(spec)
    there = Path(folder) / path
    return f"{there}:{func}" if not Path(path).is_absolute() and there.is_file() else spec


def _import(path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--module: no such file {path!r}")
    folder = str(file.resolve().parent)      # FILE's siblings import as they do when FILE runs as a script
    if folder not in sys.path:
        sys.path.insert(0, folder)
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


def load_user_model(spec: str, seed: int = 0, **kwargs: Any) -> UserModel:
    """Import ``FILE.py``, call ``FUNC(**kwargs)`` after ``torch.manual_seed(seed)`` and check what it returned
    (``kwargs``: e.g. ``batch_size=``, for a function that takes it)."""
    path, func = parse_spec(spec)
    module = _import(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ValueError(f"--module {spec!r}: {path} has no function {func!r}")
    if kwargs:
        import inspect

        missing = [k for k in kwargs if k not in inspect.signature(fn).parameters]
        if missing:
            raise ValueError(f"--module {spec!r}: {func}() takes no {', '.join(missing)} argument")
    torch.manual_seed(seed)
    got = fn(**kwargs)
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
