"""The layouts of one job on one chart: tokens/s per GPU against the largest per-rank peak, coloured by family,
the Pareto frontier, the chosen layout, and published configurations placed on the same axes (notebook 09).

:func:`layout_family` names a layout's family by which of tp, pp, dp exceed 1 (:data:`FAMILY_COLOURS`);
:func:`layout_points` tabulates evaluations (:class:`workbench.parallel.evaluate.Evaluation`);
:func:`pareto` keeps the layouts no other beats on both axes; :func:`layout_frontier` draws them, with each
:class:`Published` configuration as a star at the workbench's evaluation of it and, where its authors measured
one, a diamond at their figure, joined by a dotted line.

>>> from workbench.model.layout import Layout
>>> layout_family(Layout(tp=1, pp=1, dp=64, zero=3)), layout_family(Layout(tp=4, pp=8, dp=2))
('DP (FSDP / ZeRO)', 'TP x PP x DP')
>>> t = pd.DataFrame({"peak_gib": [10.0, 20.0, 30.0], "tokens_per_gpu": [5.0, 4.0, 9.0], "fits": [True] * 3})
>>> pareto(t)["tokens_per_gpu"].tolist()
[5.0, 9.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from workbench.model.layout import Layout
from workbench.viz.gantt import TEMPLATE

__all__ = ["FAMILY_COLOURS", "Published", "layout_family", "layout_points", "pareto", "layout_frontier"]

_GIB = 2.0**30
#: a layout family (which degrees exceed 1) -> its colour
FAMILY_COLOURS = {"one GPU": "#7f7f7f", "DP (FSDP / ZeRO)": "#1f77b4", "PP (pure pipeline)": "#d62728",
                  "TP": "#bcbd22", "PP x DP": "#ff7f0e", "TP x DP": "#17becf", "TP x PP": "#9467bd",
                  "TP x PP x DP": "#2ca02c"}


@dataclass(frozen=True)
class Published:
    """A configuration someone published: ``label``, the workbench's ``evaluation`` of it, and the tokens/s per
    GPU its authors measured (None: no figure published for this set-up)."""

    label: str
    evaluation: object
    measured_tokens_per_gpu: float | None = None


def layout_family(layout: Layout) -> str:
    """The family of ``layout``: the parallel dimensions it uses (a key of :data:`FAMILY_COLOURS`)."""
    used = [name for name, degree in (("TP", layout.tp), ("PP", layout.pp), ("DP", layout.dp)) if degree > 1]
    if not used:
        return "one GPU"
    if used == ["DP"]:
        return "DP (FSDP / ZeRO)"
    if used == ["PP"]:
        return "PP (pure pipeline)"
    return " x ".join(used)


def layout_points(evaluations: Sequence, devices: int) -> pd.DataFrame:
    """One row per evaluation with a plan (``fits`` or over the memory): ``layout`` (described), ``family``,
    ``activations``, ``tokens_per_gpu``, ``mfu``, ``peak_gib`` (the fullest rank), ``fits``."""
    rows = [{"layout": e.layout.describe(), "family": layout_family(e.layout), "activations": e.activations,
             "tokens_per_gpu": e.tokens_per_second / devices, "mfu": e.mfu, "peak_gib": e.peak / _GIB,
             "fits": e.fits} for e in evaluations if e.memory]
    return pd.DataFrame(rows, columns=["layout", "family", "activations", "tokens_per_gpu", "mfu", "peak_gib", "fits"])


def pareto(points: pd.DataFrame) -> pd.DataFrame:
    """The rows that fit and that no row needing no more memory beats on tokens/s per GPU, by memory."""
    ok = points[points["fits"]].sort_values(["peak_gib", "tokens_per_gpu"], ascending=[True, False])
    best, keep = -1.0, []
    for i, row in ok.iterrows():
        if row["tokens_per_gpu"] > best:
            best = row["tokens_per_gpu"]
            keep.append(i)
    return ok.loc[keep]


def layout_frontier(evaluations: Sequence, devices: int, *, title: str, memory_limit: float | None = None,
                    published: Sequence[Published] = (), chosen=None, height: int = 560) -> go.Figure:
    """Tokens/s per GPU against the fullest rank's peak (GiB) of every evaluated layout, a colour per family
    (hollow: over the memory), the Pareto frontier as a grey band, ``memory_limit`` (bytes) dashed, the
    ``published`` configurations (module docstring, a star in their family's colour) and the ``chosen``
    evaluation ringed."""
    points = layout_points(evaluations, devices)
    fig = go.Figure()
    front = pareto(points)
    if len(front):
        fig.add_scatter(x=front["peak_gib"], y=front["tokens_per_gpu"], mode="lines", line_shape="hv",
                        name="frontier (fastest at each memory)", hoverinfo="skip",
                        line=dict(color="rgba(120,120,120,0.3)", width=12))
    for family, colour in FAMILY_COLOURS.items():
        g = points[points["family"] == family].sort_values("fits", ascending=False)   # the legend shows the first
        if g.empty:
            continue
        symbols = ["circle" if f else "circle-open" for f in g["fits"]]
        fig.add_scatter(x=g["peak_gib"], y=g["tokens_per_gpu"], mode="markers", name=family,
                        marker=dict(color=colour, size=8, symbol=symbols, line=dict(width=1.5, color=colour)),
                        text=g["layout"] + ", " + g["activations"],
                        hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tokens/s per GPU<extra></extra>")
    _published(fig, published, devices)
    if chosen is not None and chosen.memory:
        fig.add_scatter(x=[chosen.peak / _GIB], y=[chosen.tokens_per_second / devices], mode="markers+text",
                        name="chosen", text=["chosen"], textposition="bottom center", hoverinfo="skip",
                        marker=dict(symbol="circle-open", size=26, color="#111", line=dict(width=2.5)))
    if memory_limit is not None:
        fig.add_vline(x=memory_limit / _GIB, line=dict(color="#444", dash="dash", width=1),
                      annotation_text="GPU memory", annotation_position="top left")
    fig.update_xaxes(title_text="largest per-rank peak memory (GiB)", rangemode="tozero")
    fig.update_yaxes(title_text="tokens / s per GPU", rangemode="tozero")
    fig.update_layout(template=TEMPLATE, height=height, title=dict(text=title, subtitle=dict(
        text="every layout the search evaluated (hollow: over the memory); stars: published configurations as the "
             "workbench evaluates them, diamonds: the figures published for them")),
                      legend=dict(orientation="h", yanchor="top", y=-0.16, xanchor="left", x=0),
                      margin=dict(l=70, r=20, t=90, b=140))
    return fig


def _published(fig: go.Figure, published: Sequence[Published], devices: int) -> None:
    for i, p in enumerate(published):
        e = p.evaluation
        if not getattr(e, "memory", None):
            continue
        x, y = e.peak / _GIB, e.tokens_per_second / devices
        fig.add_scatter(x=[x], y=[y], mode="markers+text", name=p.label, showlegend=False, text=[p.label],
                        textposition="middle right" if i % 2 == 0 else "middle left", textfont=dict(size=10),
                        marker=dict(symbol="star", size=16, color=FAMILY_COLOURS[layout_family(e.layout)],
                                    line=dict(width=1.5, color="#111")),
                        hovertemplate=f"{p.label}: workbench %{{y:,.0f}} tokens/s per GPU<extra></extra>")
        if p.measured_tokens_per_gpu is not None:
            fig.add_scatter(x=[x, x], y=[y, p.measured_tokens_per_gpu], mode="lines+markers", showlegend=False,
                            line=dict(color="#111", dash="dot", width=1),
                            marker=dict(symbol=["star", "diamond-open"], size=[1, 11], color="#111"),
                            hovertemplate=f"{p.label}: published %{{y:,.0f}} tokens/s per GPU<extra></extra>")
