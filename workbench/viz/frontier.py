"""Throughput against memory for every planning method, with the frontier: the fastest plan that fits at each limit.

:func:`frontier_figure` draws a table with one row per (method, memory limit)
(``method_key``, ``label``, ``family``, ``memory_limit`` in bytes,
``throughput`` in mini-batches per second, 0 where the method's plan does not
fit; :func:`workbench.experiments.schedules.frontier_table` makes one): a line
per method in its registry colour and style (:data:`workbench.methods.VARIANTS`;
flushed schedules dotted or dashed), and the frontier as a wide grey band
under them, each of its points labelled with the method that reaches it.

>>> import pandas as pd
>>> t = pd.DataFrame({"method_key": ["dp", "dp", "1f1b", "1f1b"], "label": ["memory-aware DP"] * 2 + ["1F1B-flush"] * 2,
...                   "family": ["periodic"] * 2 + ["flushed"] * 2, "memory_limit": [1e9, 2e9, 1e9, 2e9],
...                   "throughput": [1.0, 2.0, 0.0, 2.5]})
>>> frontier_points(t)["label"].tolist()
['memory-aware DP', '1F1B-flush']
>>> len(frontier_figure(t, "toy").data)
3
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.methods import VARIANTS
from workbench.viz.gantt import TEMPLATE

__all__ = ["frontier_points", "frontier_figure"]

_GIB = 2.0**30


def frontier_points(table: pd.DataFrame) -> pd.DataFrame:
    """Per memory limit, the row of the fastest method whose plan fits (none where nothing fits)."""
    ok = table[table["throughput"] > 0]
    if ok.empty:
        return ok
    return ok.loc[ok.groupby("memory_limit")["throughput"].idxmax()].sort_values("memory_limit")


def frontier_figure(table: pd.DataFrame, title: str, height: int = 520) -> go.Figure:
    """Throughput (mini-batches per second) against the memory limit per device, a line per method and the
    frontier beneath (see the module docstring)."""
    fig = go.Figure()
    best = frontier_points(table)
    if len(best):
        fig.add_scatter(x=best["memory_limit"] / _GIB, y=best["throughput"], mode="lines+markers+text",
                        name="best that fits (frontier)", line=dict(color="rgba(120,120,120,0.35)", width=14),
                        marker=dict(size=4, color="rgba(0,0,0,0)"), text=best["label"], textposition="top center",
                        textfont=dict(size=9, color="#555"), hoverinfo="skip")
    for v in sorted(VARIANTS, key=lambda v: v.layer):
        g = table[table["method_key"] == v.key].sort_values("memory_limit")
        if g.empty:
            continue
        y = g["throughput"].where(g["throughput"] > 0)
        fig.add_scatter(x=g["memory_limit"] / _GIB, y=y, mode="lines+markers", name=v.label,
                        line=dict(color=v.colour, dash=v.style.dash, width=min(v.style.width, 3.0)),
                        marker=dict(symbol=v.style.marker, size=min(v.style.size, 10), color=v.colour),
                        hovertemplate=f"{v.label}<br>%{{x:.3g}} GiB: %{{y:.3g}} mini-batches/s<extra></extra>")
    fig.update_xaxes(type="log", title_text="memory limit per device (GiB, log)")
    fig.update_yaxes(rangemode="tozero", title_text="throughput (mini-batches / s)")
    fig.update_layout(template=TEMPLATE, height=height, title=dict(text=title, subtitle=dict(
        text="a missing point: the method's plan does not fit; grey band: the fastest plan that fits")),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0),
                      margin=dict(l=70, r=20, t=90, b=150))
    return fig
