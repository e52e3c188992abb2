"""Atomic file writes: a run interrupted mid-write never leaves a half-written result.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
>>> write_text_atomic(p, "hello")
>>> p.read_text()
'hello'
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd

__all__ = ["write_text_atomic", "write_bytes_atomic", "write_frame_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename over ``path``.

    The file gets the permissions an ordinary ``open(path, "w")`` would give
    (``mkstemp`` alone would leave it readable by its owner only).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_frame_atomic(path: str | Path, frame: pd.DataFrame) -> None:
    """Write a DataFrame as CSV, or Parquet when ``path`` ends with ``.parquet``."""
    path = Path(path)
    if path.suffix == ".parquet":
        import io

        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        write_bytes_atomic(path, buf.getvalue())
    else:
        write_text_atomic(path, frame.to_csv(index=False))
