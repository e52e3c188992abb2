"""Where the project's data lives.

>>> REPO_ROOT.joinpath("workbench").is_dir()
True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO_ROOT", "DATA_DIR", "PROFILES_DIR", "PIPEDREAM_PROFILES_DIR", "RESULTS_DIR", "peer_profiles_dir"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
PROFILES_DIR = DATA_DIR / "profiles"
RESULTS_DIR = DATA_DIR / "results"
#: PipeDream's nine published profiles, shipped with the repository (MIT; see its README.md)
PIPEDREAM_PROFILES_DIR = PROFILES_DIR / "pipedream"


def peer_profiles_dir() -> Path | None:
    """PipeDream's published profiles: ``$WORKBENCH_PEER_PROFILES`` if set, else the copy in
    ``data/profiles/pipedream``.

    >>> peer_profiles_dir() == PIPEDREAM_PROFILES_DIR or "WORKBENCH_PEER_PROFILES" in os.environ
    True
    """
    env = os.environ.get("WORKBENCH_PEER_PROFILES")
    for c in ([Path(env)] if env else []) + [PIPEDREAM_PROFILES_DIR]:
        if c.is_dir():
            return c
    return None
