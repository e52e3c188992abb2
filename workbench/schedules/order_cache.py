"""torch's schedule orders kept on disk, so that planning, checking or simulating a plan of torch's schedules does not
import ``torch.distributed.pipelining`` again (seconds: it imports torch's compiler and distributed tensors).

:func:`~workbench.schedules.torch_orders.torch_order` asks torch's class once per (schedule, devices, stages per
device, micro-batches) and torch version; its answer (the order per device, or torch's refusal) is written here
as JSON, one small file per question, under ``$WORKBENCH_CACHE_DIR`` (default ``$XDG_CACHE_HOME/workbench``,
else ``~/.cache/workbench``), ``torch-orders/<format>/<torch version>/`` (:data:`FORMAT` changes when what
:func:`~workbench.schedules.torch_orders.torch_order` makes of torch's order does). ``WORKBENCH_CACHE_DIR=off`` (or an
unwritable folder) keeps nothing; an unreadable or damaged file is asked again. The answer read back is the one
torch gave: the order's operations in its order, with their positions as times.

>>> import tempfile, os
>>> from workbench.schedules.ops import Op
>>> os.environ["WORKBENCH_CACHE_DIR"] = tempfile.mkdtemp()
>>> store_answer(("zbv", 2, 2, 4), {0: (Op(0, "F", 0, 0.0),), 1: ()})
>>> load_answer(("zbv", 2, 2, 4))
{0: (Op(stage=0, kind='F', batch=0, time=0.0),), 1: ()}
>>> store_answer(("zbv", 2, 2, 1), "needs 2 micro-batches"); load_answer(("zbv", 2, 2, 1))
'needs 2 micro-batches'
>>> del os.environ["WORKBENCH_CACHE_DIR"]
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

from workbench.schedules.ops import Op

__all__ = ["ENV", "FORMAT", "cache_folder", "is_kept", "load_answer", "store_answer"]

#: the environment variable naming the cache's folder (``off`` or empty: nothing kept)
ENV = "WORKBENCH_CACHE_DIR"
#: the layout of what is kept (and of what torch_order makes of torch's order): a new one asks torch again
FORMAT = "v1"

#: (schedule, devices, stages per device, micro-batches)
Question = tuple[str, int, int, int]
Answer = dict[int, tuple[Op, ...]] | str

_OP = re.compile(r"(\d+)([FBIW])(\d+)")


@lru_cache(maxsize=1)
def _torch_version() -> str | None:
    """The installed torch's version, read once (its package metadata: about a millisecond each time)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:   # pragma: no cover - torch is a dependency
        return None


def cache_folder() -> Path | None:
    """Where the answers of the installed torch are kept (None: nowhere, ``WORKBENCH_CACHE_DIR=off``)."""
    root = os.environ.get(ENV)
    if root is not None and root.strip().lower() in ("", "off", "none", "0"):
        return None
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "workbench")
    torch_version = _torch_version()
    if torch_version is None:   # pragma: no cover - torch is a dependency
        return None
    return Path(root) / "torch-orders" / FORMAT / re.sub(r"[^\w.+-]", "_", torch_version)


def _file(question: Question) -> Path | None:
    folder = cache_folder()
    name, devices, chunks, m = question
    return None if folder is None else folder / f"{name}-P{devices}-V{chunks}-m{m}.json"


def is_kept(question: Question) -> bool:
    """Whether an answer is kept for ``question`` (a file there; not read)."""
    path = _file(question)
    return path is not None and path.is_file()


def load_answer(question: Question) -> Answer | None:
    """torch's answer kept for ``question`` (an order, or its refusal as a string); None when none is kept."""
    path = _file(question)
    try:
        if path is None or not path.is_file():
            return None
        d = json.loads(path.read_text())
        if "refused" in d:
            return str(d["refused"])
        out = {}
        for rank, ops in d["order"].items():
            parsed = [_OP.fullmatch(o) for o in ops]
            out[int(rank)] = tuple(Op(int(g[1]), g[2], int(g[3]), float(j)) for j, g in enumerate(parsed))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):   # damaged: asked again
        return None


def store_answer(question: Question, answer: Answer) -> None:
    """Keep torch's ``answer`` for ``question`` (silently nothing where the folder cannot be written)."""
    from workbench.io import write_text_atomic

    path = _file(question)
    if path is None:
        return
    body = {"refused": answer} if isinstance(answer, str) else \
        {"order": {str(r): [f"{o.stage}{o.kind}{o.batch}" for o in ops] for r, ops in answer.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(body, separators=(",", ":")))
    except OSError:
        pass
