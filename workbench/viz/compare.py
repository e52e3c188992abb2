"""Comparison figures: throughput against memory limit, period against lower bound, allocation maps, prediction errors.

They take tidy DataFrames (one row per (instance, method, memory limit)),
as written by sweeps, or plans.

>>> import pandas as pd
>>> df = pd.DataFrame({"memory": [2**30, 2**31] * 2, "method": ["dp", "dp", "pipedream", "pipedream"],
...                    "period": [0.02, 0.01, 0.04, 0.01]})
>>> fig = throughput_vs_memory(df)
>>> [t.name for t in fig.data]
['dp', 'pipedream']
>>> list(fig.data[0].y)
[50.0, 100.0]
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.methods import METHODS
from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.units import byte_unit, time_unit
from workbench.runtime.period_budget import CPU_PARTS, PARTS
from workbench.viz.gantt import KIND_COLORS, TEMPLATE
from workbench.viz.memory import DEVICE_COLORS

__all__ = ["throughput_vs_memory", "period_vs_bound", "allocation_map", "replay_chart", "prediction_errors",
           "calibration_chart", "period_budget_chart", "METHOD_COLORS", "BUDGET_COLORS"]

#: method name (or alias) -> colour, from the registry (:mod:`workbench.methods`)
METHOD_COLORS = {n: m.colour for m in METHODS for n in (m.name, *m.aliases)}
_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross", "star", "triangle-down"]


def _throughput(df: pd.DataFrame, y: str) -> pd.Series:
    if y in df.columns:
        return df[y].astype(float)
    if "throughput" in df.columns:
        return df["throughput"].astype(float)
    if "period" in df.columns:
        p = df["period"].astype(float)
        return pd.Series(np.where(np.isfinite(p) & (p > 0), 1.0 / p, np.nan), index=df.index)
    raise ValueError("need a 'throughput' or a 'period' column")


def throughput_vs_memory(df: pd.DataFrame, *, x: str = "memory", y: str = "throughput", color: str = "method",
                         title: str | None = None, lower_bound: float | None = None) -> go.Figure:
    """Throughput (mini-batches/s) against the memory limit, one line per method.

    ``df`` has a memory column (bytes) and ``throughput`` or ``period``
    (seconds). Infeasible points (infinite period, zero throughput) are
    left out of the line. ``lower_bound`` (seconds) draws 1/bound, the best
    throughput any plan can reach.
    """
    d = df.copy()
    d["_thr"] = _throughput(d, y)
    d = d[np.isfinite(d["_thr"]) & (d["_thr"] > 0)]
    unit = byte_unit(df[x].to_numpy(dtype=float) if len(df) else 0.0)
    fig = go.Figure()
    for i, (m, g) in enumerate(d.groupby(color, sort=False)):
        g = g.sort_values(x)
        fig.add_scatter(x=unit.of(g[x].astype(float)).tolist(), y=g["_thr"].tolist(), mode="lines+markers", name=str(m),
                        line=dict(color=METHOD_COLORS.get(str(m), DEVICE_COLORS[i % len(DEVICE_COLORS)]), width=2),
                        marker=dict(symbol=_SYMBOLS[i % len(_SYMBOLS)], size=8),
                        hovertemplate=f"{m}: %{{y:.3f}} /s at %{{x:.3g}} {unit.name}<extra></extra>")
    if lower_bound:
        fig.add_hline(y=1.0 / lower_bound, line=dict(dash="dash", color="#555"),
                      annotation_text="1 / lower bound", annotation_position="bottom right")
    fig.update_layout(template=TEMPLATE, height=380, title=title or "Throughput against memory limit",
                      xaxis_title=unit.axis("memory limit per device"), yaxis_title="throughput (mini-batches/s)",
                      margin=dict(l=60, r=20, t=60, b=45))
    fig.update_yaxes(rangemode="tozero")
    return fig


def period_vs_bound(df: pd.DataFrame, *, period: str = "period", bound: str = "lower_bound", color: str = "method",
                    label: str | None = None, title: str | None = None) -> go.Figure:
    """Each plan's period against its lower bound (ms or s by magnitude, log-log), with the line period = bound.

    Points on the diagonal are optimal; their height above it is the ratio.
    """
    d = df[np.isfinite(df[period].astype(float))].copy()
    unit = time_unit(d[period].to_numpy(dtype=float), d[bound].to_numpy(dtype=float))
    d["_p"] = unit.of(d[period].astype(float))
    d["_b"] = unit.of(d[bound].astype(float))
    fig = go.Figure()
    for i, (m, g) in enumerate(d.groupby(color, sort=False)):
        text = g[label].astype(str).tolist() if label else None
        fig.add_scatter(x=g["_b"].tolist(), y=g["_p"].tolist(), mode="markers", name=str(m), text=text,
                        marker=dict(symbol=_SYMBOLS[i % len(_SYMBOLS)], size=9,
                                    color=METHOD_COLORS.get(str(m), DEVICE_COLORS[i % len(DEVICE_COLORS)])),
                        customdata=(g["_p"] / g["_b"]).tolist(),
                        hovertemplate=f"{m} %{{text}}<br>bound %{{x:.3f}} {unit.name}, period %{{y:.3f}} {unit.name}"
                                      "<br>ratio %{customdata:.3f}<extra></extra>")
    if len(d):
        lo = float(min(d["_b"].min(), d["_p"].min())) * 0.9
        hi = float(max(d["_b"].max(), d["_p"].max())) * 1.1
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="period = bound",
                        line=dict(color="#555", dash="dash"), hoverinfo="skip")
    fig.update_layout(template=TEMPLATE, height=400, title=title or "Period against lower bound",
                      xaxis_title=unit.axis("lower bound"), yaxis_title=unit.axis("period"),
                      margin=dict(l=60, r=20, t=60, b=45))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def allocation_map(plans: Plan | Sequence[Plan] | Mapping[str, Plan], chain: Chain | None = None, *,
                   title: str | None = None) -> go.Figure:
    """Layers (x) against plans (one row each), coloured by device: a strip per plan.

    Stage boundaries show as colour changes; a general allocation shows a
    device's colour in several places.
    """
    if isinstance(plans, Plan):
        plans = {plans.method or "plan": plans}
    elif not isinstance(plans, Mapping):
        methods = [p.method for p in plans]
        plans = {f"{p.method or 'plan'} #{i}" if methods.count(p.method) > 1 else (p.method or "plan"): p
                 for i, p in enumerate(plans)}
    names = list(plans)
    P = max((p.devices for p in plans.values()), default=1)
    L = max((len(p.assignment) for p in plans.values()), default=0)
    z = np.full((len(names), L), np.nan)
    for r, n in enumerate(names):
        a = plans[n].assignment
        z[r, : len(a)] = a
    # discrete colour scale: device p gets DEVICE_COLORS[p] on [p/P, (p+1)/P)
    scale = []
    for p in range(P):
        c = DEVICE_COLORS[p % len(DEVICE_COLORS)]
        scale += [[p / P, c], [(p + 1) / P, c]]
    known = chain is not None and len(chain) == L
    layer_names = [l.name for l in chain.layers] if known else [str(i) for i in range(L)]
    text = [[f"layer {j} ({layer_names[j]})<br>GPU {int(v)}" if not math.isnan(v) else "" for j, v in enumerate(row)]
            for row in z]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(L)), y=names, zmin=-0.5, zmax=P - 0.5, colorscale=scale, xgap=1, ygap=4,
        text=text, hovertemplate="%{y}: %{text}<extra></extra>",
        colorbar=dict(title="device", tickvals=list(range(P)), ticktext=[f"GPU {p}" for p in range(P)]),
    ))
    fig.update_layout(template=TEMPLATE, height=max(200, 110 + 45 * len(names), 90 + 22 * min(P, 16)),  # colour bar
                      title=title or "Allocation: device of every layer", xaxis_title="layer",
                      margin=dict(l=100, r=20, t=50, b=45))
    fig.update_yaxes(autorange="reversed")
    return fig


def replay_chart(df: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Measured against predicted per device of every replayed run (:func:`~workbench.runtime.replay.load_replays`).

    Left: compute per mini-batch, measured / predicted. Right: the
    allocator's peak over the rule-7 prediction and over the memory limit.
    A dashed line marks 1 (the prediction) on both.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("compute per mini-batch: measured / predicted",
                                        "GPU memory: allocator peak / rule 7, / limit"))
    labels = _replay_labels(df)
    fig.add_bar(y=labels, x=df["measured_busy"] / df["predicted_busy"], orientation="h", name="compute",
                marker_color="#3366CC", row=1, col=1)
    fig.add_bar(y=labels, x=df["allocator_over_predicted"], orientation="h", name="peak / rule 7",
                marker_color="#F28E2B", row=1, col=2)
    limited = df["allocator_over_limit"].where(np.isfinite(df["memory_limit"]))
    fig.add_bar(y=labels, x=limited, orientation="h", name="peak / limit", marker_color="#D62728", row=1, col=2)
    for c in (1, 2):
        fig.add_vline(x=1.0, line_dash="dash", line_color="#555", row=1, col=c)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=2)
    fig.update_layout(template=TEMPLATE, barmode="group", height=max(300, 90 + 26 * len(df)),
                      title=title or "Each device replayed alone on the GPU", margin=dict(l=230, r=20, t=70, b=40),
                      legend=dict(orientation="h", y=-0.08))
    return fig


def _replay_labels(df: pd.DataFrame) -> list[str]:
    """One label per replayed device; a device the plan leaves without layers says so (its row has no bars).

    >>> _replay_labels(pd.DataFrame({"run": ["a", "a"], "device": [0, 1], "stages": [0.0, float("nan")]}))
    ['a · GPU 0', 'a · GPU 1 (no layers: idle)']
    """
    idle = df["stages"].isna() if "stages" in df else pd.Series(False, index=df.index)
    return [f"{r} · GPU {d}" + (" (no layers: idle)" if i else "")
            for r, d, i in zip(df["run"], df["device"], idle)]


def _signed_percent(v: float) -> str:
    """A relative error as a bar label; an exact zero says so (its bar has no height to show).

    >>> [_signed_percent(v) for v in (1.0802, -0.44, 0.0)]
    ['+108%', '-44%', '0 (exact)']
    """
    if not math.isfinite(v):
        return "n/a"
    return "0 (exact)" if v == 0 else f"{v:+.0%}"


def prediction_errors(cmp: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Per device, (measured - predicted) / predicted: wall busy time, CPU busy time and peak memory.

    ``cmp`` is a run's ``comparison.csv`` (:func:`workbench.runtime.compare.compare`). Every bar is
    labelled with its value, so an error of exactly 0 (memory counted to the byte) reads "0 (exact)"
    instead of an empty slot.
    """
    fig = go.Figure()
    for col, name in (("busy_error", "wall busy time"), ("cpu_busy_error", "CPU busy time"),
                      ("memory_error", "peak memory")):
        if col not in cmp.columns:
            continue
        vals = cmp[col].astype(float)
        fig.add_bar(x=[f"device {int(d)}" for d in cmp["device"]], y=vals.tolist(), name=name,
                    text=[_signed_percent(v) for v in vals], textposition="outside", cliponaxis=False)
    fig.add_hline(y=0, line_color="#555", line_width=1)
    fig.update_layout(template=TEMPLATE, barmode="group", height=380, margin=dict(l=70, r=20, t=60, b=45),
                      title=title or "Prediction error per device (bars labelled; 0 (exact): no error)",
                      yaxis_title="(measured - predicted) / predicted", yaxis_tickformat=".0%")
    return fig


