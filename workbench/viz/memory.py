"""Memory views: memory over time per device, and memory per device split by what holds it.

:func:`memory_timeline` draws the step functions of a trace's ``memory``
frame (bytes held from ``time`` until the device's next row), one line per
device, with the per-device limit as a dashed red line. :func:`memory_bars`
draws, per device, the memory a plan holds (:mod:`workbench.model.memory`),
stacked by term -- parameters, gradients, optimizer state, fp32 masters,
stashed versions, activations, the largest transient, the runtime context;
or, in the paper's model, live weights (``phi*W``), stashed versions and
activations -- with the limit. Both pick their unit by magnitude
(:func:`workbench.model.units.byte_unit`, :func:`~workbench.model.units.time_unit`);
:func:`memory_bars_compare` and :func:`memory_timelines` draw several plans or
traces as panels of one figure, on one unit and one range, to be compared.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.plan import make_plan
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
>>> plat = Target.of(2, memory=100, memory_model="paper")
>>> plan = make_plan(chain, plat, period=0.006, assignment=[0, 0, 1, 1],
...                  fwd_start=[0.0, 0.002], bwd_start=[0.008, 0.004])
>>> memory_split(plan, chain, plat)[["activations", "weights", "stashed", "total"]].values.tolist()
[[8.0, 20.0, 20.0, 48.0], [8.0, 20.0, 0.0, 28.0]]
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.methods import flushed
from workbench.model.activations import apply_policies
from workbench.model.chain import Chain
from workbench.model.memory import flushed_platform
from workbench.model.memory_views import memory_breakdown
from workbench.model.plan import Plan, chain_for_plan
from workbench.model.target import Target
from workbench.model.trace import Trace
from workbench.model.units import Unit, byte_unit
from workbench.viz.gantt import TEMPLATE, trace_unit

__all__ = ["memory_timeline", "memory_timelines", "memory_bars", "memory_bars_compare", "memory_split",
           "SPLIT_COLORS", "SPLIT_TERMS", "DEVICE_COLORS"]

#: the terms a device's memory splits into (model.memory_views.memory_breakdown), bottom to top, with legend labels
SPLIT_TERMS = {"weights": "live weights (φ·W)", "parameters": "parameters", "gradients": "gradients (resident)",
               "optimizer": "optimizer state", "master": "fp32 master copies",
               "tied": "tied parameters (copies; owner's receive buffer)", "stashed": "stashed versions ((k-1)·W)",
               "offloaded": "offloaded activations (one copy)", "buffers": "receive buffers",
               "activations": "activations (k·A)", "transient": "largest transient (one operation)",
               "runtime": "runtime context"}
SPLIT_COLORS = {"weights": "#7F7F7F", "parameters": "#7F7F7F", "gradients": "#B07AA1", "optimizer": "#59A14F",
                "master": "#9C755F", "tied": "#EDC948", "stashed": "#F28E2B", "offloaded": "#76B7B2",
                "buffers": "#D4A6C8", "activations": "#3366CC", "transient": "#E15759", "runtime": "#BAB0AC"}
DEVICE_COLORS = ["#4E79A7", "#E15759", "#59A14F", "#B07AA1", "#F28E2B", "#76B7B2", "#EDC948", "#9C755F"]
LIMIT_COLOR = "#D62728"


def memory_split(plan: Plan, chain: Chain, platform: Target) -> pd.DataFrame:
    """Per device, the bytes of each term of :mod:`workbench.model.memory` (:data:`SPLIT_TERMS`' keys that
    the model has), ``total`` and ``reported`` (the plan's own figure).

    Periodic plans split their rule-7 figure (:func:`workbench.model.memory_views.memory_breakdown`). Flushed
    schedules (GPipe, 1F1B, torch's multi-stage ones) hold one weight version and no stash: their split is the
    simulated peak's (:func:`workbench.schedules.simulate.simulate`), its weight part split like a periodic
    plan's.
    """
    chain = chain_for_plan(plan, chain)
    if plan.activations:                  # the effective chain: recomputed layers hold no activations
        chain = apply_policies(chain, plan.activations)
    P = plan.devices
    if flushed(plan.schedule):
        rows = _flushed_split(plan, chain, platform)
    else:
        rows = memory_breakdown(chain, platform, plan.stages)
    df = pd.DataFrame(rows)
    df.insert(0, "device", range(P))
    df["total"] = df.drop(columns="device").sum(axis=1)
    rep = list(plan.memory) + [math.nan] * (P - len(plan.memory))
    df["reported"] = rep[:P]
    return df


def _flushed_split(plan: Plan, chain: Chain, platform: Target) -> list[dict[str, float]]:
    from workbench.schedules.simulate import simulate

    one = [replace(s, in_flight=1) for s in plan.stages]
    # the micro-batches' gradients accumulate to the step after the flush (docs/model.md, "The training loop")
    rows = memory_breakdown(chain, flushed_platform(platform), one)
    # one flush; the plan's own chain (simulate applies the plan's policies itself)
    trace = simulate(plan.with_(activations=()), chain, platform, batches=int(plan.micro_batches or 1))
    mem = trace.memory
    for d, row in enumerate(rows):
        m = mem[mem["device"] == d]
        if not len(m) or not any(s.device == d for s in plan.stages):
            for k in row:
                row[k] = 0.0
            continue
        peak = m.loc[m["total"].idxmax()]
        # under zero_grad none a stage's gradients exist only once its first backward has ended: those not
        # held at the peak (the simulated weights there) are not drawn
        resident = sum(v for k, v in row.items() if k not in ("activations", "transient", "stashed"))
        row["gradients"] -= min(row["gradients"], max(0.0, resident - float(peak["weights"])))
        row["stashed"] = 0.0
        row["activations"] = float(peak["activations"])
        row["transient"] = float(peak.get("transient", 0.0))
    return rows


def _limit_line(fig: go.Figure, limit: float | None, unit: Unit, **where: int) -> None:
    if limit is None or not math.isfinite(limit):
        return
    fig.add_hline(y=unit.of(limit), line=dict(color=LIMIT_COLOR, dash="dash", width=2),
                  annotation_text=f"limit {unit.of(limit):.3g} {unit.name}", annotation_position="top left",
                  annotation_font=dict(color=LIMIT_COLOR, size=11), **where)


def _bar_panel(plan: Plan, chain: Chain, platform: Target) -> tuple[pd.DataFrame, float, float]:
    """The split of ``plan``, its limit and the top of what its chart shows (bytes)."""
    df = memory_split(plan, chain, platform)
    limit = plan.memory_limit if math.isfinite(plan.memory_limit) else platform.memory_limit
    top = max(float(df["total"].max()) if len(df) else 0.0,
              float(np.nanmax(df["reported"])) if df["reported"].notna().any() else 0.0,
              limit if math.isfinite(limit) else 0.0)
    return df, limit, top


def _bar_traces(df: pd.DataFrame, platform: Target, unit: Unit, x: list[str]) -> list[go.BaseTraceType]:
    """The stacked bars of one split (a bar per term the model has) and the reported-memory diamonds."""
    out: list[go.BaseTraceType] = []
    labels = dict(SPLIT_TERMS, weights=f"live weights (φ·W, φ={platform.setup.weight_factor:g})")
    for col in SPLIT_TERMS:
        if col not in df or not (df[col] > 0).any():
            continue
        out.append(go.Bar(x=x, y=unit.of(df[col]).tolist(), name=labels[col], marker_color=SPLIT_COLORS[col],
                          legendgroup=col, hovertemplate=f"%{{x}} {col}: %{{y:.3f}} {unit.name}<extra></extra>"))
    diff = df["reported"].notna() & ~np.isclose(df["reported"], df["total"], rtol=1e-6, atol=1.0)
    if diff.any():
        out.append(go.Scatter(x=[x[i] for i in np.flatnonzero(diff)], y=unit.of(df.loc[diff, "reported"]).tolist(),
                              mode="markers", name="plan's reported memory", legendgroup="reported",
                              marker=dict(symbol="diamond", size=11, color="black")))
    return out


def _measured_traces(df: pd.DataFrame, measured: list[float], unit: Unit, x: list[str]) -> list[go.Scatter]:
    """A run's peak per device as a black bar across its column, labelled with the prediction's error."""
    pred = df["reported"].where(df["reported"].notna(), df["total"]).astype(float).tolist()
    return [go.Scatter(x=x, y=[unit.of(m) for m in measured], mode="markers", name="measured peak (MemTracker)",
                       marker=dict(symbol="line-ew", size=40, color="black", line=dict(width=4, color="black")),
                       hovertemplate=f"%{{x}} measured: %{{y:.3f}} {unit.name}<extra></extra>"),
            go.Scatter(x=x, y=[unit.of(max(m, p)) for m, p in zip(measured, pred)], mode="text", showlegend=False,
                       text=[f"prediction {p / m - 1:+.1%}" if m > 0 else "" for m, p in zip(measured, pred)],
                       textposition="top center", textfont=dict(size=11), hoverinfo="skip")]


def memory_bars(plan: Plan, chain: Chain, platform: Target, *, title: str | None = None,
                unit: Unit | None = None, top: float | None = None, measured: list[float] | None = None) -> go.Figure:
    """Stacked bars per device: activations, live weights, stashed versions, tied copies...; the limit dashed.

    A diamond marks the plan's reported memory where it differs from the split
    (flushed schedules report their simulated peak). ``unit`` and ``top`` (bytes,
    the highest value the axis must show) fix the y axis, so that several charts
    compare; :func:`memory_bars_compare` does it for you. ``measured``: a run's peak per device
    (``memory_measured`` of :func:`workbench.front.running.run_and_compare`), drawn as a black bar
    across each device's column, labelled with the prediction's error (predicted / measured - 1).
    """
    df, limit, own_top = _bar_panel(plan, chain, platform)
    top = max(own_top, top or 0.0, max(measured or [0.0]))
    unit = unit or byte_unit(top)
    many = len(df) > 16          # dozens of devices: numbers under an axis titled GPU
    x = [str(p) if many else f"GPU {p}" for p in df["device"]]
    fig = go.Figure(_bar_traces(df, platform, unit, x) + (_measured_traces(df, measured, unit, x) if measured else []))
    _limit_line(fig, limit, unit)
    fig.update_layout(barmode="stack", template=TEMPLATE, height=380,
                      title=title or f"Memory per device ({plan.method or 'plan'}, weights {platform.setup.weights})",
                      yaxis_title=unit.axis("memory"), margin=dict(l=60, r=20, t=50, b=90),
                      legend=dict(orientation="h", yanchor="top", y=-0.12, xanchor="left", x=0, traceorder="normal"))
    if top > 0:
        fig.update_yaxes(range=[0, unit.of(top) * 1.12])
    if many:
        fig.update_xaxes(title="GPU", type="category", tickfont=dict(size=9))
        fig.update_layout(legend_y=-0.2)
    return fig


def memory_bars_compare(panels: Mapping[str, tuple[Plan, Chain, Target]], *, title: str | None = None) -> go.Figure:
    """:func:`memory_bars` of several plans side by side, one panel each, on one unit and one y range.

    ``panels`` maps a panel title (``<br>`` breaks it) to ``(plan, chain, platform)``; a term's legend entry is
    shown once.
    """
    split = {name: _bar_panel(*args) for name, args in panels.items()}
    top = max((t for _, _, t in split.values()), default=0.0)
    unit = byte_unit(top)
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=list(panels))
    seen: set[str] = set()
    for col, (name, (df, limit, _)) in enumerate(split.items(), start=1):
        platform = panels[name][2]
        for tr in _bar_traces(df, platform, unit, [f"GPU {p}" for p in df["device"]]):
            tr.showlegend = tr.name not in seen
            seen.add(tr.name)
            fig.add_trace(tr, row=1, col=col)
        _limit_line(fig, limit, unit, row=1, col=col)
    for ann in fig.layout.annotations[:len(panels)]:
        ann.update(font=dict(size=12))
    fig.update_layout(barmode="stack", template=TEMPLATE, height=420, title=title,
                      margin=dict(l=60, r=20, t=100 if title else 60, b=90),
                      legend=dict(orientation="h", yanchor="top", y=-0.12, xanchor="left", x=0, traceorder="normal"))
    fig.update_yaxes(range=[0, unit.of(top) * 1.12 if top > 0 else 1])
    fig.update_yaxes(title=unit.axis("memory"), row=1, col=1)
    return fig


def _timeline_traces(trace: Trace, unit: Unit, tunit: Unit, offset: float, split: bool,
                     legend: bool = True) -> list[go.Scatter]:
    mem = trace.memory
    t_end = float(trace.ops["end"].max()) if len(trace.ops) else (float(mem["time"].max()) if len(mem) else 0.0)
    out = []
    for p in range(trace.devices):
        m = mem[mem["device"] == p].sort_values("time", kind="stable")
        if not len(m):
            continue
        t = tunit.of(m["time"].astype(float) - offset).tolist()
        tot = unit.of(m["total"].astype(float)).tolist()
        # extend the last level to the end of the trace so the step is visible
        if tunit.of(t_end - offset) > t[-1]:
            t.append(tunit.of(t_end - offset))
            tot.append(tot[-1])
        color = DEVICE_COLORS[p % len(DEVICE_COLORS)]
        out.append(go.Scatter(x=t, y=tot, mode="lines", line_shape="hv", name=f"GPU {p}",
                              legendgroup=f"GPU {p}", line=dict(color=color, width=2), showlegend=legend,
                              hovertemplate=f"GPU {p}: %{{y:.3f}} {unit.name} at %{{x:.3f}} {tunit.name}"
                                            "<extra></extra>"))
        if split:
            a = unit.of(m["activations"].astype(float)).tolist()
            if len(a) < len(t):
                a.append(a[-1])
            out.append(go.Scatter(x=t, y=a, mode="lines", line_shape="hv", name=f"GPU {p} activations",
                                  line=dict(color=color, width=1, dash="dot"), legendgroup=f"GPU {p}",
                                  showlegend=legend))
    return out


def memory_timeline(trace: Trace, limit: float | None = None, *, split: bool = False,
                    title: str | None = None, align: bool = False, unit: Unit | None = None,
                    top: float | None = None) -> go.Figure:
    """Memory held on each device over time (ms or s, by the run's length), as step lines; the limit dashed.

    With ``split`` each device also gets a dotted line for its activations. ``unit`` and ``top`` (bytes)
    fix the y axis; :func:`memory_timelines` draws several traces on one unit and range.
    """
    offset = float(trace.ops["start"].min()) if align and len(trace.ops) else 0.0
    peak = float(trace.memory["total"].max()) if len(trace.memory) else 0.0
    top = max(peak, top or 0.0, limit if limit is not None and math.isfinite(limit) else 0.0)
    unit = unit or byte_unit(top)
    tunit = trace_unit(trace, align=align)
    fig = go.Figure(_timeline_traces(trace, unit, tunit, offset, split))
    _limit_line(fig, limit, unit)
    fig.update_layout(template=TEMPLATE, height=320, title=title or "Memory over time",
                      xaxis_title=tunit.axis("time"), yaxis_title=unit.axis("memory"),
                      margin=dict(l=60, r=20, t=60, b=45),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1))
    fig.update_yaxes(range=[0, unit.of(top) * 1.08] if top > 0 else None, rangemode="tozero")
    fig.update_xaxes(rangemode="tozero")   # from the run's start (with ``align``: its first operation)
    return fig


def memory_timelines(traces: Mapping[str, Trace], limit: float | None = None, *,
                     title: str | None = None) -> go.Figure:
    """Memory over time of several traces, one panel each (titled by its key), on shared axes and units."""
    tops = [float(t.memory["total"].max()) for t in traces.values() if len(t.memory)]
    top = max(tops + [limit if limit is not None and math.isfinite(limit) else 0.0], default=0.0)
    unit, tunit = byte_unit(top), trace_unit(*traces.values())
    n = len(traces)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, shared_yaxes=True, vertical_spacing=0.06,
                        subplot_titles=list(traces))
    for row, trace in enumerate(traces.values(), start=1):
        for tr in _timeline_traces(trace, unit, tunit, 0.0, False, legend=row == 1):
            fig.add_trace(tr, row=row, col=1)
        _limit_line(fig, limit, unit, row=row, col=1)
        fig.update_yaxes(title=unit.axis("memory"), row=row, col=1)
    for ann in fig.layout.annotations[:n]:
        ann.update(x=0, xanchor="left", font=dict(size=13))
    fig.update_layout(template=TEMPLATE, height=110 + 190 * n, title=title,
                      margin=dict(l=60, r=20, t=80 if title else 50, b=45),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1))
    fig.update_yaxes(range=[0, unit.of(top) * 1.08] if top > 0 else None)
    fig.update_xaxes(title=tunit.axis("time"), row=n, col=1)
    return fig
