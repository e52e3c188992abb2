"""Gantt charts of many devices: a compact view, and a window of devices.

At 48 pixels a lane, a plan on 64 GPUs is a chart 3,000 pixels tall, and its bars, each outlined in white and
labelled with its mini-batch, thinner than their outlines: a hatch nobody can read. Above
:data:`COMPACT_ABOVE` lanes :func:`~workbench.viz.gantt.gantt` draws the **compact view**
(:func:`compact_bars`, :func:`compact_layout`): :data:`LANE_PX` pixels a lane, bars filled edge to edge without
outline, label or hatching (the kind, or the mini-batch, is the colour; hovering still names each operation),
a lane label every few devices (:func:`label_every`: every 4th at 64 devices, so on node boundaries where nodes
have 4 or 8)
and, over a run of many periods, no period lines (``periods_shown`` zooms on a few, and draws them). The
pipeline's shape, its fill, steady state and drain from the first device to the last, is what such a chart
can show; ``devices=`` (:func:`device_window`) shows a window of devices at full size, labels and all.

>>> label_every(64), label_every(12), label_every(512), device_window(range(60, 70), 64)
(4, 1, 32, [60, 61, 62, 63])
"""

from __future__ import annotations

from typing import Iterable

import plotly.graph_objects as go

__all__ = ["COMPACT_ABOVE", "LANE_PX", "MAX_PERIOD_LINES", "label_every", "device_window", "compact_bars",
           "compact_layout"]

#: more lanes than this: the compact view (16 lanes at full size are about 850 pixels tall)
COMPACT_ABOVE = 16
#: pixels a lane in the compact view
LANE_PX = 14
#: the compact view draws period lines only over runs of at most this many periods
MAX_PERIOD_LINES = 24


def label_every(lanes: int) -> int:
    """How many lanes apart the compact view labels them: 1 up to :data:`COMPACT_ABOVE`, else a power of two
    that leaves 8 to 16 labels."""
    step = 1
    while lanes / step > COMPACT_ABOVE:
        step *= 2
    return step


def device_window(devices: Iterable[int], total: int) -> list[int]:
    """The devices of ``devices`` that a trace of ``total`` devices has, in order; a ``ValueError`` when none."""
    shown = sorted({int(d) for d in devices if 0 <= int(d) < total})
    if not shown:
        raise ValueError(f"devices: none of {list(devices)[:8]} is a device of this trace (0..{total - 1})")
    return shown


def compact_bars(fig: go.Figure) -> None:
    """Every bar of ``fig`` filled edge to edge: no white outline, no label, no hatching."""
    fig.update_traces(selector=dict(type="bar"), marker_line_width=0, text=None, marker_pattern_shape="")


def compact_layout(fig: go.Figure, order: list[str], *, title: str | None) -> None:
    """:data:`LANE_PX` pixels a lane (or what a long legend needs), little gap between bars, the GPU lanes labelled
    every :func:`label_every`."""
    gpus = [lane for lane in order if lane.startswith("GPU ") and lane.split()[1].isdigit() and len(lane.split()) == 2]
    step = label_every(len(gpus))
    shown = [lane for lane in gpus if int(lane.split()[1]) % step == 0]
    legend = sum(1 for t in fig.data if t.showlegend is not False)
    fig.update_layout(height=max(260, 110 + LANE_PX * len(order), 110 + 19 * legend if legend > 5 else 0), bargap=0.08,
                      margin=dict(l=80, r=20, t=60 if title else 35, b=45))
    fig.update_yaxes(tickmode="array", tickvals=shown, ticktext=shown, showgrid=False,
                     title=f"{len(gpus)} devices, every {step} labelled" if step > 1 else None)
