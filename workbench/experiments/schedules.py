"""Which schedule wins at which memory: the best plan per memory level across families, and the seed's general
allocation against every schedule torch ships.

The sweeps run every variant of :data:`workbench.methods.VARIANTS` at the same
memory levels: periodic plans (dp, PipeDream, mCAP, the ILPs: one forward and one
backward of different mini-batches per device per period, weight stashing) and
flushed schedules (GPipe, 1F1B and torch's multi-stage schedules: micro-batches,
then a flush, one weight version). :func:`best_per_level` names, per network,
device count and level, the fastest plan that fits, whatever its family;
:func:`general_vs_torch` puts the general ILP's plan beside the fastest of the
schedules ``torch.distributed.pipelining`` ships (:data:`TORCH_KEYS`: GPipe,
1F1B and the five multi-stage ones) at equal memory. :func:`schedules_figure`
draws the first and states the second in the report.

>>> sw = pd.DataFrame({"network": ["n"] * 3, "devices": [2] * 3, "level": [0] * 3, "memory_limit": [1.0] * 3,
...                    "method_key": ["dp", "1f1b", "ilp-general"], "fits": [True, True, True],
...                    "period": [3.0, 2.0, 2.5]})
>>> best_per_level(sw)[["method_key", "period", "family"]].values.tolist()
[['1f1b', 2.0, 'flushed']]
>>> general_vs_torch(sw)[["winner", "ratio"]].values.tolist()
[['torch', 0.8]]
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.experiments.analyses import GiB, may_vary
from workbench.experiments.figures import FigureInfo, log_axis_ticks
from workbench.experiments.settings import METHOD_LABELS, TOL
from workbench.experiments.units import slug
from workbench.methods import VARIANTS, method
from workbench.viz.gantt import TEMPLATE

__all__ = ["best_per_level", "general_vs_torch", "best_at_three_levels", "schedules_figure", "spaced_ticks",
           "TORCH_KEYS", "frontier_levels", "frontier_table"]

#: the sweep variants of schedules torch.distributed.pipelining ships (GPipe, 1F1B and the multi-stage ones)
TORCH_KEYS = tuple(v.key for v in VARIANTS if method(v.method).family == "flushed")
_FAMILY = {v.key: method(v.method).family for v in VARIANTS}


def best_per_level(sweeps: pd.DataFrame) -> pd.DataFrame:
    """Per (network, devices, level): the fastest plan that fits across every family (ties within ``TOL``
    listed in ``tied``); no row where nothing fits."""
    rows = []
    if sweeps.empty:
        return pd.DataFrame(rows)
    fits = sweeps[sweeps["fits"].astype(bool) & np.isfinite(sweeps["period"])]
    for (net, P, lvl), g in fits.groupby(["network", "devices", "level"], sort=False):
        every = sweeps[(sweeps.network == net) & (sweeps.devices == P) & (sweeps.level == lvl)]
        best = g.loc[g["period"].idxmin()]
        tied = sorted(k for k in g[g["period"] <= best.period * (1 + TOL)]["method_key"] if k != best.method_key)
        rows.append({"network": net, "devices": int(P), "level": int(lvl), "memory_limit": float(best.memory_limit),
                     "method_key": best.method_key, "label": METHOD_LABELS.get(best.method_key, best.method_key),
                     "family": _FAMILY.get(best.method_key, "?"), "period": float(best.period),
                     "tied": ",".join(tied), "fitting": int(len(g)), "may_vary": may_vary(every)})
    return pd.DataFrame(rows)


def general_vs_torch(sweeps: pd.DataFrame, general: str = "ilp-general") -> pd.DataFrame:
    """Per (network, devices, level): the general allocation's period beside the fastest torch schedule's at
    the same limit, ``ratio`` = torch / general (> 1: the general allocation is faster) and the ``winner``
    (``general``, ``torch``, ``tie``, or who alone fits; ``neither``)."""
    rows = []
    if sweeps.empty:
        return pd.DataFrame(rows)
    for (net, P, lvl), g in sweeps.groupby(["network", "devices", "level"], sort=False):
        ok = g[g["fits"].astype(bool) & np.isfinite(g["period"])]
        gen = ok[ok.method_key == general]
        tor = ok[ok.method_key.isin(TORCH_KEYS)]
        gp = float(gen.period.min()) if len(gen) else math.nan
        best = tor.loc[tor["period"].idxmin()] if len(tor) else None
        tp = float(best.period) if best is not None else math.nan
        if len(gen) and best is not None:
            ratio = tp / gp
            winner = "tie" if abs(ratio - 1) <= TOL else ("general" if ratio > 1 else "torch")
        else:
            ratio = math.nan
            winner = "general alone fits" if len(gen) else ("torch alone fits" if best is not None else "neither")
        rows.append({"network": net, "devices": int(P), "level": int(lvl),
                     "memory_limit": float(g.memory_limit.iloc[0]), "general_period": gp, "torch_period": tp,
                     "torch_best": best.method_key if best is not None else "", "ratio": ratio, "winner": winner,
                     "may_vary": may_vary(g)})
    return pd.DataFrame(rows)


def best_at_three_levels(best: pd.DataFrame) -> pd.DataFrame:
    """Per network and device count, the best family at the tightest, the middle and the loosest level where
    something fits (the closing note's table)."""
    rows = []
    for (net, P), g in best.groupby(["network", "devices"], sort=False):
        g = g.sort_values("level")
        for where, i in (("tight", 0), ("middle", len(g) // 2), ("loose", len(g) - 1)):
            r = g.iloc[i]
            rows.append({"network": net, "devices": P, "where": where, "memory_gib": r.memory_limit / GiB,
                         "best": r.label, "period": r.period, "tied": r.tied})
    return pd.DataFrame(rows)


def frontier_levels(chain, platform, count: int) -> list[float]:
    """``count`` memory limits, geometric, from the least any contiguous plan needs to what the hungriest of
    dp, 1F1B and ZB-V use without a limit (1.05 times, so the last level binds nothing)."""
    from workbench.planners import plan
    from workbench.planners.dp.contiguous import least_contiguous_memory

    lo = least_contiguous_memory(chain, platform)[0]
    roomy = platform.with_(memory=math.inf)
    hi = 1.05 * max(plan(chain, roomy, "dp").peak_memory, plan(chain, roomy, "1f1b").peak_memory,
                    plan(chain, roomy, "zbv").peak_memory)
    return [float(x) for x in np.geomspace(lo, max(hi, lo * 1.01), count)]


def frontier_table(chain, platform, memories, keys=None, time_limit: float = 10.0) -> pd.DataFrame:
    """Every variant of ``keys`` (default: all of :data:`workbench.methods.VARIANTS`) at each memory limit
    (:func:`workbench.planners.sweep.sweep`, robust): a row per (variant, limit) with its period, throughput
    (mini-batches per second, 0 where it does not fit) and peak memory."""
    from workbench.planners.sweep import plan_row, sweep

    rows = []
    for v in (v for v in VARIANTS if keys is None or v.key in keys):
        for M, result in sweep(chain, platform, list(memories), v.method, allocation=v.allocation,
                               time_limit=time_limit, robust=True, deterministic=True):
            r = plan_row(result, chain, platform.with_(memory=M))
            rows.append({"method_key": v.key, "label": v.label, "family": _FAMILY[v.key], "memory_limit": M,
                         "fits": bool(r["fits"]), "period": r["period"],
                         "throughput": 1.0 / r["period"] if r["fits"] and r["period"] > 0 else 0.0,
                         "peak_memory": r["peak_memory"]})
    return pd.DataFrame(rows)


def spaced_ticks(values, min_ratio: float = 1.15) -> list[float]:
    """The values to label on a log axis: ascending, each at least ``min_ratio`` times the last one kept (the
    levels of several device counts crowd each other otherwise).

    >>> spaced_ticks([0.705, 0.722, 0.993, 1.0, 1.4])
    [0.705, 0.993, 1.4]
    """
    kept: list[float] = []
    for v in sorted({float(v) for v in values if np.isfinite(v) and v > 0}):
        if not kept or v >= kept[-1] * min_ratio:
            kept.append(v)
    return kept


def _markers(net: str, best: pd.DataFrame) -> go.Figure:
    """One row per device count, one marker per memory level, coloured and labelled by the best variant."""
    colours = {v.key: v.colour for v in VARIANTS}
    fig = go.Figure()
    for key, g in best.groupby("method_key", sort=False):
        fig.add_scatter(x=g["memory_limit"] / GiB, y=[f"P = {p}" for p in g["devices"]], mode="markers+text",
                        name=METHOD_LABELS.get(key, key), text=[METHOD_LABELS.get(key, key)] * len(g),
                        # neighbouring levels of a row label above and below in turn, so close levels do not collide
                        textposition=["top center" if lv % 2 == 0 else "bottom center" for lv in g["level"]],
                        textfont=dict(size=10),
                        marker=dict(size=16, color=colours.get(key, "#333"), symbol="square"),
                        customdata=np.stack([g["period"] * 1e3, g["tied"]], axis=1),
                        hovertemplate="%{x:.3g} GiB: %{text}, period %{customdata[0]:.4g} ms"
                                      "<br>tied: %{customdata[1]}<extra></extra>")
    rows = sorted(best["devices"].unique())
    fig.update_xaxes(**log_axis_ticks(spaced_ticks(best["memory_limit"] / GiB)),
                     title_text="memory limit per device (GiB, log)")
    fig.update_yaxes(categoryorder="array", categoryarray=[f"P = {p}" for p in rows],
                     range=[-0.7, len(rows) - 0.3])      # room above the top row and below the bottom one for labels
    fig.update_layout(template=TEMPLATE, height=260 + 80 * len(rows),
                      title=dict(text=f"{net}: the fastest plan that fits at each memory level, across families",
                                 subtitle=dict(text="periodic (dp, PipeDream, mCAP, ILPs) and flushed (GPipe, 1F1B, "
                                                    "torch's multi-stage schedules); no marker: nothing fits")),
                      legend=dict(orientation="h", yanchor="top", y=-0.45, xanchor="left", x=0),
                      margin=dict(l=70, r=40, t=100, b=130))
    return fig


def schedules_figure(sw: pd.DataFrame) -> FigureInfo:
    """The best plan per memory level across families (a figure per network), and the general allocation
    against torch's schedules (headlines)."""
    info = FigureInfo("schedules", "Which schedule at which memory: the best plan per level across families, and "
                                   "the general allocation against every schedule torch ships")
    best, duel = best_per_level(sw), general_vs_torch(sw)
    info.tables["best_plan.csv"] = best
    info.tables["general_vs_torch.csv"] = duel
    for net, g in best.groupby("network", sort=False):
        info.add(f"schedules_{slug(net)}", _markers(net, g))
        for P, gp in g.groupby("devices"):
            info.headlines.append(f"{net}, P={P}, best per level: " + "; ".join(
                f"{r.memory_limit / GiB:.3g} GiB {r.label}" + (f" (tied: {r.tied})" if r.tied else "")
                for _, r in gp.sort_values("level").iterrows()))
    for net, g in duel.groupby("network", sort=False):
        wins, losses = g[g.winner == "general"], g[g.winner == "torch"]
        text = (f"{net}: the general allocation against every torch schedule at equal memory, over {len(g)} "
                f"(P, level) cases: faster in {len(wins)}")
        text += f" (up to {wins.ratio.max():.3g}x)" if len(wins) else ""
        text += f", slower in {len(losses)}"
        text += (f" (down to {losses.ratio.min():.3g}x, by {', '.join(sorted(set(losses.torch_best)))})"
                 if len(losses) else "")
        others = {k: int(v) for k, v in g["winner"].value_counts().items() if k not in ("general", "torch")}
        info.headlines.append(text + "".join(f"; {k}: {v}" for k, v in others.items()))
    return info
