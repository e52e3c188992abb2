"""Profiles cached by content: a second search over the same model finds its profiles made.

A profile that takes minutes to make (Llama-3-70B under fake tensors, once per tensor-parallel degree and
micro-batch size) is kept under a folder as the experiments keep their units
(:mod:`workbench.experiments.cache`): the profile's CSV and a JSON sidecar holding its **key** and the CSV's
SHA-256, each written atomically, the CSV first. The key is what determines the profile, given by the caller
(the model file's SHA-256, the function, the options, the GPU...), plus the digest of the profiler's own code
(every ``.py`` under ``workbench/profiles/`` and ``workbench/parallel/``) and torch's version: a profile made
by other code is made again. A file the model module imports is not in its digest: change it and pass
``cache=False`` (or delete the folder). The folder is ``$WORKBENCH_CACHE/profiles``, by default
``~/.cache/workbench/profiles``.

>>> import tempfile
>>> from workbench.model.chain import Chain, Layer
>>> folder = Path(tempfile.mkdtemp())
>>> make = lambda: Chain((Layer("a", 0.001, 0.002, 10, 4),), meta={"network": "toy"})
>>> cached_profile({"model": "toy"}, make, folder)[1], cached_profile({"model": "toy"}, make, folder)[1]
(True, False)
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

from workbench.io import write_text_atomic
from workbench.model.chain import Chain

__all__ = ["cached_profile", "profile_cache_dir", "profiler_digest"]

_PACKAGE = Path(__file__).resolve().parents[1]


def profile_cache_dir() -> Path:
    """``$WORKBENCH_CACHE/profiles``, else ``~/.cache/workbench/profiles``."""
    root = os.environ.get("WORKBENCH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "workbench") / "profiles"


@lru_cache(maxsize=1)
def profiler_digest() -> str:
    """16 hex digits of the profiler's code (module docstring)."""
    h = hashlib.sha256()
    for folder in ("profiles", "parallel"):
        for p in sorted((_PACKAGE / folder).rglob("*.py")):
            h.update(p.relative_to(_PACKAGE).as_posix().encode() + b"\n" + p.read_bytes())
    return h.hexdigest()[:16]


def _full_key(key: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    return {**json.loads(json.dumps(dict(key), sort_keys=True, default=str)), "profiler": profiler_digest(),
            "torch": torch.__version__}


def cached_profile(key: Mapping[str, Any], compute: Callable[[], Chain],
                   folder: str | Path | None = None) -> tuple[Chain, bool]:
    """The profile of ``key`` from ``folder`` (default :func:`profile_cache_dir`) if one was stored with that
    key and its CSV matches its checksum; else ``compute()``'s, stored. Returns (chain, computed)."""
    from workbench.profiles.csvio import ProfileError, parse_profile_text, write_profile

    full = _full_key(key)
    name = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:24]
    root = Path(folder) if folder is not None else profile_cache_dir()
    csv, sidecar = root / f"{name}.csv", root / f"{name}.json"
    try:
        meta = json.loads(sidecar.read_text())
        text = csv.read_text(encoding="utf-8")
        if meta.get("key") == full and meta.get("sha256") == hashlib.sha256(text.encode()).hexdigest():
            return parse_profile_text(text, str(csv)), False
    except (OSError, ValueError, ProfileError):
        pass
    chain = compute()
    root.mkdir(parents=True, exist_ok=True)
    write_profile(chain, csv)
    text = csv.read_text(encoding="utf-8")
    write_text_atomic(sidecar, json.dumps({"key": full, "sha256": hashlib.sha256(text.encode()).hexdigest()},
                                          indent=1, sort_keys=True))
    return parse_profile_text(text, str(csv)), True
