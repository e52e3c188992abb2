"""The experiments' units of work: what each one computes, its key, and its cache on disk.

A *unit* is one sweep of one method over the memory levels of one network
and device count, or one piece of the complexity study. Each finished unit
is a CSV under ``OUT/units/`` with a JSON sidecar holding its *key* (the
unit's ``settings``), the CSV's SHA-256, its row count and the versions that
made it. The key holds everything that determines the result (docs/model.md,
"Cached results"): the settings, the SHA-256 of the profile file a sweep
reads, and :func:`~workbench.provenance.code_version` (the model code). A
cached unit is reused only when its key equals the current one and its CSV
matches the checksum; otherwise :func:`read_unit` says why and it is
recomputed.

>>> s = settings_for(quick=True, networks=("resnet50",), devices=(2,))
>>> [u.name for u in plan_units(s, ["throughput"])][:2]
['sweep__resnet50__P2__dp', 'sweep__resnet50__P2__pipedream']
>>> sorted(plan_units(s, ["throughput"])[0].settings["profile"])
['file', 'sha256']
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from .chain import Platform
from .complexity import (
    family_factor, gain_distribution, general_beats_contiguous_family, is_three_partition_yes, memory_levels,
    run_method, scaling_study, three_partition_instance, three_partition_no_instance, three_partition_yes_instance,
)
from .io import write_text_atomic
from .provenance import code_version, file_digest, versions

__all__ = [
    "Settings", "Unit", "METHOD_KEYS", "METHOD_LABELS", "SWEEP_FIGURES", "COMPLEXITY_FIGURES", "FIGURES",
    "settings_for", "plan_units", "profile_key", "read_unit", "load_unit", "unit_is_current", "run_unit",
    "compute_unit", "slug",
]

#: method key -> (planner name, allocation), in legend order
METHOD_KEYS: dict[str, tuple[str, str]] = {
    "ilp-general": ("ilp", "general"),
    "ilp-contiguous": ("ilp", "contiguous"),
    "dp": ("dp", "contiguous"),
    "pipedream": ("pipedream", "contiguous"),
    "mcap": ("mcap", "contiguous"),
    "gpipe": ("gpipe", "contiguous"),
    "1f1b": ("1f1b", "contiguous"),
}
METHOD_LABELS = {
    "ilp-general": "general ILP", "ilp-contiguous": "contiguous ILP", "dp": "memory-aware DP",
    "pipedream": "PipeDream", "mcap": "mCAP (memory-balanced)", "gpipe": "GPipe", "1f1b": "1F1B-flush",
}
SWEEP_FIGURES = ("throughput", "memory", "min_memory", "solve_times")
COMPLEXITY_FIGURES = ("three_partition", "family", "scaling", "gains", "largest")
FIGURES = SWEEP_FIGURES + COMPLEXITY_FIGURES
TOL = 1e-6


@dataclass(frozen=True)
class Settings:
    """Everything the user chooses that determines the results (part of every unit's key)."""

    networks: tuple[str, ...]
    devices: tuple[int, ...] = (2, 4, 8)
    n_levels: int = 6
    time_limit: float = 60.0
    general_time_limit: float = 20.0  # per general-ILP solve: the time-outs dominate the run
    methods: tuple[str, ...] = tuple(METHOD_KEYS)
    bandwidth: str = "12GB/s"
    weight_factor: float = 1.0
    weights: str = "stash"
    memory_model: str = "paper"   # the paper's figures use its rule 7 (workbench.memory); "full" for the device model
    # complexity study
    scaling_layers: tuple[int, ...] = (4, 8, 12, 16, 24, 32)
    scaling_devices: tuple[int, ...] = (2, 4, 8)
    scaling_time_limit: float = 60.0
    scaling_seeds: tuple[int, ...] = (0,)
    gain_instances: int = 100
    gain_layers: int = 8
    gain_devices: int = 3
    gain_positions: tuple[float, ...] = (0.0, 0.25, 0.5)
    three_partition_m: tuple[int, ...] = (2, 3)
    three_partition_count: int = 3
    family_k: tuple[int, ...] = (2, 3, 4, 6, 8)
    # the largest model that fits (workbench.largest; the full memory model, Adam, fp32)
    largest_families: tuple[str, ...] = ("depth", "width")
    largest_devices: tuple[int, ...] = (2, 4, 8)
    largest_memory: float = 2 * 2**30
    largest_time_limit: float = 10.0
    largest_ilp: bool = True
    quick: bool = False

    def with_(self, **kw: Any) -> "Settings":
        return dataclasses.replace(self, **kw)


def _default_networks(quick: bool) -> tuple[str, ...]:
    from .profiles import available_profiles

    # bundled CPU profiles and PipeDream's; the GPU ones (h100/...) are named explicitly when wanted
    names = [n for n in available_profiles() if "/" not in n or n.startswith("pipedream/")]
    if quick:
        pick = [n for n in ("resnet50", "gpt-small") if n in names]
        return tuple(pick or names[:1])
    return tuple(names)


def settings_for(quick: bool = False, **overrides: Any) -> Settings:
    """The full or quick settings; ``overrides`` replace fields (e.g. ``networks=("resnet50",)``)."""
    if quick:
        s = Settings(networks=(), devices=(2, 4), n_levels=3, time_limit=5.0, general_time_limit=5.0, scaling_layers=(4, 8),
                     scaling_devices=(2, 4), scaling_time_limit=5.0, gain_instances=12, gain_layers=6,
                     gain_devices=2, gain_positions=(0.0, 0.3), three_partition_m=(2,), three_partition_count=2,
                     family_k=(2, 3), largest_devices=(2,), largest_ilp=False, quick=True)
    else:
        s = Settings(networks=())
    if "networks" not in overrides:
        overrides["networks"] = _default_networks(quick)
    return s.with_(**overrides)


@dataclass(frozen=True)
class Unit:
    """One piece of work: its file (relative to ``OUT/units``), its key and how to compute it."""

    name: str
    kind: str  # "sweep" | "three_partition" | "family" | "scaling" | "gains"
    settings: dict[str, Any] = field(hash=False, compare=False)

    def path(self, out: Path) -> Path:
        return Path(out) / "units" / f"{self.name}.csv"


def slug(network: str) -> str:
    """A network name as it appears in file names: ``slug("pipedream/vgg16") == "pipedream-vgg16"``."""
    return network.replace("/", "-").replace(" ", "_")


def _platform(s: Settings, devices: int) -> Platform:
    return Platform(devices, bandwidth=s.bandwidth, weight_factor=s.weight_factor, weights=s.weights,
                    memory_model=s.memory_model)


def _canon(x: Any) -> Any:
    """JSON-stable settings: floats to 10 significant digits, tuples to lists."""
    if isinstance(x, float):
        return float(f"{x:.10g}") if math.isfinite(x) else str(x)
    if isinstance(x, (list, tuple)):
        return [_canon(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in x.items()}
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return _canon(float(x))
    return x


def profile_key(network: str) -> dict[str, str]:
    """The profile a network name reads: its file (relative to the repository when inside it) and SHA-256."""
    from .paths import REPO_ROOT
    from .profiles import resolve_profile

    path = Path(resolve_profile(network)).resolve()
    try:
        shown = path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        shown = str(path)
    return {"file": shown, "sha256": file_digest(path)}


_LEVEL_CACHE: dict[tuple, list[float]] = {}


def _levels(s: Settings, network: str, devices: int, digest: str) -> list[float]:
    key = (network, digest, code_version(), devices, s.n_levels, s.bandwidth, s.weight_factor, s.weights, s.memory_model, s.methods)
    if key not in _LEVEL_CACHE:
        from .profiles import load_profile

        chain = load_profile(network)
        meths = tuple(METHOD_KEYS[m][0] for m in s.methods if METHOD_KEYS[m][0] in ("dp", "pipedream", "gpipe", "1f1b"))
        _LEVEL_CACHE[key] = memory_levels(chain, _platform(s, devices), s.n_levels, methods=meths or ("dp",))
    return _LEVEL_CACHE[key]


def _sweep_units(s: Settings) -> list[Unit]:
    units: list[Unit] = []
    version = code_version()
    for net in s.networks:
        for P in s.devices:
            try:
                prof = profile_key(net)
                lv = _levels(s, net, P, prof["sha256"])
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"{net}: cannot load or plan it ({type(e).__name__}: {e}); skipped")
                break
            for mk in s.methods:
                planner, alloc = METHOD_KEYS[mk]
                st = {"kind": "sweep", "network": net, "profile": prof, "code_version": version, "devices": P,
                      "method_key": mk, "method": planner, "allocation": alloc, "memory_levels": lv,
                      "bandwidth": s.bandwidth, "weight_factor": s.weight_factor, "weights": s.weights,
                      "memory_model": s.memory_model,
                      "time_limit": (s.general_time_limit if alloc == "general" else s.time_limit)
                      if planner == "ilp" else None}
                units.append(Unit(f"sweep__{slug(net)}__P{P}__{mk}", "sweep", _canon(st)))
    return units


def _complexity_units(s: Settings, figures: set[str]) -> list[Unit]:
    v = {"code_version": code_version()}
    units: list[Unit] = []
    if "three_partition" in figures:
        units.append(Unit("complexity__three_partition", "three_partition", _canon(
            {"kind": "three_partition", "m": s.three_partition_m, "count": s.three_partition_count, "bound": 20,
             "time_limit": s.scaling_time_limit, **v})))
    if "family" in figures:
        units.append(Unit("complexity__family", "family", _canon(
            {"kind": "family", "k": s.family_k, "time_limit": s.scaling_time_limit, **v})))
    if "gains" in figures:
        units.append(Unit("complexity__gains", "gains", _canon(
            {"kind": "gains", "instances": s.gain_instances, "layers": s.gain_layers, "devices": s.gain_devices,
             "positions": s.gain_positions, "heterogeneity": 1.0,
             "general_method": "brute" if s.gain_layers <= 8 and s.gain_devices <= 3 else "ilp",
             "time_limit": s.scaling_time_limit, **v})))
    if "largest" in figures:
        from .largest import family_files

        files = {name: profile_key(str(path))["sha256"] for name, path in family_files().items()}
        for fam in s.largest_families:
            for P in s.largest_devices:
                units.append(Unit(f"largest__{fam}__P{P}", "largest", _canon(
                    {"kind": "largest", "family": fam, "devices": P, "memory": s.largest_memory,
                     "time_limit": s.largest_time_limit, "ilp": s.largest_ilp, "profiles": files, **v})))
    if "scaling" in figures:
        for L in s.scaling_layers:
            units.append(Unit(f"complexity__scaling__L{L}", "scaling", _canon(
                {"kind": "scaling", "layers": L, "devices": s.scaling_devices, "seeds": s.scaling_seeds,
                 "time_limit": s.scaling_time_limit, "heterogeneity": 0.5, "memory_position": 0.3, **v})))
    return units


def plan_units(s: Settings, figures: Iterable[str] = FIGURES) -> list[Unit]:
    """The units the given figures need, cheapest first.

    Cheapest first, so an interrupted run already holds every baseline, then
    the complexity study, the contiguous ILPs, the scaling study and last the
    general ILPs (the time-outs).
    """
    figures = set(figures)
    units = _sweep_units(s) if figures & set(SWEEP_FIGURES) else []
    units += _complexity_units(s, figures)

    def cost(u: Unit) -> int:
        if u.kind == "sweep":
            return 2 if u.settings["method"] != "ilp" else (4 if u.settings["allocation"] == "contiguous" else 6)
        return {"three_partition": 3, "family": 3, "gains": 3, "largest": 4, "scaling": 5}.get(u.kind, 5)

    return sorted(units, key=cost)


# --------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------
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


def compute_unit(unit: Unit) -> pd.DataFrame:
    """Compute a unit's frame from its settings (no cache)."""
    st = unit.settings
    kind = unit.kind
    if kind == "sweep":
        return _sweep_frame(st)
    if kind == "three_partition":
        return _three_partition_frame(st["m"], st["count"], st["bound"], st["time_limit"])
    if kind == "family":
        return _family_frame(st["k"], st["time_limit"])
    if kind == "gains":
        return gain_distribution(st["instances"], n_layers=st["layers"], devices=st["devices"],
                                 heterogeneity=st["heterogeneity"], memory_positions=tuple(st["positions"]),
                                 general_method=st["general_method"], time_limit=st["time_limit"])
    if kind == "largest":
        from .largest import METHODS as LARGEST_METHODS, largest_table

        methods = tuple(m for m in LARGEST_METHODS if st["ilp"] or m[1] != "ilp")
        return largest_table((st["family"],), (st["devices"],), st["memory"], methods, time_limit=st["time_limit"])
    if kind == "scaling":
        return scaling_study((st["layers"],), tuple(st["devices"]), time_limit=st["time_limit"],
                             seeds=tuple(st["seeds"]), heterogeneity=st["heterogeneity"],
                             memory_position=st["memory_position"])
    raise ValueError(f"unknown unit kind {kind!r}")


def run_unit(unit: Unit, out: Path, *, force: bool = False) -> tuple[pd.DataFrame, bool]:
    """Load the unit if current, else compute and write it (CSV, then sidecar). Returns (frame, computed)."""
    out = Path(out)
    if not force:
        df = load_unit(unit, out)
        if df is not None:
            return df, False
    df = compute_unit(unit)
    path = unit.path(out)
    text = df.to_csv(index=False)
    write_text_atomic(path, text)
    meta = {"unit": unit.name, "settings": unit.settings, "rows": len(df), "sha256": _sha(text.encode()),
            "versions": versions()}
    write_text_atomic(_sidecar(path), json.dumps(meta, indent=1, sort_keys=True))
    # what comes back from the file is what later runs will read: return that
    return pd.read_csv(path), True


def run_unit_job(args: tuple[Unit, str]) -> tuple[str, bool]:
    """:func:`run_unit` for a worker process: takes and returns plain values."""
    unit, out = args
    _, computed = run_unit(unit, Path(out))
    return unit.name, computed


# --------------------------------------------------------------------------------------------
# What a unit computes
# --------------------------------------------------------------------------------------------
def _sweep_frame(st: dict[str, Any]) -> pd.DataFrame:
    from .profiles import load_profile

    digest = profile_key(st["network"])["sha256"]
    if digest != st["profile"]["sha256"]:  # the file changed since the units were planned
        raise ValueError(f"{st['network']}: the profile file changed while the run was going on; run again")
    chain = load_profile(st["network"])
    base = Platform(st["devices"], bandwidth=st["bandwidth"], weight_factor=st["weight_factor"], weights=st["weights"],
                    memory_model=st.get("memory_model", "paper"))
    rows = []
    for i, M in enumerate(st["memory_levels"]):
        r = run_method(chain, base.with_(memory=float(M)), st["method"], allocation=st["allocation"],
                       time_limit=st["time_limit"], deterministic=True)  # work budgets: same plans every run
        rows.append({"network": st["network"], "devices": st["devices"], "method_key": st["method_key"],
                     "level": i, "memory_limit": float(M), "least_memory": float(st["memory_levels"][0]),
                     "memory_relative": float(M) / float(st["memory_levels"][0]), "n_layers": len(chain),
                     "time_limit": st["time_limit"], **r})
    return pd.DataFrame(rows)


def _three_partition_frame(ms: Sequence[int], count: int, bound: int, time_limit: float) -> pd.DataFrame:
    rows = []
    for m in ms:
        for seed in range(count):
            for answer, gen in (("yes", three_partition_yes_instance), ("no", three_partition_no_instance)):
                nums = gen(m, bound, seed=seed)
                chain, plat = three_partition_instance(nums, bound)
                truth = is_three_partition_yes(nums, bound)
                for method in ("brute", "ilp"):
                    if method == "brute" and len(nums) > 8:
                        continue
                    r = run_method(chain, plat, method, allocation="general", time_limit=time_limit)
                    rows.append({"m": m, "seed": seed, "numbers": " ".join(map(str, nums)), "bound": bound,
                                 "generated_as": answer, "exhaustive_yes": truth, "method": method,
                                 "status": r["status"], "period": r["period"], "seconds": r["seconds"],
                                 "planner_says_yes": bool(r["status"] == "optimal" and abs(r["period"] - bound) <= TOL * bound)
                                 if r["status"] == "optimal" else None})
    return pd.DataFrame(rows)


def _family_frame(ks: Sequence[int], time_limit: float) -> pd.DataFrame:
    rows = []
    for k in ks:
        chain, plat = general_beats_contiguous_family(k)
        for method, alloc in (("dp", "contiguous"), ("ilp", "contiguous"), ("ilp", "general"), ("brute", "general")):
            if method == "brute" and (len(chain) > 8 or plat.devices > 3):
                continue
            r = run_method(chain, plat, method, allocation=alloc, time_limit=time_limit)
            rows.append({"k": k, "n_layers": len(chain), "devices": plat.devices, "method": method,
                         "allocation": alloc, "status": r["status"], "period": r["period"], "seconds": r["seconds"],
                         "predicted_factor": family_factor(k), "lower_bound": r["lower_bound"]})
    return pd.DataFrame(rows)
