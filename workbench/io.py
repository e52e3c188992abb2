"""Atomic file writes: a run interrupted mid-write never leaves a half-written result.

Every file is written to a temporary file beside it, named
``.<name>.<pid>.<random>.tmp`` (hidden, and naming the process that writes
it), flushed to disk and then renamed over the target in one step
(:func:`os.replace`). A killed run leaves at most such a temporary file,
never a partial or empty target; :func:`remove_orphans` deletes the
temporary files whose writer is gone (run it at the start of the next run).
:func:`folder_lock` keeps two runs from writing into one folder at once.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
>>> write_text_atomic(p, "hello")
>>> p.read_text()
'hello'
>>> with atomic_path(p.with_name("y.txt")) as tmp:  # for writers that want a path (plotly, kaleido)
...     _ = tmp.write_text("from a path")
>>> sorted(q.name for q in p.parent.iterdir())
['x.txt', 'y.txt']
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd

__all__ = ["write_text_atomic", "write_bytes_atomic", "write_frame_atomic", "write_files_atomic", "frame_bytes",
           "atomic_path", "check_writable", "remove_orphans", "is_temporary", "folder_lock", "FolderBusy"]

#: ``.<name>.<pid>.<random>.tmp``: a temporary file of :func:`atomic_path` / :func:`write_bytes_atomic`
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")
#: temporary files of older versions, which did not name the pid (mkstemp's and save_html's)
_LEGACY = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$|^[^.].*\.html\.tmp$")
#: a legacy temporary file this old (seconds) is an orphan
LEGACY_AGE = 3600.0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _cannot_write(path: str | Path, e: OSError) -> OSError:
    """``e`` (about a temporary file or folder beside ``path``) said of the user's ``path``; its errno kept.

    >>> str(_cannot_write("out/plan.json", OSError(errno.ENOSPC, "No space left on device", ".plan.json.1.x.tmp")))
    'out/plan.json: cannot write it (no space left on the device)'
    """
    why = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "over the disk quota",
           errno.EROFS: "a read-only file system", errno.EACCES: "permission denied",
           errno.EPERM: "permission denied"}.get(e.errno or 0, e.strerror or str(e))
    out = OSError(f"{path}: cannot write it ({why})")
    out.errno = e.errno
    return out


def _temporary(path: Path) -> tuple[int, str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as e:
        raise _cannot_write(path, e) from None


def check_writable(path: str | Path, *, folder: bool = False) -> None:
    """Refuse (OSError naming ``path``) an output that cannot be written, before any work: a temporary file
    with a page of bytes is written, flushed to disk and removed where ``path`` (a file, or with ``folder`` a
    folder, which need not exist yet) would go. A read-only or full disk fails here.

    >>> import tempfile
    >>> check_writable(Path(tempfile.mkdtemp()) / "new" / "folder", folder=True)
    """
    path = Path(path)
    where = path if not folder else path / "x"
    parent = where.parent
    while not parent.exists() and parent != parent.parent:   # the nearest folder that exists
        parent = parent.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{where.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as e:
        raise _cannot_write(path, e) from None
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
    except OSError as e:
        raise _cannot_write(path, e) from None
    finally:
        os.close(fd)
        _discard(tmp)


def _publish(tmp: str, path: Path) -> None:
    """Give ``tmp`` ordinary permissions (``mkstemp`` makes it owner-only) and rename it over ``path``."""
    os.chmod(tmp, _FILE_MODE)
    os.replace(tmp, path)


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename over ``path``.

    The file gets the permissions an ordinary ``open(path, "w")`` would give.
    """
    write_files_atomic({Path(path): data})


