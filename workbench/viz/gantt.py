"""Gantt charts of a :class:`~workbench.model.trace.Trace` (plotly).

One lane per device (``GPU 0`` on top), optionally one lane per link, and a
horizontal bar per operation whose length is the operation's real duration
(``go.Bar`` with ``base=start`` and ``x=end - start``, ``orientation="h"``).
Times are shown in ms or s, chosen by the run's length
(:func:`workbench.model.units.time_unit`; ``unit=`` sets one, so that charts meant to be compared share it,
and ``time_range=`` their x range). Bars are coloured by kind (forward blue,
backward orange, its input- and weight-gradient parts red and yellow, a measured optimizer step dark brown
over its backward, transfers green/grey) or by mini-batch (then the backward
bars are hatched); each bar is labelled with its mini-batch, primed on a
device's second stage (twice on its third...). Period boundaries are dotted lines and the steady state
(the window in which every stage runs all its operations) is shaded.

The same function draws periodic plans, flushed schedules (GPipe, 1F1B) and
measured traces; :func:`gantt_compare` puts two traces one above the other.

>>> import pandas as pd
>>> from workbench.model.trace import Trace, MEMORY_COLUMNS
>>> ops = pd.DataFrame({"device": [0, 1, 1, 0], "stage": [0, 1, 1, 0], "first": [0, 2, 2, 0],
...     "last": [1, 3, 3, 1], "kind": ["F", "F", "B", "B"], "batch": [0, 0, 0, 0],
...     "start": [0.0, 0.002, 0.004, 0.008], "end": [0.002, 0.004, 0.008, 0.012]})
>>> fig = gantt(Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), devices=2, period=0.006))
>>> lanes(fig)
['GPU 0', 'GPU 1']
>>> [round(d, 3) for d in bar_durations(fig)]
[2.0, 2.0, 4.0, 4.0]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.model.trace import Trace
from workbench.model.units import Unit, format_seconds, time_unit
from workbench.viz.gantt_many import COMPACT_ABOVE, MAX_PERIOD_LINES, compact_bars, compact_layout, device_window

__all__ = [
    "gantt", "gantt_compare", "lanes", "bar_durations", "steady_window", "trace_unit", "KIND_COLORS", "KIND_NAMES",
    "BATCH_COLORS", "TEMPLATE",
]

#: colours by kind: forward and backward far apart (blue / orange, colour-blind safe)
KIND_COLORS = {"F": "#3366CC", "B": "#F28E2B", "I": "#E15759", "W": "#EDC948", "R": "#B6471B", "step": "#7B3F00",
               "send": "#59A14F", "recv": "#8C8C8C", "offload": "#76B7B2", "prefetch": "#4E9A96"}
KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward, input gradient", "W": "backward, weight gradient",
              "R": "recompute (in the backward)", "step": "optimizer step (in the backward)", "send": "send",
              "recv": "receive", "offload": "to host", "prefetch": "from host"}
#: compute kinds: a zero-bubble schedule splits a backward into I (input gradient) and W (weight gradient)
COMPUTE_KINDS = ("F", "B", "I", "W")
#: activation-policy operations (docs/model.md, "Activation policies"): always drawn; recompute on the device's
#: lane over its backward, host transfers on a host-link lane per device
POLICY_KINDS = ("R", "offload", "prefetch")
#: operations drawn over the backward they run in, on the device's lane: a recomputation, and a measured
#: optimizer step (the PipeDream engine steps inside each backward)
NESTED_KINDS = ("R", "step")
_KINDS = ["F", "B", "I", "W", "R", "step", "send", "recv", "offload", "prefetch"]
_PATTERNS = {"F": "", "B": "/", "I": "/", "W": "\\", "R": "x", "step": "", "send": ".", "recv": ".", "offload": ".",
             "prefetch": "."}
BATCH_COLORS = [
    "#4E79A7", "#F28E2B", "#E15759", "#76B7B2", "#59A14F", "#EDC948", "#B07AA1", "#FF9DA7",
    "#9C755F", "#BAB0AC", "#1F77B4", "#D62728",
]

#: a light version of plotly's "plotly_white" (assigning the named template deep-copies it: slow for the explorer)
TEMPLATE = go.layout.Template(layout=dict(
    plot_bgcolor="white", paper_bgcolor="white", font=dict(color="#2a3f5f"),
    xaxis=dict(gridcolor="#E5EAF2", linecolor="#C8D0DC", zeroline=False, automargin=True),
    yaxis=dict(gridcolor="#E5EAF2", linecolor="#C8D0DC", zeroline=False, automargin=True),
    hoverlabel=dict(align="left"), title=dict(x=0.02, font=dict(size=15)),
))


def _lane_of(row: pd.Series, links: bool, has_dst: str | None) -> str:
    if row["kind"] in COMPUTE_KINDS or row["kind"] in NESTED_KINDS:
        return f"GPU {int(row['device'])}"
    d = int(row["device"])
    if row["kind"] in POLICY_KINDS:
        return f"GPU {d} host link"
    if has_dst is not None and pd.notna(row[has_dst]):
        q = int(row[has_dst])
        return f"link {d}→{q}" if row["kind"] == "send" else f"link {q}→{d}"
    return f"GPU {d} {'out' if row['kind'] == 'send' else 'in'}"


def _dst_column(ops: pd.DataFrame) -> str | None:
    for c in ("peer", "dst", "to", "link"):
        if c in ops.columns:
            return c
    return None


def _lane_order(ops: pd.DataFrame, devices: int | list[int]) -> list[str]:
    shown = list(range(devices)) if isinstance(devices, int) else devices
    gpus = [f"GPU {p}" for p in shown]
    extra = sorted(set(ops["lane"]) - set(gpus), key=lambda s: (int(s.split()[1].split("→")[0]), s))
    out: list[str] = []
    for p in shown:
        out.append(f"GPU {p}")
        out += [e for e in extra if int(e.split()[1].split("→")[0]) == p]
    out += [e for e in extra if e not in out]
    return out


def steady_window(trace: Trace) -> tuple[float, float] | None:
    """The steady state ``(t0, t1)`` in seconds, or ``None`` if the pipeline never fills.

    ``t0`` is the latest first start over all (stage, kind) compute operations
    (from then on every operation has begun to run), ``t1`` the earliest last
    start (after it some operation has stopped for good).

    >>> steady_window(Trace.empty(devices=1)) is None
    True
    """
    ops = trace.ops
    if not len(ops):
        return None
    comp = ops[ops["kind"].isin(COMPUTE_KINDS)]
    if not len(comp):
        return None
    g = comp.groupby(["stage", "kind"])["start"]
    t0, t1 = float(g.min().max()), float(g.max().min())
    if t1 <= t0:
        return None
    return t0, t1


def trace_unit(*traces: Trace, align: bool = False) -> Unit:
    """The time unit for charts of ``traces`` (ms or s, by the latest end; from each first start with ``align``).

    >>> trace_unit(Trace.empty(devices=1)).name
    'ms'
    """
    ends = []
    for tr in traces:
        if len(tr.ops):
            start = float(tr.ops["start"].min()) if align else 0.0
            ends.append(float(tr.ops["end"].max()) - start)
    return time_unit(ends)


def _prepare(trace: Trace, show_links: bool, offset: float, unit: Unit) -> pd.DataFrame:
    ops = trace.ops.copy()
    if not len(ops):
        ops["lane"] = []
        return ops
    if not show_links:
        ops = ops[ops["kind"].isin(COMPUTE_KINDS + POLICY_KINDS + NESTED_KINDS)].copy()
    dst = _dst_column(ops)
    comp = ops["kind"].isin(COMPUTE_KINDS)
    lane = "GPU " + ops["device"].astype(int).astype(str)
    if (~comp).any():
        lane = lane.where(comp, [_lane_of(r, show_links, dst) for _, r in ops.iterrows()])
    ops["lane"] = lane
    # a device holding several stages (torch's multi-stage schedules): primes mark its second, third... stage
    ranks = {d: {st: i for i, st in enumerate(sorted(g.unique()))} for d, g in ops.groupby("device")["stage"]}
    ops["chunk"] = [ranks[d][st] for d, st in zip(ops["device"], ops["stage"])]
    ops["start_u"] = unit.of(ops["start"].astype(float) - offset)
    ops["end_u"] = unit.of(ops["end"].astype(float) - offset)
    ops["dur_u"] = ops["end_u"] - ops["start_u"]
    return ops


def _bar(sub: pd.DataFrame, name: str, color: str, unit: Unit, *, pattern: str = "", legendgroup: str,
         showlegend: bool = True, text: bool = True) -> go.Bar:
    custom = np.stack([
        sub["stage"].astype(int).to_numpy(), sub["first"].astype(int).to_numpy(),
        sub["last"].astype(int).to_numpy(), sub["batch"].astype(int).to_numpy(),
        sub["kind"].map(lambda k: KIND_NAMES.get(k, str(k))).to_numpy(),
        sub["end_u"].to_numpy(),
    ], axis=-1) if len(sub) else None
    u = unit.name
    return go.Bar(
        y=sub["lane"].tolist(), x=sub["dur_u"].tolist(), base=sub["start_u"].tolist(), orientation="h",
        name=name, legendgroup=legendgroup, showlegend=showlegend,
        marker=dict(color=color, line=dict(color="white", width=0.6),
                    pattern=dict(shape=pattern, fillmode="overlay", fgcolor="white", fgopacity=0.55, solidity=0.25)),
        text=[str(int(b)) + "′" * int(c) for b, c in zip(sub["batch"], sub.get("chunk", [0] * len(sub)))]
        if text else None,
        textposition="inside", insidetextanchor="middle", textangle=0, textfont=dict(color="white", size=11),
        customdata=custom,
        hovertemplate=(
            "<b>%{y}</b> %{customdata[4]}<br>stage %{customdata[0]}, layers %{customdata[1]}–%{customdata[2]}"
            f"<br>mini-batch %{{customdata[3]}}<br>%{{base:.3f}} – %{{customdata[5]:.3f}} {u} (%{{x:.3f}} {u})"
            "<extra></extra>"
        ),
    )


def _add_trace_bars(fig: go.Figure, ops: pd.DataFrame, color_by: str, row: int | None,
                    legend_seen: set[str], unit: Unit) -> None:
    kw = dict(row=row, col=1) if row is not None else {}
    if color_by == "kind":
        for kind in _KINDS:
            sub = ops[ops["kind"] == kind]
            if not len(sub):
                continue
            name = KIND_NAMES[kind]
            fig.add_trace(_bar(sub, name, KIND_COLORS[kind], unit, legendgroup=name,
                               showlegend=name not in legend_seen), **kw)
            legend_seen.add(name)
    elif color_by == "batch":
        for b in sorted(ops["batch"].unique()):
            for kind in _KINDS:
                sub = ops[(ops["batch"] == b) & (ops["kind"] == kind)]
                if not len(sub):
                    continue
                name = f"mini-batch {int(b)}"
                pattern = _PATTERNS[kind]
                fig.add_trace(_bar(sub, name, BATCH_COLORS[int(b) % len(BATCH_COLORS)], unit, pattern=pattern,
                                   legendgroup=name, showlegend=name not in legend_seen), **kw)
                legend_seen.add(name)
    else:
        raise ValueError(f"color_by must be 'kind' or 'batch', got {color_by!r}")


def _decorate(fig: go.Figure, trace: Trace, offset: float, xref: str, yref: str, t_end: float,
              period_lines: bool, steady_state: bool, unit: Unit) -> None:
    """Shade the steady state and draw the period boundaries (shapes added in one go: fast)."""
    shapes: list[dict] = []
    notes: list[dict] = []
    win = steady_window(trace)
    periodic = trace.meta.get("schedule", "periodic") == "periodic"
    if steady_state and win is not None:
        shapes.append(dict(type="rect", xref=xref, yref=f"{yref} domain", x0=unit.of(win[0] - offset),
                           x1=unit.of(win[1] - offset), y0=0, y1=1, fillcolor="rgba(120,200,120,0.13)",
                           line_width=0, layer="below"))
        # at the band's right end: the left end is where subplot titles sit
        notes.append(dict(x=unit.of(win[1] - offset), y=1, xref=xref, yref=f"{yref} domain",
                          text="steady state", showarrow=False, xanchor="right", yanchor="bottom",
                          font=dict(size=10, color="#3a7d3a")))
    T = trace.period
    if period_lines and periodic and T and math.isfinite(T) and T > 0 and len(trace.ops):
        t0 = win[0] if win is not None else float(trace.ops["start"].min())
        first = float(trace.ops["start"].min())
        n_before = math.floor((t0 - first) / T + 1e-9)
        t = t0 - n_before * T
        count = 0
        while unit.of(t - offset) <= t_end + 1e-9 and count < 400:
            shapes.append(dict(type="line", xref=xref, yref=f"{yref} domain", x0=unit.of(t - offset),
                               x1=unit.of(t - offset), y0=0, y1=1,
                               line=dict(color="rgba(60,60,60,0.45)", width=1, dash="dot")))
            t += T
            count += 1
    if shapes:
        fig.update_layout(shapes=list(fig.layout.shapes) + shapes)
    if notes:
        fig.update_layout(annotations=list(fig.layout.annotations) + notes)


def _keep_lanes(fig: go.Figure, ops: pd.DataFrame, order: list[str], row: int | None) -> None:
    """An invisible marker on lanes without any bar, so that idle devices still get their lane."""
    missing = [l for l in order if not len(ops) or l not in set(ops["lane"])]
    if missing:
        x0 = float(ops["start_u"].min()) if len(ops) else 0.0
        fig.add_trace(go.Scatter(x=[x0] * len(missing), y=missing, mode="markers", marker=dict(opacity=0),
                                 showlegend=False, hoverinfo="skip", name="lanes"),
                      **(dict(row=row, col=1) if row is not None else {}))


def _layout(fig: go.Figure, title: str | None, n_lanes: int, rows: int = 1) -> None:
    n_legend = sum(1 for t in fig.data if t.showlegend is not False)
    height = max(220, 70 + 48 * n_lanes) if rows == 1 else max(420, 120 + 48 * n_lanes)
    if n_legend > 5:  # many mini-batches: a vertical legend on the right, clear of the title, all of it shown
        legend = dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.01, font=dict(size=10),
                      tracegroupgap=0, itemsizing="constant")
        height = max(height, 110 + 19 * n_legend)
    else:
        legend = dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1)
    fig.update_layout(
        barmode="overlay", title=title, bargap=0.25, template=TEMPLATE,
        height=height,
        margin=dict(l=80, r=20, t=60 if title else 35, b=45),
        legend=legend,
        uniformtext=dict(minsize=8, mode="hide"),
    )


def gantt(trace: Trace, *, color_by: str = "kind", show_links: bool = False, title: str | None = None,
          period_lines: bool = True, steady_state: bool = True, align: bool = False,
          periods_shown: float | None = None, unit: Unit | None = None,
          time_range: tuple[float, float] | None = None, devices: Iterable[int] | None = None,
          compact: bool | None = None) -> go.Figure:
    """A Gantt chart of ``trace``: one lane per device, one bar per operation, in ms or s (:func:`trace_unit`).

    ``color_by`` is ``"kind"`` (forward / backward / transfer) or ``"batch"``.
    ``show_links`` adds a lane per link (``link p→q`` when the trace names the
    peer in a ``peer``/``dst`` column, else ``GPU p out`` / ``GPU p in``) for
    the ``send``/``recv`` operations, which are hidden otherwise (transfers
    overlap computation). Activation policies are always drawn: recomputation
    (``R``) over the backward it belongs to, and a ``GPU p host link`` lane with
    the offload and prefetch transfers. ``align`` shifts time so the first operation starts
    at 0 (useful for measured traces). ``periods_shown`` opens the chart
    zoomed on that many periods from the start of the steady state (a dense
    schedule, e.g. a general allocation with many stages per device, becomes
    readable; zoom out to see the whole run). ``unit`` fixes the time unit and
    ``time_range`` (seconds) the x range: charts meant to be compared share both. ``devices`` shows those
    devices' lanes only (a window: ``range(56, 64)``); ``compact`` (default: above
    :data:`~workbench.viz.gantt_many.COMPACT_ABOVE` lanes) draws thin lanes of unlabelled bars, a label every
    few devices (:mod:`workbench.viz.gantt_many`).
    """
    offset = float(trace.ops["start"].min()) if (align and len(trace.ops)) else 0.0
    unit = unit or trace_unit(trace, align=align)
    shown = list(range(trace.devices)) if devices is None else device_window(devices, trace.devices)
    ops = _prepare(trace, show_links, offset, unit)
    if devices is not None and len(ops):
        ops = ops[ops["device"].isin(shown)]
    fig = go.Figure()
    _add_trace_bars(fig, ops, color_by, None, set(), unit)
    order = _lane_order(ops, shown) if len(ops) else [f"GPU {p}" for p in shown]
    many = len(order) > COMPACT_ABOVE if compact is None else bool(compact)
    t_end = float(ops["end_u"].max()) if len(ops) else 0.0
    if many and not periods_shown and trace.period and unit.of(trace.period) * MAX_PERIOD_LINES < t_end:
        period_lines = False                # a dotted line every period of a long run is a hatch
    _decorate(fig, trace, offset, "x", "y", t_end, period_lines, steady_state, unit)
    _keep_lanes(fig, ops, order, None)
    if title is None:
        T = trace.period
        per = f", period {format_seconds(T)}" if T and math.isfinite(T) else ""
        window = f" (GPU {shown[0]}–{shown[-1]} of {trace.devices})" if devices is not None else ""
        title = f"{trace.meta.get('title', trace.source.capitalize() + ' schedule')}{per}{window}"
    _layout(fig, title, len(order))
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], title=None)
    if many:
        compact_bars(fig)
        compact_layout(fig, order, title=title)
    fig.update_xaxes(title=unit.axis("time"), rangemode="tozero" if not align else "normal", tickformat=",~f")
    if time_range is not None:
        fig.update_xaxes(range=[unit.of(time_range[0]), unit.of(time_range[1])])
    window = _zoom(trace, periods_shown, offset, unit)
    if window is not None:
        fig.update_xaxes(range=window,
                         title=f"{unit.axis('time')}; zoomed on the steady state, zoom out for the whole run")
    return fig


def _zoom(trace: Trace, periods: float | None, offset: float, unit: Unit) -> list[float] | None:
    """The x range (in ``unit``) showing ``periods`` periods from the start of the steady state, or None."""
    T, win = trace.period, steady_window(trace)
    if not periods or win is None or not T or not math.isfinite(T) or T <= 0:
        return None
    t0 = win[0] - 0.1 * T
    return [unit.of(t0 - offset), unit.of(t0 + (periods + 0.2) * T - offset)]


def _subplot_title(title: str, trace: Trace) -> str:
    """``title (source)``, without repeating a source the title already says (not "measured (measured)")."""
    return title if trace.source.lower() in title.lower() else f"{title} ({trace.source})"


def gantt_compare(predicted: Trace, measured: Trace, *, color_by: str = "kind", show_links: bool = False,
                  titles: tuple[str, str] = ("predicted", "measured"), align: bool = True,
                  title: str | None = None, periods_shown: float | None = None, window_from: int | None = None,
                  measured_period: float | None = None) -> go.Figure:
    """Two Gantt charts one above the other, in one unit (ms or s, :func:`trace_unit`).

    With ``align`` each trace's time starts at its own first operation. By default they share one time
    axis. With ``periods_shown`` each chart has its own time axis and shows that many of its own periods (the
    plan's; the measured chart ``measured_period``'s) from the start of its steady state or, given
    ``window_from``, from its first stage's forward of that mini-batch: the same number of periods side by side,
    however much slower the run was. Period boundaries (dotted) are drawn on the predicted chart and, given
    ``measured_period``, on the measured one (a measured trace carries the plan's period, not its own).

    >>> import pandas as pd
    >>> from workbench.model.trace import MEMORY_COLUMNS
    >>> ops = pd.DataFrame({"device": [0] * 4, "stage": [0] * 4, "first": [0] * 4, "last": [0] * 4,
    ...     "kind": ["F", "B", "F", "B"], "batch": [0, 0, 1, 1], "start": [0.0, 0.001, 0.002, 0.003],
    ...     "end": [0.001, 0.002, 0.003, 0.004]})
    >>> t = Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), devices=1, period=0.002)
    >>> m = Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), devices=1, period=0.002, source="measured")
    >>> fig = gantt_compare(t, m, periods_shown=1, window_from=1, measured_period=0.004)
    >>> [round(x, 2) for x in fig.layout.xaxis.range], [round(x, 2) for x in fig.layout.xaxis2.range]
    ([1.9, 4.0], [1.8, 6.0])
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=periods_shown is None,
                        vertical_spacing=0.12 if periods_shown is None else 0.16,
                        subplot_titles=[_subplot_title(titles[0], predicted), _subplot_title(titles[1], measured)])
    unit = trace_unit(predicted, measured, align=align) if periods_shown is None else \
        _windows_unit((predicted, measured), periods_shown, window_from, measured_period, align)
    seen: set[str] = set()
    total_lanes = 0
    for r, tr in ((1, predicted), (2, measured)):
        if tr.source == "measured" and measured_period:
            tr = dataclasses.replace(tr, period=measured_period)
        offset = float(tr.ops["start"].min()) if (align and len(tr.ops)) else 0.0
        ops = _prepare(tr, show_links, offset, unit)
        _add_trace_bars(fig, ops, color_by, r, seen, unit)
        order = _lane_order(ops, tr.devices) if len(ops) else [f"GPU {p}" for p in range(tr.devices)]
        total_lanes += len(order)
        t_end = float(ops["end_u"].max()) if len(ops) else 0.0
        axis = "" if r == 1 else str(r)
        # a measured trace carries the plan's (predicted) period: its boundaries would not be the run's
        lines = tr.source != "measured" or bool(measured_period)
        _decorate(fig, tr, offset, f"x{axis}", f"y{axis}", t_end, lines, True, unit)
        _keep_lanes(fig, ops, order, r)
        fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], row=r, col=1)
        if periods_shown is not None and tr.period and math.isfinite(tr.period):
            start, span = _window_start(tr, window_from) - offset, periods_shown * tr.period
            fig.update_xaxes(range=[unit.of(start - 0.05 * span), unit.of(start + span)], row=r, col=1,
                             title=unit.axis("time"))
    _layout(fig, title or "Predicted against measured", total_lanes, rows=2)
    for ann in fig.layout.annotations[:2]:  # subplot titles to the left, clear of the steady-state labels
        ann.update(x=0, xanchor="left", font=dict(size=13))
    if periods_shown is None:
        fig.update_xaxes(title=unit.axis("time"), row=2, col=1)
    fig.update_xaxes(tickformat=",~f")
    return fig


