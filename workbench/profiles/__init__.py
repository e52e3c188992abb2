"""Profiles: reading, writing and finding per-layer measurements.

``load_profile`` takes a path (a project CSV, a PipeDream ``graph.txt`` or a
folder holding one) or a name: a bundled profile in ``data/profiles`` (e.g.
``"resnet50"``, measured on this project's CPU machine), one measured on a
GPU, in a sub-folder named after it (``"h100/resnet50"``), a fake profile made for a
named GPU (``"fake/llama3-70b-h100-sxm"``, :mod:`workbench.profiles.fake`: memory measured under
fake tensors, times estimated by :mod:`workbench.profiles.roofline`), or one of
PipeDream's published profiles as ``"pipedream/vgg16"`` (shipped in
``data/profiles/pipedream/``; ``$WORKBENCH_PEER_PROFILES`` points the names at
another copy).

>>> sorted(n for n in available_profiles() if n.startswith("pipedream/"))[:2]
['pipedream/alexnet', 'pipedream/densenet121']
"""

from __future__ import annotations

from pathlib import Path

from workbench.model.chain import Chain
from workbench.paths import PROFILES_DIR, peer_profiles_dir
from workbench.profiles.csvio import (
    ProfileError,
    ProfileWarning,
    check_values,
    parse_profile_text,
    read_profile,
    write_profile,
)

__all__ = ["ProfileError", "ProfileWarning", "read_profile", "write_profile", "parse_profile_text", "load_profile",
           "available_profiles", "resolve_profile"]


def available_profiles() -> dict[str, Path]:
    """Names of bundled profiles (GPU ones as ``h100/<net>``) and peer profiles, mapped to their files."""
    out: dict[str, Path] = {}
    if PROFILES_DIR.is_dir():
        for p in sorted(PROFILES_DIR.glob("*.csv")):
            out[p.stem] = p
        for p in sorted(PROFILES_DIR.glob("*/*.csv")):  # measured on other hardware, e.g. h100/resnet50
            out[f"{p.parent.name}/{p.stem}"] = p
    peer = peer_profiles_dir()
    if peer is not None:
        for g in sorted(peer.glob("*/graph.txt")):
            out[f"pipedream/{g.parent.name}"] = g
    return out


def resolve_profile(spec: str | Path) -> Path:
    """The file a profile name or path refers to; a clear error if none."""
    p = Path(spec)
    if p.is_dir() and (p / "graph.txt").exists():
        return p / "graph.txt"
    if p.exists():
        return p
    known = available_profiles()
    if str(spec) in known:
        return known[str(spec)]
    raise ProfileError(
        f"{spec}: no such profile file or name; known names: {', '.join(sorted(known)) or '(none found)'}"
    )


def load_profile(spec: str | Path, **options) -> Chain:
    """Load a chain from a CSV profile, a PipeDream graph, or a known profile name.

    ``options`` go to the PipeDream loader (e.g. ``zero_input=True``).
    """
    path = resolve_profile(spec)
    if path.suffix == ".csv":
        return read_profile(path)
    from workbench.profiles.pipedream import load_pipedream_chain

    return check_values(load_pipedream_chain(path, **options), str(path))
