"""Where the project's data lives.

>>> REPO_ROOT.joinpath("workbench").is_dir()
True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO_ROOT", "DATA_DIR", "PROFILES_DIR", "RESULTS_DIR", "peer_profiles_dir"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
PROFILES_DIR = DATA_DIR / "profiles"
RESULTS_DIR = DATA_DIR / "results"


def peer_profiles_dir() -> Path | None:
    """PipeDream's published profiles: ``$WORKBENCH_PEER_PROFILES`` or ``../shared/peer-profiles/pipedream``."""
    env = os.environ.get("WORKBENCH_PEER_PROFILES")
    candidates = [Path(env)] if env else []
    candidates += [REPO_ROOT.parent / "shared" / "peer-profiles" / "pipedream", REPO_ROOT / "shared" / "peer-profiles" / "pipedream"]
    for c in candidates:
        if c.is_dir():
            return c
    return None