def calibration_chart(loop: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """The calibration loop: |period error| of each run, and of the same allocation re-predicted after calibrating.

    ``loop`` has one row per iteration with ``iteration``, ``error`` (the run's period error) and,
    where it was computed, ``error after calibration``.
    """
    fig = go.Figure()
    fig.add_scatter(x=loop["iteration"].tolist(), y=loop["error"].abs().tolist(), mode="lines+markers",
                    name="|period error| of the plan run", line=dict(color="#3366CC"))
    if "error after calibration" in loop.columns:
        after = loop.dropna(subset=["error after calibration"])
        fig.add_scatter(x=after["iteration"].tolist(), y=after["error after calibration"].abs().tolist(),
                        mode="lines+markers", name="same allocation, re-predicted after calibrating",
                        line=dict(color="#F28E2B", dash="dash"))
    fig.update_layout(template=TEMPLATE, height=360, margin=dict(l=70, r=20, t=80, b=45),
                      title=title or "Calibration loop: |measured - predicted| / predicted period of each run",
                      xaxis_title="iteration (0: the first plan; then re-planned on the calibrated chain)",
                      yaxis_title="|period error|", yaxis_tickformat=".0%",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1))
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(rangemode="tozero")
    return fig


#: a colour per part of :func:`~workbench.runtime.period_budget.period_budget`: the profile's forwards and
#: backwards as in the Gantt charts' forward blue, the other CPU parts in strong colours, waiting in greys
BUDGET_COLORS = {"profile": KIND_COLORS["F"], "layers now": "#9DB9E8", "as one stage": "#76B7B2", "engine": "#B07AA1",
                 "optimizer step": KIND_COLORS["step"], "sending": KIND_COLORS["send"], "between operations": "#EDC948",
                 "waiting for a core": "#D3D3D3", "waiting for messages": "#8C8C8C"}


