"""The experiments' unit cache: one CSV per finished unit under ``OUT/units/`` with a JSON sidecar.

The sidecar holds the unit's key (its ``settings``,
:mod:`workbench.experiments.units`), the CSV's SHA-256, its row count and the
versions that made it. A cached unit is reused only when its key equals the
current one and its CSV matches the checksum (docs/model.md, "Cached
results"); otherwise :func:`read_unit` says why and it is recomputed. Every
file is written atomically, the CSV before its sidecar, so a killed run
leaves no unit that looks finished.

>>> import tempfile
>>> u = Unit("demo", "sweep", {"kind": "sweep"})
>>> read_unit(u, Path(tempfile.mkdtemp()))
(None, 'not computed yet')
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.experiments.provenance import versions
from workbench.experiments.sweeps import compute_unit
from workbench.experiments.units import Unit
from workbench.io import write_text_atomic

__all__ = ["read_unit", "load_unit", "unit_is_current", "run_unit", "store_unit"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _differences(old: Any, new: dict[str, Any]) -> str:
    if not isinstance(old, dict):
        return "no key"
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(keys)


def read_unit(unit: Unit, out: Path) -> tuple[pd.DataFrame | None, str]:
    """The unit's cached frame and ``""``, or ``None`` and why it cannot be used.

    Usable means: the CSV and its sidecar exist, the sidecar's key equals
    ``unit.settings`` and the CSV matches the sidecar's checksum and row count.
    """
    path = unit.path(out)
    try:
        meta = json.loads(_sidecar(path).read_text())
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "not computed yet"
    except (OSError, ValueError) as e:
        return None, f"unreadable ({type(e).__name__})"
    if not isinstance(meta, dict):
        return None, "unreadable sidecar"
    if meta.get("settings") != unit.settings:
        return None, f"made with another key (differs in: {_differences(meta.get('settings'), unit.settings)})"
    if meta.get("sha256") != _sha(data):
        return None, "CSV does not match its checksum (changed, cut short, or written by another run)"
    try:
        df = pd.read_csv(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001
        return None, f"unreadable CSV ({type(e).__name__})"
    if len(df) != meta.get("rows"):
        return None, "row count differs from the sidecar"
    return df, ""


def load_unit(unit: Unit, out: Path) -> pd.DataFrame | None:
    """The unit's cached frame if it can be used (:func:`read_unit`), else None."""
    return read_unit(unit, out)[0]


def unit_is_current(unit: Unit, out: Path) -> bool:
    return load_unit(unit, out) is not None


def run_unit(unit: Unit, out: Path, *, force: bool = False) -> tuple[pd.DataFrame, bool]:
    """Load the unit if current, else compute and store it (:func:`store_unit`). Returns (frame, computed)."""
    out = Path(out)
    if not force:
        df = load_unit(unit, out)
        if df is not None:
            return df, False
    return store_unit(unit, out, compute_unit(unit).to_csv(index=False)), True


def store_unit(unit: Unit, out: Path, text: str, *, seconds: float | None = None,
               host: str | None = None) -> pd.DataFrame:
    """Write a computed unit's CSV ``text`` and then its sidecar, each atomically; the frame as later runs
    will read it. Executors (:mod:`workbench.experiments.executors`) hand their units here, with the
    ``seconds`` the unit took on its worker ``host`` (in the sidecar: what a cluster would take)."""
    path = unit.path(Path(out))
    write_text_atomic(path, text)
    df = pd.read_csv(path)          # what later runs will read: its rows are counted and it is returned
    meta = {"unit": unit.name, "settings": unit.settings, "rows": len(df), "sha256": _sha(text.encode()),
            "versions": versions()}
    if seconds is not None:
        meta["compute"] = {"seconds": round(float(seconds), 3), "host": host}
    write_text_atomic(_sidecar(path), json.dumps(meta, indent=1, sort_keys=True))
    return df
