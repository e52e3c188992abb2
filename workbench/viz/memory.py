"""Memory views: memory over time per device, and memory per device split by what holds it.

:func:`memory_timeline` draws the step functions of a trace's ``memory``
frame (bytes held from ``time`` until the device's next row), one line per
device, with the per-device limit as a dashed red line. :func:`memory_bars`
draws, per device, the memory rule 7 of docs/model.md charges a plan with,
stacked as activations (``k*A``), live weights (``phi*W``) and stashed
weight versions (``(k-1)*W`` with weight stashing), with the limit.

>>> from workbench.chain import Chain, Layer, Platform
>>> from workbench.plan import make_plan
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
>>> plat = Platform(2, memory=100)
>>> plan = make_plan(chain, plat, period=0.006, assignment=[0, 0, 1, 1],
...                  fwd_start=[0.0, 0.002], bwd_start=[0.008, 0.004])
>>> memory_split(plan, chain, plat)[["activations", "weights", "stashed", "total"]].values.tolist()
[[8.0, 20.0, 20.0, 48.0], [8.0, 20.0, 0.0, 28.0]]
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .gantt import TEMPLATE

from ..chain import Chain, Platform
from ..plan import Plan, chain_for_plan
from ..trace import Trace

__all__ = ["memory_timeline", "memory_bars", "memory_split", "byte_unit", "SPLIT_COLORS", "DEVICE_COLORS"]

SPLIT_COLORS = {"activations": "#3366CC", "weights": "#7F7F7F", "stashed": "#F28E2B"}
DEVICE_COLORS = ["#4E79A7", "#E15759", "#59A14F", "#B07AA1", "#F28E2B", "#76B7B2", "#EDC948", "#9C755F"]
LIMIT_COLOR = "#D62728"


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """A readable unit for values up to ``max_bytes``: ``(name, bytes per unit)``.

    >>> byte_unit(3 * 2**30)
    ('GiB', 1073741824)
    >>> byte_unit(500)
    ('B', 1)
    """
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= scale:
            return name, scale
    return "B", 1


def memory_split(plan: Plan, chain: Chain, platform: Platform) -> pd.DataFrame:
    """Per device: ``activations`` (sum k*A), ``weights`` (phi*W), ``stashed`` ((k-1)*W), ``total``, ``reported``.

    ``reported`` is the plan's own memory figure (the simulated peak for a
    flushed schedule, which may differ from rule 7).
    """
    chain = chain_for_plan(plan, chain)
    P = plan.devices
    act, live, stash = np.zeros(P), np.zeros(P), np.zeros(P)
    for s in plan.stages:
        c = chain.stage_costs(s.first, s.last)
        k = int(s.in_flight)
        act[s.device] += k * c.saved
        live[s.device] += platform.weight_factor * c.weights
        if platform.stash:
            stash[s.device] += max(k - 1, 0) * c.weights
    rep = list(plan.memory) + [math.nan] * (P - len(plan.memory))
    return pd.DataFrame({"device": range(P), "activations": act, "weights": live, "stashed": stash,
                         "total": act + live + stash, "reported": rep[:P]})


def _limit_line(fig: go.Figure, limit: float | None, scale: float, unit: str) -> None:
    if limit is None or not math.isfinite(limit):
        return
    fig.add_hline(y=limit / scale, line=dict(color=LIMIT_COLOR, dash="dash", width=2),
                  annotation_text=f"limit {limit / scale:.3g} {unit}", annotation_position="top left",
                  annotation_font=dict(color=LIMIT_COLOR, size=11))


def memory_bars(plan: Plan, chain: Chain, platform: Platform, *, title: str | None = None) -> go.Figure:
    """Stacked bars per device: activations, live weights, stashed versions; the limit dashed.

    A diamond marks the plan's reported memory where it differs from the split
    (flushed schedules report their simulated peak).
    """
    df = memory_split(plan, chain, platform)
    limit = plan.memory_limit if math.isfinite(plan.memory_limit) else platform.memory
    top = max(float(df["total"].max()) if len(df) else 0.0, float(np.nanmax(df["reported"])) if df["reported"].notna().any() else 0.0,
              limit if math.isfinite(limit) else 0.0)
    unit, scale = byte_unit(top)
    x = [f"GPU {p}" for p in df["device"]]
    fig = go.Figure()
    labels = {"activations": "activations (k·A)", "weights": f"live weights (φ·W, φ={platform.weight_factor:g})",
              "stashed": "stashed versions ((k-1)·W)"}
    for col in ("activations", "weights", "stashed"):
        if col == "stashed" and not platform.stash:
            continue
        fig.add_bar(x=x, y=(df[col] / scale).tolist(), name=labels[col], marker_color=SPLIT_COLORS[col],
                    hovertemplate=f"%{{x}} {col}: %{{y:.3f}} {unit}<extra></extra>")
    diff = df["reported"].notna() & ~np.isclose(df["reported"], df["total"], rtol=1e-6, atol=1.0)
    if diff.any():
        fig.add_scatter(x=[x[i] for i in np.flatnonzero(diff)], y=(df.loc[diff, "reported"] / scale).tolist(),
                        mode="markers", name="plan's reported memory",
                        marker=dict(symbol="diamond", size=11, color="black"))
    _limit_line(fig, limit, scale, unit)
    fig.update_layout(barmode="stack", template=TEMPLATE, height=340,
                      title=title or f"Memory per device ({plan.method or 'plan'}, weights {platform.weights})",
                      yaxis_title=f"memory ({unit})", margin=dict(l=60, r=20, t=60, b=40),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1, traceorder="normal"))
    if math.isfinite(limit):
        fig.update_yaxes(range=[0, max(top, limit) / scale * 1.12])
    return fig


def memory_timeline(trace: Trace, limit: float | None = None, *, split: bool = False,
                    title: str | None = None, align: bool = False) -> go.Figure:
    """Memory held on each device over time (ms), as step lines; the limit dashed.

    With ``split`` each device also gets a dotted line for its activations.
    """
    mem = trace.memory.copy()
    offset = 0.0
    if align and len(trace.ops):
        offset = float(trace.ops["start"].min())
    top = float(mem["total"].max()) if len(mem) else 0.0
    unit, scale = byte_unit(max(top, limit if limit is not None and math.isfinite(limit) else 0.0))
    t_end = float(trace.ops["end"].max()) if len(trace.ops) else (float(mem["time"].max()) if len(mem) else 0.0)
    fig = go.Figure()
    for p in range(trace.devices):
        m = mem[mem["device"] == p].sort_values("time", kind="stable")
        if not len(m):
            continue
        t = ((m["time"].astype(float) - offset) * 1e3).tolist()
        tot = (m["total"].astype(float) / scale).tolist()
        # extend the last level to the end of the trace so the step is visible
        if (t_end - offset) * 1e3 > t[-1]:
            t.append((t_end - offset) * 1e3)
            tot.append(tot[-1])
        color = DEVICE_COLORS[p % len(DEVICE_COLORS)]
        fig.add_scatter(x=t, y=tot, mode="lines", line_shape="hv", name=f"GPU {p}", line=dict(color=color, width=2),
                        hovertemplate=f"GPU {p}: %{{y:.3f}} {unit} at %{{x:.3f}} ms<extra></extra>")
        if split:
            a = (m["activations"].astype(float) / scale).tolist()
            if len(a) < len(t):
                a.append(a[-1])
            fig.add_scatter(x=t, y=a, mode="lines", line_shape="hv", name=f"GPU {p} activations",
                            line=dict(color=color, width=1, dash="dot"), legendgroup=f"GPU {p}")
    _limit_line(fig, limit, scale, unit)
    fig.update_layout(template=TEMPLATE, height=320, title=title or "Memory over time",
                      xaxis_title="time (ms)", yaxis_title=f"memory ({unit})", margin=dict(l=60, r=20, t=60, b=45),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1))
    fig.update_yaxes(rangemode="tozero")
    return fig