def period_budget_chart(budgets: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """Where each device's measured period goes: a stacked bar per (run, device) of
    :func:`~workbench.runtime.period_budget.period_budget`'s parts, with the run's predicted and measured
    periods marked on it. Every bar and mark is in one unit (ms or s, by the longest period).

    >>> b = pd.DataFrame([[0.010, 0.0, 0.0, 0.002, 0.0, 0.0, 0.001, 0.005, 0.002]], columns=list(PARTS),
    ...                  index=pd.Index([0], name="device"))
    >>> b.attrs.update(measured_period=0.020, predicted_period=0.011)
    >>> fig = period_budget_chart({"dp": b})
    >>> [t.name for t in fig.data][:3], fig.layout.xaxis.title.text
    (['profile', 'engine', 'between operations'], 'time per period (ms)')
    """
    rows = [(f"{name}, GPU {int(d)}", name, b.loc[d]) for name, b in budgets.items() for d in b.index]
    unit = time_unit([max(b.attrs["measured_period"], b.attrs["predicted_period"]) for b in budgets.values()])
    labels = [r[0] for r in rows]
    fig = go.Figure()
    for part in PARTS:
        vals = [float(r[2][part]) for r in rows]
        if not any(vals):
            continue
        fig.add_bar(y=labels, x=unit.of(np.array(vals)).tolist(), orientation="h", name=part,
                    marker=dict(color=BUDGET_COLORS[part], line=dict(color="white", width=0.5),
                                pattern=dict(shape="" if part in CPU_PARTS else "/", fillmode="overlay",
                                             fgcolor="white", fgopacity=0.6, solidity=0.2)),
                    hovertemplate=f"%{{y}}: {part} %{{x:.2f}} {unit.name}<extra></extra>")
    for key, name, symbol, color in (("predicted_period", "predicted period", "line-ns", "#000000"),
                                     ("measured_period", "measured period", "diamond", "#D62728")):
        xs = [unit.of(budgets[r[1]].attrs[key]) for r in rows]
        fig.add_scatter(y=labels, x=xs, mode="markers", name=name,
                        marker=dict(symbol=symbol, size=18 if symbol == "line-ns" else 9, color=color,
                                    line=dict(width=3 if symbol == "line-ns" else 1, color=color)),
                        hovertemplate=f"%{{y}}: {name} %{{x:.2f}} {unit.name}<extra></extra>")
    fig.update_layout(template=TEMPLATE, barmode="relative", height=max(300, 200 + 46 * len(rows)),
                      title=title or "Where each device's measured period goes",
                      xaxis_title=unit.axis("time per period"), margin=dict(l=140, r=20, t=60, b=120),
                      legend=dict(orientation="h", yanchor="top", y=-0.25, xanchor="left", x=0, font=dict(size=11)))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=labels)
    return fig
