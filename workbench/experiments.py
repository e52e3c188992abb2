"""Paper-style experiments: resumable sweeps, cached results, figures and a report (one command).

``python -m workbench reproduce [--quick] [--only NAME] [--out DIR]`` runs
:func:`reproduce`: every *unit* of work (one sweep of one method over the
memory levels of one network and device count; one piece of the complexity
study) is written to its own CSV under ``OUT/units/`` with a JSON sidecar
holding the settings and versions that made it and the CSV's SHA-256. Both
are written atomically, the CSV first, so an interrupted run loses at most
the unit in progress; a later run skips every unit whose sidecar matches the
settings and whose CSV matches its checksum, and recomputes the others
(missing, partial, corrupt or made with other settings).

Then the figures are rebuilt from the units: tidy CSV tables, HTML (plotly,
offline, self-contained) and PNG (kaleido; skipped with a warning when no
browser is available) under ``OUT/``, and ``OUT/report.md`` lists every
figure with its headline numbers.

Figures (names for ``--only``, comma-separated): ``throughput``, ``memory``,
``min_memory``, ``solve_times`` (from the sweeps), ``three_partition``,
``family``, ``scaling``, ``gains`` (the complexity study).

Environment: ``WORKBENCH_JOBS`` (worker processes for the units, default 1),
``WORKBENCH_QUICK=1`` (notebooks: the quick settings).

>>> sorted(FIGURES)[:3]
['family', 'gains', 'memory']
>>> settings_for(quick=True).devices
(2, 4)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import platform as _pyplatform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from .chain import Chain, Platform
from .complexity import (
    family_factor, gain_distribution, general_beats_contiguous_family, is_three_partition_yes, memory_levels,
    run_method, scaling_study, three_partition_instance, three_partition_no_instance, three_partition_yes_instance,
)
from .io import write_frame_atomic, write_text_atomic
from .paths import RESULTS_DIR

__all__ = [
    "Settings", "Report", "FigureInfo", "Unit", "METHOD_KEYS", "FIGURES", "settings_for", "plan_units",
    "run_unit", "load_unit", "unit_is_current", "reproduce", "reproduce_command", "sweep_frame",
    "min_memory_table", "bound_violations", "headline_gains", "versions", "notebook_report", "render_report",
]

#: method key -> (planner name, allocation), in legend order
METHOD_KEYS: dict[str, tuple[str, str]] = {
    "ilp-general": ("ilp", "general"),
    "ilp-contiguous": ("ilp", "contiguous"),
    "dp": ("dp", "contiguous"),
    "pipedream": ("pipedream", "contiguous"),
    "gpipe": ("gpipe", "contiguous"),
    "1f1b": ("1f1b", "contiguous"),
}
METHOD_LABELS = {
    "ilp-general": "general ILP", "ilp-contiguous": "contiguous ILP", "dp": "memory-aware DP",
    "pipedream": "PipeDream", "gpipe": "GPipe", "1f1b": "1F1B-flush",
}
SWEEP_FIGURES = ("throughput", "memory", "min_memory", "solve_times")
COMPLEXITY_FIGURES = ("three_partition", "family", "scaling", "gains")
FIGURES = SWEEP_FIGURES + COMPLEXITY_FIGURES
TOL = 1e-6
GiB = float(2**30)


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """Everything that determines the results (part of every unit's sidecar)."""

    networks: tuple[str, ...]
    devices: tuple[int, ...] = (2, 4, 8)
    n_levels: int = 6
    time_limit: float = 60.0
    general_time_limit: float = 20.0  # per general-ILP solve: the time-outs dominate the run
    methods: tuple[str, ...] = tuple(METHOD_KEYS)
    bandwidth: str = "12GB/s"
    weight_factor: float = 1.0
    weights: str = "stash"
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
                     family_k=(2, 3), quick=True)
    else:
        s = Settings(networks=())
    if "networks" not in overrides:
        overrides["networks"] = _default_networks(quick)
    return s.with_(**overrides)