def write_files_atomic(files: dict[Path, bytes]) -> None:
    """Write several files as a set: every one to its temporary file first (where a full disk or a
    write error shows), then each renamed over its target. An error before the renames leaves every
    target as it was; no half-written file is ever visible.
    """
    temps: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            fd, tmp = _temporary(path)
            temps.append((tmp, path))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise _cannot_write(path, e) from None
        for tmp, path in temps:
            _publish(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            _discard(tmp)
        raise


@contextmanager
def atomic_path(path: str | Path, *, allow_empty: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that wants a file name; renamed over ``path`` at the end.

    If the block raises (or the process dies) ``path`` keeps its old
    contents. An empty result is refused (``OSError``) unless
    ``allow_empty``: a writer that silently wrote nothing must not replace
    a good file with a 0-byte one.
    """
    path = Path(path)
    fd, tmp = _temporary(path)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if not allow_empty and os.path.getsize(tmp) == 0:
            raise OSError(f"{path}: the writer produced an empty file; the previous one (if any) is kept")
        _publish(tmp, path)
    except OSError as e:
        _discard(tmp)
        if e.errno is not None and tmp in (str(getattr(e, "filename", "")), str(getattr(e, "filename2", ""))):
            raise _cannot_write(path, e) from None     # the writer's error, said of the user's file
        raise
    except BaseException:
        _discard(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def frame_bytes(path: str | Path, frame: pd.DataFrame) -> bytes:
    """A DataFrame as the bytes of a CSV file, or of a Parquet file when ``path`` ends with ``.parquet``."""
    if Path(path).suffix == ".parquet":
        import io

        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return buf.getvalue()
    return frame.to_csv(index=False).encode()


def write_frame_atomic(path: str | Path, frame: pd.DataFrame) -> None:
    """Write a DataFrame as CSV, or Parquet when ``path`` ends with ``.parquet``."""
    write_bytes_atomic(path, frame_bytes(path, frame))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def is_temporary(name: str) -> bool:
    """Whether a file name is one of this module's temporary files (or an older version's).

    >>> [is_temporary(n) for n in (".report.md.4242.k3j_9x2a.tmp", "f.html.tmp", "report.md", "notes.tmp")]
    [True, True, False, False]
    """
    return bool(_TEMP.match(name) or _LEGACY.match(name))


def remove_orphans(folder: str | Path, *, recursive: bool = True) -> list[Path]:
    """Delete the temporary files under ``folder`` left by a writer that was killed; returns them.

    A temporary file names its writer's pid: it is an orphan when that
    process is gone (files of this process and of live ones are kept). Files
    of older versions, which did not name the pid, count as orphans after
    ``LEGACY_AGE`` seconds. Only files on this host can be judged: do not
    share an output folder between machines.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed: list[Path] = []
    now = time.time()
    for p in folder.rglob("*.tmp") if recursive else folder.glob("*.tmp"):
        if not p.is_file() or not is_temporary(p.name):
            continue
        m = _TEMP.match(p.name)
        try:
            orphan = (not _pid_alive(int(m.group("pid")))) if m else (now - p.stat().st_mtime > LEGACY_AGE)
            if orphan:
                p.unlink()
                removed.append(p)
        except FileNotFoundError:  # its writer finished meanwhile
            continue
    return removed


class FolderBusy(RuntimeError):
    """Another process holds the folder's lock; the message names it."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process"
    return f"{info.get('what', 'a run')} (pid {info['pid']} on {info.get('host', '?')}, since {info.get('since', '?')})"


@contextmanager
def folder_lock(folder: str | Path, *, what: str = "a run", wait: float = 0.0) -> Iterator[Path]:
    """Hold ``folder/.lock`` (an exclusive ``flock``) for the block; yields the lock file.

    A second holder waits up to ``wait`` seconds, then gets
    :class:`FolderBusy` naming the holder's pid, host and start time. The
    kernel releases the lock when its holder exits, even when killed, so a
    stale lock cannot block later runs.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with folder_lock(d, what="demo"):
    ...     with folder_lock(d) as again:
    ...         pass
    Traceback (most recent call last):
    ...
    workbench.io.FolderBusy: ... is in use by demo (pid ...); wait for it to finish or choose another folder
    """
    import fcntl
    import socket

    folder = Path(folder)
    path = folder / ".lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
    except OSError as e:
        raise _cannot_write(folder, e) from None
    deadline = time.monotonic() + max(0.0, wait)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise FolderBusy(f"{folder} is in use by {_holder(path)}; wait for it to finish or choose "
                                     "another folder") from None
                time.sleep(min(0.5, max(0.01, deadline - time.monotonic())))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                                  "since": since}).encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock
