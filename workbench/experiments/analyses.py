"""The analyses of the sweeps' results: one table, the checks they must pass, and the tables derived from them.

:func:`sweep_frame` gathers the sweep units (one row per network, device
count, method and memory level) with the key columns of each unit's sidecar
(``profile_sha256``, ``code_version``). :func:`bound_violations` is what the
report's checks run: first that every (network, P) group compares like with
like (one profile version, one code version, one lower bound, the same
memory levels: :func:`consistency_violations`), then the bounds within each
consistent group.

>>> import pandas as pd
>>> rows = [{"network": "n", "devices": 2, "level": 0, "method_key": m, "memory_limit": 1.0, "lower_bound": b,
...          "period": p, "fits": True, "status": "optimal", "n_layers": 4} for m, b, p in
...         (("dp", 1.0, 2.0), ("ilp-general", 0.5, 0.9))]
>>> consistency_violations(pd.DataFrame(rows))
['n P=2: the units disagree on lower_bound (0.5 in ilp-general; 1 in dp): they were made from different inputs']
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from workbench.experiments.cache import read_unit
from workbench.experiments.settings import METHOD_LABELS, TOL
from workbench.experiments.units import Unit
from workbench.methods import VARIANTS, method

__all__ = ["may_vary", "sweep_frame", "sweep_table", "consistency_violations", "bound_violations", "min_memory_table",
           "headline_gains",
           "tight_levels", "GiB", "KEY_COLUMNS"]

GiB = float(2**30)
#: the sweep variants whose method is exact: more memory must never make them slower
_EXACT = frozenset(v.key for v in VARIANTS if method(v.method).exact)
#: per (network, P) group, columns that must take one value (relative tolerance TOL for numbers)
KEY_COLUMNS = ("profile_sha256", "code_version", "n_layers", "lower_bound")


def _with_key_columns(df: pd.DataFrame, settings: dict) -> pd.DataFrame:
    df = df.copy()
    df["profile_sha256"] = (settings.get("profile") or {}).get("sha256", "")
    df["code_version"] = settings.get("code_version", "")
    return df


def sweep_table(pairs: Iterable[tuple[Unit, pd.DataFrame]]) -> pd.DataFrame:
    """Sweep units' frames in one table, with their key columns and the methods' labels."""
    frames = [_with_key_columns(df, u.settings) for u, df in pairs if u.kind == "sweep"]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    df["label"] = df["method_key"].map(METHOD_LABELS).fillna(df["method_key"])
    return df


def sweep_frame(out: Path, units: Sequence[Unit] | None = None) -> pd.DataFrame:
    """The usable sweep units under ``out/units`` (or the given ones) in one tidy frame.

    Without ``units`` every sweep unit on disk whose CSV matches its
    sidecar's checksum is read, whatever settings made it: the consistency
    checks then tell whether they belong together.
    """
    out = Path(out)
    if units is None:
        units = []
        for side in sorted((out / "units").glob("sweep__*.json")):
            try:
                units.append(Unit(side.stem, "sweep", json.loads(side.read_text())["settings"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    pairs = ((u, read_unit(u, out)[0]) for u in units)
    return sweep_table((u, df) for u, df in pairs if df is not None)


def _distinct(values: pd.Series) -> list:
    vals = [v for v in values.dropna().unique()]
    if vals and all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals):
        out: list = []
        for v in sorted(float(x) for x in vals):
            if not out or abs(v - out[-1]) > TOL * max(abs(v), abs(out[-1])):
                out.append(v)
        return out
    return sorted(str(v) for v in vals if str(v) != "")


def _owners(g: pd.DataFrame, col: str) -> list[str]:
    """One entry per distinct value of ``col`` in ``g``: ``"<value> in <methods>"``."""
    parts = []
    for v in _distinct(g[col]):
        if isinstance(v, float):
            sel, text = np.isclose(g[col].astype(float), v, rtol=TOL, atol=0.0), f"{v:.6g}"
        else:
            sel, text = g[col].astype(str) == v, v[:12]
        parts.append(f"{text} in {', '.join(sorted(g.loc[sel, 'method_key'].astype(str).unique()))}")
    return parts


def _inconsistent_groups(sweeps: pd.DataFrame) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = {}
    for (net, P), g in sweeps.groupby(["network", "devices"], sort=False):
        msgs = []
        for col in KEY_COLUMNS:
            parts = _owners(g, col) if col in g.columns else []
            if len(parts) > 1:
                msgs.append(f"{net} P={P}: the units disagree on {col} ({'; '.join(parts)}): "
                            "they were made from different inputs")
        for lvl, gl in g.groupby("level"):
            if len(_distinct(gl["memory_limit"])) > 1:
                msgs.append(f"{net} P={P} level {lvl}: the units disagree on the memory limit")
        if msgs:
            out[(net, P)] = msgs
    return out


def consistency_violations(sweeps: pd.DataFrame) -> list[str]:
    """Groups that do not compare like with like: a line per (network, P) and key column on which units disagree.

    Within one network and device count every method must have been run on
    the same profile file (``profile_sha256``), by the same code
    (``code_version``), giving the same number of layers and the same lower
    bound, and at the same memory limit per level.
    """
    if sweeps.empty:
        return []
    return [m for msgs in _inconsistent_groups(sweeps).values() for m in msgs]


def _rivals(key: str) -> tuple[str, ...]:
    """The variants an optimal plan of the exact, non-baseline variant ``key`` (the ILPs) must match or beat:
    the checked baselines it can express and, for a general allocation, the same method's contiguous variant."""
    v = next(x for x in VARIANTS if x.key == key)
    same = tuple(x.key for x in VARIANTS if x.method == v.method and x.allocation != v.allocation
                 and v.allocation == "general")
    return same + tuple(x.key for x in VARIANTS if method(x.method).baseline and x.allocation == "contiguous")


#: exact variants that are not baselines themselves (the ILPs), in the order the checks run them
_CHECKED = tuple(v.key for v in reversed(VARIANTS) if method(v.method).exact and not method(v.method).baseline)


def _cross_method(g: pd.DataFrame, net: str, P: int, lvl: int) -> list[str]:
    bad = []
    by = {r.method_key: r for _, r in g.iterrows()}
    for general in (v for v in VARIANTS if v.allocation == "general"):
        for contiguous in (v for v in VARIANTS if v.method == general.method and v.allocation == "contiguous"):
            gen, con = by.get(general.key), by.get(contiguous.key)
            if gen is not None and con is not None and gen.status == "optimal" and con.status == "optimal":
                if gen.period > con.period * (1 + 1e-5):
                    bad.append(f"{net} P={P} level {lvl}: {general.label} {gen.period} worse than "
                               f"{contiguous.label} {con.period}")
    for key in _CHECKED:
        exact = by.get(key)
        if exact is None or exact.status != "optimal":
            continue
        for rk in _rivals(key):
            r = by.get(rk)
            if r is not None and exact.period > r.period * (1 + 1e-5):
                bad.append(f"{net} P={P} level {lvl}: optimal {key} period {exact.period} worse than {rk} {r.period}")
    return bad


def bound_violations(sweeps: pd.DataFrame) -> list[str]:
    """What the results must satisfy; returns a line per violation (empty: all good).

    * every (network, P) group compares like with like (:func:`consistency_violations`);
      the comparisons between methods below are made only within consistent groups;
    * no plan that fits beats the lower bound;
    * the general ILP's throughput >= the contiguous ILP's where both are optimal;
    * an optimal ILP >= every periodic baseline that fits (contiguous ILP vs
      dp and pipedream; general ILP vs all periodic ones). Flushed schedules
      (GPipe, 1F1B-flush) are another family (one weight version, no stashing,
      simulated memory) and can beat the periodic optimum at mid memory: the
      throughput figure's headlines count those cases;
    * more memory never hurts an exact method (dp, optimal ILPs).
    """
    if sweeps.empty:
        return []
    mixed = _inconsistent_groups(sweeps)
    bad = [m for msgs in mixed.values() for m in msgs]
    fits = sweeps[sweeps["fits"].astype(bool)]
    below = fits[fits["period"] < fits["lower_bound"] * (1 - TOL)]
    for _, r in below.iterrows():
        bad.append(f"{r.network} P={r.devices} level {r.level} {r.method_key}: period {r.period} "
                   f"< bound {r.lower_bound}")
    for (net, P, lvl), g in fits.groupby(["network", "devices", "level"]):
        if (net, P) not in mixed:  # comparing methods run on different inputs means nothing
            bad += _cross_method(g, net, P, lvl)
    for (net, P, mk), g in sweeps.groupby(["network", "devices", "method_key"]):
        g = g.sort_values("level")
        exact = g[(g["status"] == "optimal") & g["fits"].astype(bool)] if mk in _EXACT else g.iloc[0:0]
        per = exact["period"].to_numpy()
        if len(per) > 1 and np.any(np.diff(per) > per[1:] * 1e-5):
            bad.append(f"{net} P={P} {mk}: exact periods grow with memory: {list(per)}")
    return bad


def may_vary(rows: pd.DataFrame) -> bool:
    """Whether any of ``rows`` (sweep rows) says its plan may differ between runs (its ``may_vary`` column:
    a phase the wall clock stopped), so that what is derived from them may too.

    >>> may_vary(pd.DataFrame({"may_vary": [False, True]})), may_vary(pd.DataFrame({"x": [1]}))
    (True, False)
    """
    return bool("may_vary" in rows and rows["may_vary"].fillna(False).astype(bool).any())


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
        varies = may_vary(g)       # the best throughput is every method's: any plan that may vary moves it
        for mk, gm in g.groupby("method_key", sort=False):
            good = gm[gm["fits"].astype(bool) & (gm["throughput"] >= fraction * best * (1 - TOL))]
            m = float(good["memory_limit"].min()) if len(good) else math.nan
            least = float(gm["least_memory"].iloc[0])
            rows.append({"network": net, "devices": P, "method_key": mk, "label": METHOD_LABELS.get(mk, mk),
                         "best_throughput": best, "fraction": fraction, "min_memory": m,
                         "min_memory_gib": m / GiB, "min_memory_relative": m / least, "may_vary": varies})
    return pd.DataFrame(rows)


def tight_levels(sweeps: pd.DataFrame) -> pd.DataFrame:
    """The rows at tight memory: the lower half of the levels."""
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
    tight = tight_levels(sweeps)
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