def versions() -> dict[str, str]:
    """Versions of what made the results (workbench, python, numpy, pandas, pyomo, highspy), host and date."""
    out = {"python": sys.version.split()[0], "host": _pyplatform.node(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    for mod in ("workbench", "numpy", "pandas", "pyomo", "highspy", "plotly"):
        try:
            m = __import__(mod)
            v = getattr(m, "__version__", None)
            if v is None and mod == "highspy":
                from importlib.metadata import version

                v = version("highspy")
            out[mod] = str(v)
        except Exception:  # noqa: BLE001
            out[mod] = "unavailable"
    try:
        import subprocess

        from .paths import REPO_ROOT

        out["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                    text=True, timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        out["git"] = ""
    return out


# --------------------------------------------------------------------------------------------
# Units: one file per finished piece of work
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """One piece of work: its file (relative to ``OUT/units``), its settings and how to compute it."""

    name: str
    kind: str  # "sweep" | "three_partition" | "family" | "scaling" | "gains"
    settings: dict[str, Any] = field(hash=False, compare=False)

    def path(self, out: Path) -> Path:
        return Path(out) / "units" / f"{self.name}.csv"


def _slug(network: str) -> str:
    return network.replace("/", "-").replace(" ", "_")


def _platform(s: Settings, devices: int) -> Platform:
    return Platform(devices, bandwidth=s.bandwidth, weight_factor=s.weight_factor, weights=s.weights)


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


_LEVEL_CACHE: dict[tuple, list[float]] = {}


def _levels(s: Settings, network: str, devices: int) -> list[float]:
    key = (network, devices, s.n_levels, s.bandwidth, s.weight_factor, s.weights)
    if key not in _LEVEL_CACHE:
        from .profiles import load_profile

        chain = load_profile(network)
        meths = tuple(METHOD_KEYS[m][0] for m in s.methods if METHOD_KEYS[m][0] in ("dp", "pipedream", "gpipe", "1f1b"))
        _LEVEL_CACHE[key] = memory_levels(chain, _platform(s, devices), s.n_levels, methods=meths or ("dp",))
    return _LEVEL_CACHE[key]


def plan_units(s: Settings, figures: Iterable[str] = FIGURES) -> list[Unit]:
    """The units the given figures need, cheapest first within each group."""
    figures = set(figures)
    units: list[Unit] = []
    if figures & set(SWEEP_FIGURES):
        for net in s.networks:
            for P in s.devices:
                try:
                    lv = _levels(s, net, P)
                except Exception as e:  # noqa: BLE001
                    warnings.warn(f"{net}: cannot load or plan it ({type(e).__name__}: {e}); skipped")
                    break
                for mk in s.methods:
                    planner, alloc = METHOD_KEYS[mk]
                    st = {"kind": "sweep", "network": net, "devices": P, "method_key": mk, "method": planner,
                          "allocation": alloc, "memory_levels": lv, "bandwidth": s.bandwidth,
                          "weight_factor": s.weight_factor, "weights": s.weights,
                          "time_limit": (s.general_time_limit if alloc == "general" else s.time_limit)
                          if planner == "ilp" else None}
                    units.append(Unit(f"sweep__{_slug(net)}__P{P}__{mk}", "sweep", _canon(st)))
    if "three_partition" in figures:
        units.append(Unit("complexity__three_partition", "three_partition", _canon(
            {"kind": "three_partition", "m": s.three_partition_m, "count": s.three_partition_count, "bound": 20,
             "time_limit": s.scaling_time_limit})))
    if "family" in figures:
        units.append(Unit("complexity__family", "family", _canon(
            {"kind": "family", "k": s.family_k, "time_limit": s.scaling_time_limit})))
    if "gains" in figures:
        units.append(Unit("complexity__gains", "gains", _canon(
            {"kind": "gains", "instances": s.gain_instances, "layers": s.gain_layers, "devices": s.gain_devices,
             "positions": s.gain_positions, "heterogeneity": 1.0,
             "general_method": "brute" if s.gain_layers <= 8 and s.gain_devices <= 3 else "ilp",
             "time_limit": s.scaling_time_limit})))
    if "scaling" in figures:
        for L in s.scaling_layers:
            units.append(Unit(f"complexity__scaling__L{L}", "scaling", _canon(
                {"kind": "scaling", "layers": L, "devices": s.scaling_devices, "seeds": s.scaling_seeds,
                 "time_limit": s.scaling_time_limit, "heterogeneity": 0.5, "memory_position": 0.3})))
    # cheapest first, so an interrupted run already holds every baseline, then the complexity study,
    # the contiguous ILPs, the scaling study and last the general ILPs (the time-outs)
    def cost(u: Unit) -> int:
        if u.kind == "sweep":
            return 2 if u.settings["method"] != "ilp" else (4 if u.settings["allocation"] == "contiguous" else 6)
        return {"three_partition": 3, "family": 3, "gains": 3, "scaling": 5}.get(u.kind, 5)

    return sorted(units, key=cost)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def load_unit(unit: Unit, out: Path) -> pd.DataFrame | None:
    """The unit's cached frame if its file is complete and was made with the same settings, else None."""
    path = unit.path(out)
    side = _sidecar(path)
    try:
        meta = json.loads(side.read_text())
        data = path.read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("settings") != unit.settings or meta.get("sha256") != _sha(data):
        return None
    try:
        import io

        df = pd.read_csv(io.BytesIO(data))
    except Exception:  # noqa: BLE001
        return None
    if len(df) != meta.get("rows"):
        return None
    return df


def unit_is_current(unit: Unit, out: Path) -> bool:
    return load_unit(unit, out) is not None


def _compute_unit(unit: Unit) -> pd.DataFrame:
    st = unit.settings
    kind = unit.kind
    if kind == "sweep":
        from .profiles import load_profile

        chain = load_profile(st["network"])
        base = Platform(st["devices"], bandwidth=st["bandwidth"], weight_factor=st["weight_factor"],
                        weights=st["weights"])
        rows = []
        for i, M in enumerate(st["memory_levels"]):
            r = run_method(chain, base.with_(memory=float(M)), st["method"], allocation=st["allocation"],
                           time_limit=st["time_limit"], deterministic=True)  # work budgets: same plans every run
            rows.append({"network": st["network"], "devices": st["devices"], "method_key": st["method_key"],
                         "level": i, "memory_limit": float(M), "least_memory": float(st["memory_levels"][0]),
                         "memory_relative": float(M) / float(st["memory_levels"][0]), "n_layers": len(chain),
                         "time_limit": st["time_limit"], **r})
        return pd.DataFrame(rows)
    if kind == "three_partition":
        return _three_partition_frame(st["m"], st["count"], st["bound"], st["time_limit"])
    if kind == "family":
        return _family_frame(st["k"], st["time_limit"])
    if kind == "gains":
        return gain_distribution(st["instances"], n_layers=st["layers"], devices=st["devices"],
                                 heterogeneity=st["heterogeneity"], memory_positions=tuple(st["positions"]),
                                 general_method=st["general_method"], time_limit=st["time_limit"])
    if kind == "scaling":
        return scaling_study((st["layers"],), tuple(st["devices"]), time_limit=st["time_limit"],
                             seeds=tuple(st["seeds"]), heterogeneity=st["heterogeneity"],
                             memory_position=st["memory_position"])
    raise ValueError(f"unknown unit kind {kind!r}")


def run_unit(unit: Unit, out: Path, *, force: bool = False) -> tuple[pd.DataFrame, bool]:
    """Load the unit if current, else compute and write it. Returns (frame, computed)."""
    out = Path(out)
    if not force:
        df = load_unit(unit, out)
        if df is not None:
            return df, False
    df = _compute_unit(unit)
    path = unit.path(out)
    text = df.to_csv(index=False)
    write_text_atomic(path, text)
    meta = {"unit": unit.name, "settings": unit.settings, "rows": len(df), "sha256": _sha(text.encode()),
            "versions": versions()}
    write_text_atomic(_sidecar(path), json.dumps(meta, indent=1, sort_keys=True))
    # what comes back from the file is what later runs will read: return that
    return pd.read_csv(path), True


def _run_unit_job(args: tuple[Unit, str]) -> tuple[str, bool]:
    unit, out = args
    _, computed = run_unit(unit, Path(out))
    return unit.name, computed


# --------------------------------------------------------------------------------------------
# Complexity frames
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# Tables derived from the sweeps
# --------------------------------------------------------------------------------------------
def sweep_frame(out: Path, units: Sequence[Unit] | None = None) -> pd.DataFrame:
    """All sweep units under ``out/units`` (or the given ones) in one tidy frame."""
    out = Path(out)
    frames = []
    if units is None:
        paths = sorted((out / "units").glob("sweep__*.csv"))
        frames = [pd.read_csv(p) for p in paths]
    else:
        for u in units:
            if u.kind == "sweep":
                df = load_unit(u, out)
                if df is not None:
                    frames.append(df)
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    df["label"] = df["method_key"].map(METHOD_LABELS).fillna(df["method_key"])
    return df


def min_memory_table(sweeps: pd.DataFrame, fraction: float = 0.95) -> pd.DataFrame:
    """Per (network, devices, method): the least memory level reaching ``fraction`` of the best throughput.

    The best is the largest throughput of any method at any level that fits
    (for that network and device count). NaN where the method never reaches it.
    """
    rows = []
    if sweeps.empty:
        return pd.DataFrame(rows)
    ok = sweeps[sweeps["fits"].astype(bool)]
    for (net, P), g in sweeps.groupby(["network", "devices"], sort=False):
        best = ok[(ok.network == net) & (ok.devices == P)]["throughput"].max()
        for mk, gm in g.groupby("method_key", sort=False):
            good = gm[gm["fits"].astype(bool) & (gm["throughput"] >= fraction * best * (1 - TOL))]
            m = float(good["memory_limit"].min()) if len(good) else math.nan
            least = float(gm["least_memory"].iloc[0])
            rows.append({"network": net, "devices": P, "method_key": mk, "label": METHOD_LABELS.get(mk, mk),
                         "best_throughput": best, "fraction": fraction, "min_memory": m,
                         "min_memory_gib": m / GiB, "min_memory_relative": m / least})
    return pd.DataFrame(rows)


def bound_violations(sweeps: pd.DataFrame) -> list[str]:
    """What the results must satisfy; returns a line per violation (empty: all good).

    * no plan that fits beats the lower bound;
    * the general ILP's throughput >= the contiguous ILP's where both are optimal;
    * an optimal ILP >= every periodic baseline that fits (contiguous ILP vs
      dp and pipedream; general ILP vs all periodic ones). Flushed schedules
      (GPipe, 1F1B-flush) are another model (one weight version, no stashing,
      simulated memory) and can beat the periodic optimum at mid memory: the
      throughput figure's headlines count those cases;
    * more memory never hurts an exact method (dp, optimal ILPs).
    """
    bad: list[str] = []
    if sweeps.empty:
        return bad
    fits = sweeps[sweeps["fits"].astype(bool)]
    below = fits[fits["period"] < fits["lower_bound"] * (1 - TOL)]
    for _, r in below.iterrows():
        bad.append(f"{r.network} P={r.devices} level {r.level} {r.method_key}: period {r.period} < bound {r.lower_bound}")
    key = ["network", "devices", "level"]
    for (net, P, lvl), g in fits.groupby(key):
        by = {r.method_key: r for _, r in g.iterrows()}
        gen, con = by.get("ilp-general"), by.get("ilp-contiguous")
        if gen is not None and con is not None and gen.status == "optimal" and con.status == "optimal":
            if gen.period > con.period * (1 + 1e-5):
                bad.append(f"{net} P={P} level {lvl}: general ILP {gen.period} worse than contiguous ILP {con.period}")
        for ilp_key, rivals in (("ilp-contiguous", ("dp", "pipedream")),
                                ("ilp-general", ("ilp-contiguous", "dp", "pipedream"))):
            ilp = by.get(ilp_key)
            if ilp is None or ilp.status != "optimal":
                continue
            for rk in rivals:
                r = by.get(rk)
                if r is not None and ilp.period > r.period * (1 + 1e-5):
                    bad.append(f"{net} P={P} level {lvl}: optimal {ilp_key} period {ilp.period} worse than {rk} {r.period}")
    for (net, P, mk), g in sweeps.groupby(["network", "devices", "method_key"]):
        g = g.sort_values("level")
        exact = g[(g["status"] == "optimal") & g["fits"].astype(bool)] if mk in ("dp", "ilp-general", "ilp-contiguous") else g.iloc[0:0]
        per = exact["period"].to_numpy()
        if len(per) > 1 and np.any(np.diff(per) > per[1:] * 1e-5):
            bad.append(f"{net} P={P} {mk}: exact periods grow with memory: {list(per)}")
    return bad


def _tight_levels(sweeps: pd.DataFrame) -> pd.DataFrame:
    n = int(sweeps["level"].max()) + 1 if len(sweeps) else 0
    ntight = max(1, math.ceil(n / 2))
    return sweeps[sweeps["level"] < ntight]


def headline_gains(sweeps: pd.DataFrame, over: str = "pipedream", of: str = "ilp-general") -> pd.DataFrame:
    """Per network: gain (throughput ratio) of ``of`` over ``over`` at tight memory (lower half of the levels).

    Columns: median and best gain where both fit, the number of (P, level)
    cases, and how many of them ``over`` did not fit while ``of`` did.
    """
    rows = []
    if sweeps.empty:
        return pd.DataFrame(rows)
    tight = _tight_levels(sweeps)
    for net, g in tight.groupby("network", sort=False):
        a = g[g.method_key == of].set_index(["devices", "level"])
        b = g[g.method_key == over].set_index(["devices", "level"])
        idx = a.index.intersection(b.index)
        gains, nofit = [], 0
        for i in idx:
            fa, fb = bool(a.loc[i, "fits"]), bool(b.loc[i, "fits"])
            if fa and fb:
                gains.append(float(b.loc[i, "period"]) / float(a.loc[i, "period"]))
            elif fa and not fb:
                nofit += 1
        rows.append({"network": net, "of": of, "over": over, "cases": len(idx),
                     "median_gain": float(np.median(gains)) if gains else math.nan,
                     "best_gain": float(np.max(gains)) if gains else math.nan,
                     "both_fit": len(gains), "over_does_not_fit": nofit})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Figures (minimal plotly of our own)
# --------------------------------------------------------------------------------------------
@dataclass
class FigureInfo:
    name: str
    title: str
    files: list[str] = field(default_factory=list)
    headlines: list[str] = field(default_factory=list)
    figs: list = field(default_factory=list, repr=False)  # the plotly figures, for notebooks


@dataclass
class Report:
    """What :func:`reproduce` did and wrote."""

    out: Path
    settings: Settings
    figures: list[FigureInfo] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    png: bool = True

    @property
    def report_path(self) -> Path:
        return Path(self.out) / "report.md"


def _save(fig: Any, out: Path, stem: str, info: FigureInfo, pngs: list) -> None:
    html = out / f"{stem}.html"
    js = out / "plotly.min.js"  # offline: one shared copy of plotly.js beside the pages
    if not js.exists():
        from plotly.offline import get_plotlyjs

        write_text_atomic(js, get_plotlyjs())
    write_text_atomic(html, fig.to_html(include_plotlyjs="directory", full_html=True))
    info.files.append(html.name)
    info.figs.append(fig)
    pngs.append((fig, out / f"{stem}.png", info))


def _write_pngs(pngs: list, report: Report) -> None:
    if not pngs:
        return
    try:
        import plotly.io as pio

        figs = [f for f, _, _ in pngs]
        paths = [str(p) for _, p, _ in pngs]
        if hasattr(pio, "write_images"):
            pio.write_images(figs, paths, width=1000, height=600)
        else:  # pragma: no cover
            for f, p in zip(figs, paths):
                f.write_image(p, width=1000, height=600)
        for _, p, info in pngs:
            if Path(p).exists():
                info.files.append(Path(p).name)
    except Exception as e:  # noqa: BLE001 - no Chromium, no kaleido: HTML is still there
        msg = (f"PNG export skipped ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
               "install Chrome/Chromium for kaleido (plotly_get_chrome) to get PNGs; HTML and CSV are complete")
        warnings.warn(msg)
        report.warnings.append(msg)
        report.png = False


def _x(v: float) -> str:
    return f"{v:.3g}x" if math.isfinite(v) else "n/a (no case where both fit)"


def _fig_throughput(sw: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("throughput", "Throughput (normalised by the lower bound) against the memory limit")
    d = sw.copy()
    d["normalised"] = np.where(d["fits"].astype(bool), d["normalised_throughput"], np.nan)
    d["memory_gib"] = d["memory_limit"] / GiB
    write_frame_atomic(out / "throughput.csv", d.drop(columns=["note"], errors="ignore"))
    info.files.append("throughput.csv")
    for net, g in d.groupby("network", sort=False):
        fig = px.line(g.sort_values("memory_limit"), x="memory_gib", y="normalised", color="label", facet_col="devices",
                      markers=True, log_x=True, category_orders={"label": list(METHOD_LABELS.values())},
                      labels={"memory_gib": "memory limit per device (GiB)", "normalised": "lower bound / period",
                              "label": "method", "devices": "P"},
                      title=f"{net}: throughput / upper bound against memory (missing points: no plan fits)")
        fig.update_xaxes(matches=None)
        fig.update_yaxes(range=[0, 1.05])
        _save(fig, out, f"throughput_{_slug(net)}", info, pngs)
    hg = headline_gains(sw)
    for _, r in hg[hg.cases > 0].iterrows() if len(hg) else []:
        info.headlines.append(
            f"{r.network}: general ILP over PipeDream at tight memory (lower half of the levels, {r.cases} (P, level) "
            f"cases): median gain {_x(r.median_gain)}, best {_x(r.best_gain)} over the {r.both_fit} where both fit; "
            f"PipeDream's partitioner finds nothing that fits in {r.over_does_not_fit} of them")
    flushed_wins = []
    for (net, P, lvl), g in sw[sw.fits.astype(bool)].groupby(["network", "devices", "level"]):
        ilp = g[g.method_key.isin(["ilp-general", "ilp-contiguous"]) & (g.status == "optimal")]
        fl = g[g.method_key.isin(["gpipe", "1f1b"])]
        if len(ilp) and len(fl) and fl.period.min() < ilp.period.min() * (1 - 1e-5):
            flushed_wins.append(f"{net} P={P} level {lvl} ({fl.period.min() / ilp.period.min():.3g}x the period)")
    if flushed_wins:
        info.headlines.append(
            f"a flushed schedule that fits beats the optimal periodic ILP in {len(flushed_wins)} cases: "
            + "; ".join(flushed_wins[:6]) + ("..." if len(flushed_wins) > 6 else "")
            + ". Not a bound violation: the ILP is optimal among periodic plans with weight stashing (one weight "
              "version per in-flight mini-batch), while GPipe/1F1B-flush keep a single weight version")
    hd = headline_gains(sw, over="pipedream", of="dp")
    for _, r in hd[hd.cases > 0].iterrows() if len(hd) else []:
        info.headlines.append(f"{r.network}: memory-aware DP over PipeDream at tight memory: median {_x(r.median_gain)}, "
                              f"best {_x(r.best_gain)}; PipeDream does not fit in {r.over_does_not_fit}/{r.cases}")
    return info


def _fig_memory(sw: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px
    import plotly.graph_objects as go

    info = FigureInfo("memory", "Memory per device of the chosen plans (largest P, middle memory level)")
    rows = []
    for (net, P, lvl, mk), g in sw.groupby(["network", "devices", "level", "method_key"], sort=False):
        r = g.iloc[0]
        if not isinstance(r.memory_per_device, str) or not r.memory_per_device:
            continue
        for dev, m in enumerate(float(x) for x in r.memory_per_device.split(";")):
            rows.append({"network": net, "devices": P, "level": lvl, "method_key": mk, "label": r.label,
                         "device": dev, "memory": m, "memory_gib": m / GiB, "memory_limit": r.memory_limit,
                         "fits": bool(r.fits)})
    d = pd.DataFrame(rows)
    write_frame_atomic(out / "memory_per_device.csv", d)
    info.files.append("memory_per_device.csv")
    if d.empty:
        return info
    for net, g in d.groupby("network", sort=False):
        P = int(g["devices"].max())
        lvl = int(sw[(sw.network == net) & (sw.devices == P)]["level"].max()) // 2
        gg = g[(g.devices == P) & (g.level == lvl)]
        if gg.empty:
            continue
        limit = float(gg["memory_limit"].iloc[0])
        fig = px.bar(gg, x="device", y="memory_gib", color="label", barmode="group",
                     category_orders={"label": list(METHOD_LABELS.values())},
                     labels={"memory_gib": "memory (GiB)", "label": "method"},
                     title=f"{net}, P={P}: memory per device at limit {limit / GiB:.3g} GiB (dashed)")
        fig.add_hline(y=limit / GiB, line_dash="dash")
        _save(fig, out, f"memory_{_slug(net)}", info, pngs)
        over = gg[~gg.fits]["label"].unique()
        info.headlines.append(f"{net}, P={P}, limit {limit / GiB:.3g} GiB: peak per method "
                              + ", ".join(f"{l} {m:.3g} GiB" for l, m in gg.groupby("label")["memory_gib"].max().items())
                              + (f"; over the limit (flushed schedules ignore it): {', '.join(over)}" if len(over) else ""))
    return info


def _fig_min_memory(sw: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("min_memory", "Least memory (of the levels tried) to reach 95% of the best throughput")
    t = min_memory_table(sw)
    write_frame_atomic(out / "min_memory.csv", t)
    info.files.append("min_memory.csv")
    if t.empty:
        return info
    fig = px.bar(t, x="network", y="min_memory_relative", color="label", barmode="group", facet_row="devices",
                 category_orders={"label": list(METHOD_LABELS.values())},
                 labels={"min_memory_relative": "memory / least feasible", "label": "method", "devices": "P"},
                 title="Least memory reaching 95% of the best throughput (relative to the least feasible; missing: never)")
    _save(fig, out, "min_memory", info, pngs)
    for (net, P), g in t.groupby(["network", "devices"], sort=False):
        info.headlines.append(f"{net}, P={P}: " + ", ".join(
            f"{r.label} {r.min_memory_relative:.3g}x" if math.isfinite(r.min_memory_relative) else f"{r.label} never"
            for _, r in g.iterrows()))
    return info


def _fig_solve_times(sw: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("solve_times", "Solve times per method")
    d = sw[["network", "devices", "level", "method_key", "label", "status", "seconds", "timed_out"]].copy()
    write_frame_atomic(out / "solve_times.csv", d)
    info.files.append("solve_times.csv")
    d["outcome"] = np.where(d["timed_out"].astype(bool), "time-out", d["status"])
    fig = px.scatter(d, x="label", y="seconds", color="network", symbol="outcome", log_y=True,
                   category_orders={"label": list(METHOD_LABELS.values())},
                   labels={"label": "method", "seconds": "solve time (s)"},
                   title="Solve time per plan (log scale; symbol: time-out)")
    _save(fig, out, "solve_times", info, pngs)
    for mk, g in d.groupby("label", sort=False):
        info.headlines.append(f"{mk}: median {g.seconds.median():.3g} s, max {g.seconds.max():.3g} s, "
                              f"time-outs {int(g.timed_out.astype(bool).sum())}/{len(g)}")
    return info


def _fig_three_partition(df: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("three_partition", "3-PARTITION reduction: optimal general period / B, yes and no instances")
    write_frame_atomic(out / "three_partition.csv", df)
    info.files.append("three_partition.csv")
    d = df.copy()
    d["period_over_B"] = d["period"] / d["bound"]
    d["instance"] = d["generated_as"] + " m=" + d["m"].astype(str) + " #" + d["seed"].astype(str)
    fig = px.scatter(d, x="instance", y="period_over_B", color="method", symbol="status",
                     labels={"period_over_B": "optimal period / B"},
                     title="3-PARTITION to the no-memory general problem: period = B exactly for yes instances")
    fig.add_hline(y=1.0, line_dash="dash")
    _save(fig, out, "three_partition", info, pngs)
    for meth, g in d.groupby("method"):
        dec = g[g.status == "optimal"]
        agree = int((dec["planner_says_yes"].astype(bool) == dec["exhaustive_yes"].astype(bool)).sum())
        info.headlines.append(f"{meth}: decides {len(dec)}/{len(g)} instances, agrees with exhaustive search on {agree}/{len(dec)}")
    return info


def _fig_family(df: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("family", "A family where general allocations win by a factor k")
    write_frame_atomic(out / "family.csv", df)
    info.files.append("family.csv")
    rows = []
    for k, g in df.groupby("k"):
        by = {(r.method, r.allocation): r for _, r in g.iterrows()}
        cont = by.get(("dp", "contiguous"))
        for key in (("ilp", "general"), ("brute", "general")):
            gen = by.get(key)
            if cont is not None and gen is not None and gen.status == "optimal":
                rows.append({"k": k, "general_method": key[0], "measured_factor": cont.period / gen.period,
                             "predicted_factor": family_factor(int(k))})
    f = pd.DataFrame(rows)
    if not f.empty:
        fig = px.line(f, x="k", y="measured_factor", color="general_method", markers=True,
                      labels={"measured_factor": "contiguous period / general period"},
                      title="general vs contiguous optimum on the family (dashed: predicted factor k)")
        fig.add_scatter(x=f["k"], y=f["predicted_factor"], mode="lines", line_dash="dash", name="predicted")
        _save(fig, out, "family", info, pngs)
        for _, r in f.iterrows():
            info.headlines.append(f"k={r.k}: measured factor {r.measured_factor:.4g} ({r.general_method}), predicted {r.predicted_factor:g}")
    return info


def _fig_scaling(df: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("scaling", "Solve time against layers and devices (log scale, time-outs marked)")
    write_frame_atomic(out / "scaling.csv", df.drop(columns=["note"], errors="ignore"))
    info.files.append("scaling.csv")
    d = df.copy()
    d["solver"] = d["method"] + " " + d["allocation"]
    d["outcome"] = np.where(d["timed_out"].astype(bool), "time-out", d["status"])
    fig = px.scatter(d, x="n_layers", y="seconds", color="solver", symbol="outcome", facet_col="devices", log_y=True,
                     labels={"n_layers": "layers", "seconds": "solve time (s)", "devices": "P"},
                     title="Solve time against layers and devices (symbol: time-out)")
    _save(fig, out, "scaling", info, pngs)
    for (solver, P), g in d.groupby(["solver", "devices"]):
        to = g[g.timed_out.astype(bool)]
        first = int(to.n_layers.min()) if len(to) else None
        info.headlines.append(f"{solver}, P={P}: max {g.seconds.max():.3g} s; "
                              + (f"first time-out at {first} layers" if first else "no time-out"))
    return info


def _fig_gains(df: pd.DataFrame, out: Path, pngs: list) -> FigureInfo:
    import plotly.express as px

    info = FigureInfo("gains", "Gains over random instances: general over contiguous, memory-aware DP over PipeDream")
    write_frame_atomic(out / "gains.csv", df)
    info.files.append("gains.csv")
    long = pd.concat([
        pd.DataFrame({"memory_position": df.memory_position, "gain": df.gain_general, "what": "general / contiguous"}),
        pd.DataFrame({"memory_position": df.memory_position,
                      "gain": df.gain_dp_over_pipedream.replace(np.inf, np.nan), "what": "memory-aware DP / PipeDream"}),
    ])
    fig = px.box(long, x="memory_position", y="gain", color="what", points="all",
                 labels={"memory_position": "memory limit (0 = least feasible, 1 = unlimited, log scale)",
                         "gain": "throughput gain"},
                 title="Throughput gains over random chains (PipeDream infeasible cases not shown; see report)")
    _save(fig, out, "gains", info, pngs)
    for pos, g in df.groupby("memory_position"):
        gg = g.gain_general.dropna()
        gd = g.gain_dp_over_pipedream.replace(np.inf, np.nan).dropna()
        nofit = int(np.isinf(g.gain_dp_over_pipedream).sum())
        info.headlines.append(
            f"memory position {pos:g}: general/contiguous median {gg.median():.3g}x, best {gg.max():.3g}x, >1 in "
            f"{int((gg > 1 + 1e-6).sum())}/{len(gg)}; DP/PipeDream median {gd.median():.3g}x, best {gd.max():.3g}x, "
            f"PipeDream infeasible in {nofit}/{len(g)}")
    return info


# --------------------------------------------------------------------------------------------
# The one command
# --------------------------------------------------------------------------------------------
def _parse_only(only: str | None) -> tuple[str, ...]:
    if not only:
        return FIGURES
    names = tuple(n.strip() for n in only.split(",") if n.strip())
    bad = [n for n in names if n not in FIGURES]
    if bad:
        raise ValueError(f"unknown figure(s) {bad}; choose from {', '.join(FIGURES)}")
    return names


def reproduce(quick: bool = False, only: str | None = None, out: Path | str | None = None, *,
              settings: Settings | None = None, jobs: int | None = None, progress: bool = True,
              png: bool = True, compute: bool = True) -> Report:
    """Recompute (or load) every unit the figures need, then write the figures and ``report.md``.

    ``settings`` overrides :func:`settings_for` (tests use tiny ones);
    ``jobs`` worker processes (default ``$WORKBENCH_JOBS`` or 1); ``png=False`` skips the PNG export
    (as does ``$WORKBENCH_NO_PNG=1``). ``compute=False`` computes nothing: the figures show the
    units already on disk (notebooks reading a partial full run).
    """
    t0 = time.perf_counter()
    out = Path(out) if out is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    s = settings or settings_for(quick)
    figs = _parse_only(only)
    report = Report(out=out, settings=s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        units = plan_units(s, figs)
    report.warnings += [str(w.message) for w in caught]
    jobs = int(jobs if jobs is not None else os.environ.get("WORKBENCH_JOBS", "1") or 1)
    current = [u for u in units if unit_is_current(u, out)]
    todo = [u for u in units if u not in current] if compute else []
    report.skipped = [u.name for u in current]
    report.missing = [u.name for u in units if u not in current and u not in todo]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(units), initial=len(units) - len(todo), desc="reproduce", unit="unit",
                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
    try:
        if jobs > 1 and len(todo) > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(jobs) as ex:
                futs = {ex.submit(_run_unit_job, (u, str(out))): u for u in todo}
                for f in as_completed(futs):
                    name, computed = f.result()
                    report.computed.append(name)
                    if bar is not None:
                        bar.set_postfix_str(name[-40:])
                        bar.update(1)
        else:
            for u in todo:
                if bar is not None:
                    bar.set_postfix_str(u.name[-40:])
                run_unit(u, out)
                report.computed.append(u.name)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    pngs: list = []
    sweep_units = [u for u in units if u.kind == "sweep"]
    if sweep_units:
        sw = sweep_frame(out, sweep_units)
        if not sw.empty:
            report.violations = bound_violations(sw)
            makers = {"throughput": _fig_throughput, "memory": _fig_memory, "min_memory": _fig_min_memory,
                      "solve_times": _fig_solve_times}
            for name in SWEEP_FIGURES:
                if name in figs:
                    report.figures.append(makers[name](sw, out, pngs))
    comp = {"three_partition": _fig_three_partition, "family": _fig_family, "gains": _fig_gains}
    for name, maker in comp.items():
        if name in figs:
            u = next(u for u in units if u.kind == name)
            df = load_unit(u, out)
            if df is not None:
                report.figures.append(maker(df, out, pngs))
    if "scaling" in figs:
        frames = [load_unit(u, out) for u in units if u.kind == "scaling"]
        frames = [f for f in frames if f is not None]
        if frames:
            report.figures.append(_fig_scaling(pd.concat(frames, ignore_index=True), out, pngs))
    if png and os.environ.get("WORKBENCH_NO_PNG", "") not in ("1", "true", "yes"):
        _write_pngs(pngs, report)
    else:
        report.png = False
    report.seconds = time.perf_counter() - t0
    write_text_atomic(report.report_path, render_report(report))
    return report


def notebook_report(only: str | None = None, *, quick: bool | None = None, out: Path | str | None = None) -> Report:
    """For the notebooks: the figures of ``only``, from cached results or a small quick run.

    ``quick`` (default: ``$WORKBENCH_QUICK`` is set) computes a reduced quick
    setting (one network, P = 2, a small complexity study) into ``out``
    (default a temporary folder), without PNGs. Otherwise it reads the units
    already in ``out`` (default ``data/results``) made with the full settings
    and computes nothing; run ``python -m workbench reproduce`` to fill them.
    """
    if quick is None:
        quick = os.environ.get("WORKBENCH_QUICK", "") not in ("", "0", "false", "no")
    if quick:
        import tempfile

        base = settings_for(quick=True)
        s = base.with_(networks=base.networks[:1], devices=(2,), scaling_layers=(4, 6), gain_instances=6,
                       gain_layers=5)
        out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="workbench-nb-"))
        return reproduce(True, only, out, settings=s, progress=False, png=False)
    return reproduce(False, only, out, progress=False, png=False, compute=False)


def render_report(report: Report) -> str:
    s = report.settings
    v = versions()
    lines = [
        "# Experiments: pipelined model parallelism under memory limits",
        "",
        f"Made by `python -m workbench reproduce{' --quick' if s.quick else ''}` on {v['date']} "
        f"(workbench {v['workbench']}, git {v['git']}, pyomo {v['pyomo']}, highspy {v['highspy']}, host {v['host']}); "
        f"{len(report.computed)} units computed, {len(report.skipped)} loaded from cache, {report.seconds:.0f} s.",
        "",
        f"Settings: networks {', '.join(s.networks)}; P in {list(s.devices)}; {s.n_levels} memory levels from the least "
        f"feasible (contiguous) to unlimited; ILP time limit {s.time_limit:g} s per contiguous and {s.general_time_limit:g} s per general solve (networks over 32 layers are "
        f"solved on 32 blocks, see workbench.planners.coarsen); bandwidth {s.bandwidth}, weight factor {s.weight_factor:g}, "
        f"weights {s.weights}. Complexity: scaling L in {list(s.scaling_layers)}, P in {list(s.scaling_devices)}, "
        f"time limit {s.scaling_time_limit:g} s; {s.gain_instances} random instances of {s.gain_layers} layers on "
        f"{s.gain_devices} devices for the gains.",
        "",
        "Per-unit results (one CSV per unit with a JSON sidecar: settings, versions, checksum) are in `units/`.",
        "",
    ]
    if report.violations:
        lines += ["## Bound violations", ""] + [f"- {b}" for b in report.violations] + [""]
    else:
        lines += ["All bound checks pass (no plan beats the lower bound; general ILP >= contiguous ILP where both are "
                  "optimal; an optimal ILP >= every periodic baseline that fits; exact methods never lose from more memory).", ""]
    if report.missing:
        lines += [f"**Partial results**: {len(report.missing)} of {len(report.missing) + len(report.skipped) + len(report.computed)} "
                  "units are not computed yet; the figures below leave them out. Run `python -m workbench reproduce` "
                  "to compute them (it resumes where it stopped). Missing:", ""]
        lines += [f"- `{m}`" for m in report.missing] + [""]
    for w in report.warnings:
        lines += [f"> warning: {w}", ""]
    for f in report.figures:
        lines += [f"## {f.name}: {f.title}", "", "Files: " + ", ".join(f"`{x}`" for x in f.files), ""]
        lines += [f"- {h}" for h in f.headlines] + [""]
    return "\n".join(lines)


def reproduce_command(args: Any) -> int:
    """CLI handler: ``python -m workbench reproduce [--quick] [--only NAME] [--out DIR]``."""
    try:
        rep = reproduce(quick=bool(getattr(args, "quick", False)), only=getattr(args, "only", None),
                        out=getattr(args, "out", None))
    except ValueError as e:
        print(f"reproduce: {e}", file=sys.stderr)
        return 2
    print(f"wrote {rep.report_path} ({len(rep.figures)} figures, {len(rep.computed)} units computed, "
          f"{len(rep.skipped)} from cache, {rep.seconds:.0f} s)")
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if rep.violations:
        print(f"{len(rep.violations)} bound violation(s); see the report", file=sys.stderr)
        return 1
    return 0
