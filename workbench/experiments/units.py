"""The experiments' units of work: what each one is, and its key.

A *unit* is one sweep of one method over the memory levels of one network
and device count, or one piece of the complexity study. Its *key* (the
unit's ``settings``) holds everything that determines the result
(docs/model.md, "Cached results"): the settings, the SHA-256 of the profile
file a sweep reads, and :func:`~workbench.experiments.provenance.code_version` (the model
code). :mod:`workbench.experiments.cache` stores finished units under their
key; :mod:`workbench.experiments.sweeps` computes them.

>>> from workbench.experiments.settings import settings_for
>>> s = settings_for(quick=True, networks=("resnet50",), devices=(2,))
>>> [u.name for u in plan_units(s, ["throughput"])][:2]
['sweep__resnet50__P2__dp', 'sweep__resnet50__P2__pipedream']
>>> sorted(plan_units(s, ["throughput"])[0].settings["profile"])
['file', 'sha256']
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from workbench.experiments.complexity import memory_levels
from workbench.experiments.provenance import code_version, file_digest
from workbench.experiments.settings import FIGURES, METHOD_KEYS, SWEEP_FIGURES, Settings, platform_for
from workbench.methods import method

__all__ = ["Unit", "plan_units", "profile_key", "slug"]


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
    from workbench.paths import REPO_ROOT
    from workbench.profiles import resolve_profile

    path = Path(resolve_profile(network)).resolve()
    try:
        shown = path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        shown = str(path)
    return {"file": shown, "sha256": file_digest(path)}


_LEVEL_CACHE: dict[tuple, list[float]] = {}


def _level_methods(s: Settings) -> tuple[str, ...]:
    """The sweep's planners whose unconstrained peak sets the top memory level: the checked baselines and the
    flushed schedules (:class:`workbench.methods.Method`)."""
    planners = (method(METHOD_KEYS[k][0]) for k in s.methods)
    return tuple(m.name for m in planners if m.baseline or m.family == "flushed")


def _levels(s: Settings, network: str, devices: int, digest: str) -> list[float]:
    key = (network, digest, code_version(), devices, s.n_levels, s.bandwidth, s.weight_factor, s.weights,
           s.memory_model, s.methods)
    if key not in _LEVEL_CACHE:
        from workbench.profiles import load_profile

        chain = load_profile(network)
        _LEVEL_CACHE[key] = memory_levels(chain, platform_for(s, devices), s.n_levels,
                                          methods=_level_methods(s) or ("dp",))
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
        # the exhaustive search where it is quick (up to 8 layers on 3 devices), else the ILP
        general = "brute" if s.gain_layers <= 8 and s.gain_devices <= 3 else "ilp"
        units.append(Unit("complexity__gains", "gains", _canon(
            {"kind": "gains", "instances": s.gain_instances, "layers": s.gain_layers, "devices": s.gain_devices,
             "positions": s.gain_positions, "heterogeneity": 1.0, "general_method": general,
             "time_limit": s.scaling_time_limit, **v})))
    if "largest" in figures:
        from workbench.experiments.largest import family_files

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
