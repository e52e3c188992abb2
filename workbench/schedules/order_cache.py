"""torch's orders kept on disk, so that a later process plans torch's schedules without importing torch's pipelining.

An order (:func:`workbench.schedules.torch_orders.torch_order`) depends only on torch's version, the schedule's
class, the devices, the stages per device and the micro-batches, and reading it from torch costs the import of
``torch.distributed.pipelining`` first (1-3 s on the 2-core machine, up to 6 s under load: more than a short
time limit). Each order torch computes (or refuses, with its reason) is kept as one JSON file under
:func:`cache_dir`, written atomically; a file that cannot be read, is not this torch's, or cannot be written
is ignored (the order is read from torch again). The directory is ``$WORKBENCH_CACHE_DIR`` if set (empty: no
cache), else ``$XDG_CACHE_HOME/workbench`` or ``~/.cache/workbench``, then ``torch-orders/``.

>>> import os, tempfile
>>> from workbench.schedules.ops import Op
>>> was = os.environ.get(ENV)
>>> os.environ[ENV] = tempfile.mkdtemp()
>>> store_order("ScheduleZBVZeroBubble", 1, 2, 1, {0: (Op(0, "F", 0, 0.0), Op(1, "F", 0, 1.0))})
>>> load_order("ScheduleZBVZeroBubble", 1, 2, 1)
{0: (Op(stage=0, kind='F', batch=0, time=0.0), Op(stage=1, kind='F', batch=0, time=1.0))}
>>> load_order("ScheduleZBVZeroBubble", 1, 2, 2) is None, is_stored("ScheduleZBVZeroBubble", 1, 2, 2)
(True, False)
>>> _ = os.environ.pop(ENV) if was is None else os.environ.update({ENV: was})
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from workbench.schedules.ops import Op

__all__ = ["cache_dir", "is_stored", "load_order", "store_order", "ENV"]

#: the environment variable naming the cache's directory (empty: no cache)
ENV = "WORKBENCH_CACHE_DIR"

Order = dict[int, tuple[Op, ...]]


def cache_dir() -> Path | None:
    """Where orders are kept (module docstring); None: no cache."""
    env = os.environ.get(ENV)
    if env is not None:
        return Path(env) / "torch-orders" if env else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "workbench" / "torch-orders"


@lru_cache(maxsize=1)
def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _path(torch_class: str, devices: int, chunks: int, micro_batches: int) -> Path | None:
    d = cache_dir()
    version = _torch_version()
    if d is None or not version:
        return None
    return d / f"{torch_class}-torch{version}-p{devices}-v{chunks}-m{micro_batches}.json"


def is_stored(torch_class: str, devices: int, chunks: int, micro_batches: int) -> bool:
    """Whether a file is kept for these (without reading it)."""
    path = _path(torch_class, devices, chunks, micro_batches)
    return path is not None and path.is_file()


def load_order(torch_class: str, devices: int, chunks: int, micro_batches: int) -> Order | str | None:
    """The kept order (per device, its operations), torch's reason for refusing the combination (a string), or
    None when nothing usable is kept."""
    path = _path(torch_class, devices, chunks, micro_batches)
    try:
        data = json.loads(path.read_text()) if path is not None else None
        if not isinstance(data, dict) or data.get("torch") != _torch_version():
            return None
        if "refused" in data:
            return str(data["refused"])
        return {int(rank): tuple(Op(int(s), str(k), int(b), float(i)) for i, (s, k, b) in enumerate(ops))
                for rank, ops in data["order"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_order(torch_class: str, devices: int, chunks: int, micro_batches: int, order: Order | str) -> None:
    """Keep ``order`` (or torch's refusal, a string); nothing happens where it cannot be written."""
    from workbench.io import write_text_atomic

    path = _path(torch_class, devices, chunks, micro_batches)
    if path is None:
        return
    data: dict = {"torch": _torch_version()}
    if isinstance(order, str):
        data["refused"] = order
    else:
        data["order"] = {str(rank): [[a.stage, a.kind, a.batch] for a in ops] for rank, ops in order.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data, separators=(",", ":")))
    except OSError:
        pass