def _windows_unit(traces: tuple[Trace, Trace], periods: float, batch: int | None, measured_period: float | None,
                  align: bool) -> Unit:
    """The time unit of two windowed charts: by the latest time either shows."""
    ends = []
    for tr in traces:
        if not len(tr.ops):
            continue
        period = measured_period if (tr.source == "measured" and measured_period) else tr.period
        offset = float(tr.ops["start"].min()) if align else 0.0
        ends.append(_window_start(tr, batch) - offset + periods * (period if period and math.isfinite(period) else 0))
    return time_unit(ends)


def _window_start(trace: Trace, batch: int | None) -> float:
    """Where a windowed chart starts: the first stage's forward of mini-batch ``batch``, else the steady state."""
    ops = trace.ops
    if batch is not None:
        f = ops[(ops["kind"] == "F") & (ops["stage"] == 0) & (ops["batch"] == batch)]
        if len(f):
            return float(f["start"].min())
    win = steady_window(trace)
    return win[0] if win is not None else float(ops["start"].min())


# ----- helpers for tests and notebooks ------------------------------------

def _bars(fig: go.Figure) -> Iterable[go.Bar]:
    return (t for t in fig.data if t.type == "bar")


def lanes(fig: go.Figure) -> list[str]:
    """The lanes of a Gantt chart, top to bottom."""
    order: list[str] = []
    ax = fig.layout.yaxis
    if ax.categoryarray is not None:
        return list(ax.categoryarray)[::-1]
    for t in _bars(fig):
        for y in t.y:
            if y not in order:
                order.append(y)
    return order


def bar_durations(fig: go.Figure) -> list[float]:
    """Every bar's length in the chart's time unit (its x axis title says which), in drawing order."""
    return [float(x) for t in _bars(fig) for x in t.x]
