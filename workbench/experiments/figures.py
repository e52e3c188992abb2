"""The experiments' figures (plotly), built from the tidy tables of the units; nothing is written here.

Each ``*_figure`` function returns a :class:`FigureInfo`: the figures with
the file stems they are saved under, the tables to save beside them, and the
headline numbers for the report. :func:`workbench.experiments.reproduce`
writes them (HTML, PNG, CSV); the notebooks show them.

Conventions: *normalised throughput* is lower bound / period (1 means the
plan reaches ``max(sum of compute / P, largest layer)``, no plan can do
better); a log axis is labelled only at values that say what they are (the
memory levels tried, or powers of ten).

>>> import pandas as pd
>>> info = family_figure(pd.DataFrame({"k": [2, 2], "method": ["dp", "brute"], "allocation": ["contiguous", "general"],
...     "status": ["optimal", "optimal"], "period": [2.0, 1.0]}))
>>> info.stems, info.headlines
(['family'], ['k=2: measured factor 2 (brute), predicted 2'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.experiments.analyses import GiB, headline_gains, min_memory_table
from workbench.experiments.complexity import family_factor
from workbench.experiments.settings import METHOD_LABELS
from workbench.experiments.units import slug
from workbench.methods import VARIANTS, lineup, method
from workbench.model.units import format_seconds
from workbench.viz.gantt import TEMPLATE

__all__ = ["FigureInfo", "throughput_figure", "memory_figure", "min_memory_figure", "solve_times_figure",
           "three_partition_figure", "family_figure", "scaling_figure", "gains_figure", "largest_figure",
           "METHOD_STYLES",
           "log_axis_ticks"]

#: method key -> (colour, line dash, line width, marker, marker size), bottom to top (the registry's variants,
#: :data:`workbench.methods.VARIANTS`): where methods coincide the one drawn first shows as a wider line and a
#: larger marker around the next (PipeDream around the DP, the DP around the contiguous ILP, drawn dashed with
#: open squares, and that around the general ILP)
METHOD_STYLES: dict[str, tuple[str, str, float, str, int]] = {
    v.key: (v.colour, v.style.dash, v.style.width, v.style.marker, v.style.size)
    for v in sorted(VARIANTS, key=lambda v: v.layer)}
_LEGEND_NOTES = {v.key: v.legend_note for v in VARIANTS if v.legend_note}
_LEGEND_ORDER = list(METHOD_LABELS)
#: method label -> colour, for the bar charts
LABEL_COLORS = {v.label: v.colour for v in VARIANTS}


@dataclass
class FigureInfo:
    """One figure of the report: its plotly figures (saved as ``<stem>.html/.png``), tables and headlines."""

    name: str
    title: str
    files: list[str] = field(default_factory=list)  # filled in when written
    headlines: list[str] = field(default_factory=list)
    figs: list = field(default_factory=list, repr=False)
    stems: list[str] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def add(self, stem: str, fig: go.Figure) -> None:
        self.stems.append(stem)
        self.figs.append(fig)


def _x(v: float) -> str:
    return f"{v:.3g}x" if math.isfinite(v) else "n/a (no case where both fit)"


def log_axis_ticks(values: Any, digits: int = 3) -> dict[str, Any]:
    """Tick settings for a log axis labelled at ``values`` (e.g. the memory levels), each shown in full.

    >>> log_axis_ticks([0.5, 1.25, 3.0])["ticktext"]
    ['0.5', '1.25', '3']
    """
    vals = sorted({float(v) for v in values if np.isfinite(v) and v > 0})
    return {"type": "log", "tickmode": "array", "tickvals": vals, "ticktext": [f"{v:.{digits}g}" for v in vals]}


def _decades(fig: go.Figure, axis: str = "y") -> None:
    """Label a log axis at powers of ten only (no unlabelled 2s and 5s that read as other numbers)."""
    (fig.update_yaxes if axis == "y" else fig.update_xaxes)(dtick=1, tickformat="~g", minor=dict(showgrid=True))


def throughput_figure(sw: pd.DataFrame) -> FigureInfo:
    """Normalised throughput against the memory limit, one figure per network, one panel per P (ascending)."""
    info = FigureInfo("throughput", "Normalised throughput (lower bound / period) against the memory limit")
    d = sw.copy()
    d["normalised"] = np.where(d["fits"].astype(bool), d["normalised_throughput"], np.nan)
    d["memory_gib"] = d["memory_limit"] / GiB
    info.tables["throughput.csv"] = d.drop(columns=["note"], errors="ignore")
    for net, g in d.groupby("network", sort=False):
        info.add(f"throughput_{slug(net)}", _throughput_panels(net, g))
    _throughput_headlines(sw, info)
    return info


def _throughput_panels(net: str, g: pd.DataFrame) -> go.Figure:
    Ps = sorted(int(p) for p in g["devices"].unique())
    fig = make_subplots(rows=1, cols=len(Ps), subplot_titles=[f"P = {P}" for P in Ps], horizontal_spacing=0.06,
                        shared_yaxes=True)
    for c, P in enumerate(Ps, start=1):
        gp = g[g.devices == P]
        for mk, (color, dash, width, symbol, size) in METHOD_STYLES.items():
            gm = gp[gp.method_key == mk].sort_values("memory_limit")
            if gm.empty:
                continue
            name = METHOD_LABELS.get(mk, mk) + _LEGEND_NOTES.get(mk, "")
            fig.add_scatter(x=gm["memory_gib"], y=gm["normalised"], mode="lines+markers", name=name, legendgroup=mk,
                            legendrank=_LEGEND_ORDER.index(mk) if mk in _LEGEND_ORDER else 99, showlegend=c == 1,
                            line=dict(color=color, dash=dash, width=width),
                            marker=dict(symbol=symbol, size=size, color=color),
                            hovertemplate=f"{name}<br>%{{x:.3g}} GiB: %{{y:.3f}}<extra>P={P}</extra>", row=1, col=c)
        fig.update_xaxes(**log_axis_ticks(gp["memory_gib"]), title_text="memory limit (GiB, log)", row=1, col=c)
    fig.update_yaxes(range=[0, 1.05], title_text="lower bound / period", row=1, col=1)
    fig.update_layout(template=TEMPLATE, height=540, margin=dict(l=60, r=20, t=90, b=190),
                      title=dict(text=f"{net}: normalised throughput (lower bound / period; 1 = the bound) "
                                      "against memory",
                                 subtitle=dict(text="x: the memory levels tried, per device. A missing point: the "
                                                    "method finds no plan that fits.")),
                      legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0))
    return fig


#: the optimal periodic ILPs a flushed schedule may beat (another family: the headlines count those cases)
_ILP_KEYS = [v.key for v in VARIANTS if v.method == "ilp"]
_FLUSHED_KEYS = [v.key for v in VARIANTS if method(v.method).family == "flushed"]


def _throughput_headlines(sw: pd.DataFrame, info: FigureInfo) -> None:
    hg = headline_gains(sw)
    for _, r in hg[hg.cases > 0].iterrows() if len(hg) else []:
        info.headlines.append(
            f"{r.network}: general ILP over PipeDream at tight memory (lower half of the levels, {r.cases} (P, level) "
            f"cases): median gain {_x(r.median_gain)}, best {_x(r.best_gain)} over the {r.both_fit} where both fit; "
            f"PipeDream's partitioner finds nothing that fits in {r.over_does_not_fit} of them")
    flushed_wins = []
    for (net, P, lvl), g in sw[sw.fits.astype(bool)].groupby(["network", "devices", "level"]):
        ilp = g[g.method_key.isin(_ILP_KEYS) & (g.status == "optimal")]
        fl = g[g.method_key.isin(_FLUSHED_KEYS)]
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
        info.headlines.append(f"{r.network}: memory-aware DP over PipeDream at tight memory: median "
                              f"{_x(r.median_gain)}, best {_x(r.best_gain)}; PipeDream does not fit in "
                              f"{r.over_does_not_fit}/{r.cases}")


def _memory_rows(sw: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (net, P, lvl, mk), g in sw.groupby(["network", "devices", "level", "method_key"], sort=False):
        r = g.iloc[0]
        if not isinstance(r.memory_per_device, str) or not r.memory_per_device:
            continue
        for dev, m in enumerate(float(x) for x in r.memory_per_device.split(";")):
            rows.append({"network": net, "devices": P, "level": lvl, "method_key": mk, "label": r.label,
                         "device": dev, "memory": m, "memory_gib": m / GiB, "memory_limit": r.memory_limit,
                         "fits": bool(r.fits), "may_vary": bool(r.get("may_vary", False))})
    return pd.DataFrame(rows)


def memory_figure(sw: pd.DataFrame) -> FigureInfo:
    """Memory per device of each method's plan (largest P, middle memory level), against the limit."""
    info = FigureInfo("memory", "Memory per device of the chosen plans (largest P, middle memory level)")
    d = _memory_rows(sw)
    info.tables["memory_per_device.csv"] = d
    if d.empty:
        info.headlines.append("no plan of any method has a memory figure: nothing to draw")
        return info
    for net, g in d.groupby("network", sort=False):
        P = int(g["devices"].max())
        lvl = int(sw[(sw.network == net) & (sw.devices == P)]["level"].max()) // 2
        gg = g[(g.devices == P) & (g.level == lvl)]
        at = sw[(sw.network == net) & (sw.devices == P) & (sw.level == lvl)]
        none = sorted(set(at.label) - set(gg.label))
        if gg.empty:
            info.headlines.append(f"{net}, P={P}, level {lvl}: no method has a plan; no figure")
            continue
        limit = float(gg["memory_limit"].iloc[0])
        note = f"No plan, so no bars: {', '.join(none)}." if none else ""
        fig = px.bar(gg, x="device", y="memory_gib", color="label", barmode="group", color_discrete_map=LABEL_COLORS,
                     category_orders={"label": list(METHOD_LABELS.values())},
                     labels={"memory_gib": "memory (GiB)", "label": "method", "device": "device"})
        fig.update_layout(title=dict(text=f"{net}, P={P}: memory per device at limit {limit / GiB:.3g} GiB (dashed)",
                                     subtitle=dict(text=note)), margin=dict(t=90))
        fig.add_hline(y=limit / GiB, line_dash="dash")
        info.add(f"memory_{slug(net)}", fig)
        over = gg[~gg.fits]["label"].unique()
        peaks = gg.groupby("label")["memory_gib"].max().items()
        info.headlines.append(f"{net}, P={P}, limit {limit / GiB:.3g} GiB: peak per method "
                              + ", ".join(f"{l} {m:.3g} GiB" for l, m in peaks)
                              + (f"; over the limit (flushed schedules ignore it): {', '.join(over)}"
                                 if len(over) else "")
                              + (f"; no plan: {', '.join(none)}" if none else ""))
    return info


def min_memory_figure(sw: pd.DataFrame) -> FigureInfo:
    """The least memory level at which each method reaches 95% of the best throughput."""
    info = FigureInfo("min_memory", "Least memory (of the levels tried) to reach 95% of the best throughput")
    t = min_memory_table(sw)
    info.tables["min_memory.csv"] = t
    if t.empty:
        return info
    reached = t[np.isfinite(t["min_memory_relative"])]       # a bar slot only for a method that has a bar somewhere
    absent = set(t.label) - set(reached.label)
    never = [m for m in METHOD_LABELS.values() if m in absent]
    subtitle = "A missing bar: the method does not reach 95% there at the levels tried. Each row has its own scale."
    if never:
        subtitle += f"<br>Never within 95% anywhere: {', '.join(never)}."
    fig = px.bar(reached, x="network", y="min_memory_relative", color="label", barmode="group", facet_row="devices",
                 color_discrete_map=LABEL_COLORS,
                 category_orders={"label": list(METHOD_LABELS.values()), "devices": sorted(t.devices.unique())},
                 labels={"min_memory_relative": "memory / least feasible", "label": "method", "devices": "P"})
    fig.for_each_yaxis(lambda a: a.update(title_text=""))  # one y title for all rows, not one per row on top of another
    fig.add_annotation(text="memory / least feasible memory", textangle=-90, x=-0.07, y=0.5, xref="paper", yref="paper",
                       showarrow=False, font=dict(size=14))
    fig.update_layout(title=dict(text="Least memory reaching 95% of the best throughput (relative to the least "
                                      "feasible)",
                                 subtitle=dict(text=subtitle)),
                      margin=dict(t=110, l=90), height=220 + 200 * t.devices.nunique(), bargap=0.12)
    fig.update_yaxes(matches=None, rangemode="tozero")      # P = 2's bars are a few x, P = 8's up to 50x
    info.add("min_memory", fig)
    for (net, P), g in t.groupby(["network", "devices"], sort=False):
        info.headlines.append(f"{net}, P={P}: " + ", ".join(
            f"{r.label} {r.min_memory_relative:.3g}x" if math.isfinite(r.min_memory_relative) else f"{r.label} never"
            for _, r in g.iterrows()))
    return info


def solve_times_figure(sw: pd.DataFrame) -> FigureInfo:
    """Solve time of every plan, per method (log scale, time-outs marked)."""
    info = FigureInfo("solve_times", "Solve times per method")
    d = sw[["network", "devices", "level", "method_key", "label", "status", "seconds", "timed_out"]
           + (["may_vary"] if "may_vary" in sw else [])].copy()
    info.tables["solve_times.csv"] = d
    d["outcome"] = np.where(d["timed_out"].astype(bool), "time-out", d["status"])
    fig = px.scatter(d, x="label", y="seconds", color="network", symbol="outcome", log_y=True,
                     category_orders={"label": list(METHOD_LABELS.values())},
                     labels={"label": "method", "seconds": "solve time (s, log)"},
                     title="Solve time per plan (log scale; symbol: outcome, time-outs marked)")
    _decades(fig, "y")
    info.add("solve_times", fig)
    for mk, g in d.groupby("label", sort=False):
        info.headlines.append(f"{mk}: median {format_seconds(g.seconds.median())}, "
                              f"max {format_seconds(g.seconds.max())}, "
                              f"time-outs {int(g.timed_out.astype(bool).sum())}/{len(g)}")
    return info


def three_partition_figure(df: pd.DataFrame) -> FigureInfo:
    info = FigureInfo("three_partition", "3-PARTITION reduction: optimal general period / B, yes and no instances")
    info.tables["three_partition.csv"] = df
    d = df.copy()
    d["period_over_B"] = d["period"] / d["bound"]
    d["instance"] = d["generated_as"] + " m=" + d["m"].astype(str) + " #" + d["seed"].astype(str)
    fig = px.scatter(d, x="instance", y="period_over_B", color="method", symbol="status",
                     labels={"period_over_B": "optimal period / B"},
                     title="3-PARTITION to the no-memory general problem: period = B exactly for yes instances")
    fig.add_hline(y=1.0, line_dash="dash")
    # the methods agree, so their points coincide: set them side by side within each instance's slot
    fig.update_layout(scattermode="group", scattergap=0.6)
    fig.update_traces(marker_size=10)
    info.add("three_partition", fig)
    for meth, g in d.groupby("method"):
        dec = g[g.status == "optimal"]
        agree = int((dec["planner_says_yes"].astype(bool) == dec["exhaustive_yes"].astype(bool)).sum())
        info.headlines.append(f"{meth}: decides {len(dec)}/{len(g)} instances, agrees with exhaustive search on "
                              f"{agree}/{len(dec)}")
    return info


def family_figure(df: pd.DataFrame) -> FigureInfo:
    info = FigureInfo("family", "A family where general allocations win by a factor k")
    info.tables["family.csv"] = df
    rows, unproven = [], []
    for k, g in df.groupby("k"):
        by = {(r.method, r.allocation): r for _, r in g.iterrows()}
        cont = by.get(("dp", "contiguous"))
        for key in (k for k in lineup("family") if k[1] == "general"):
            gen = by.get(key)
            if cont is not None and gen is not None and gen.status == "optimal":
                rows.append({"k": k, "general_method": key[0], "measured_factor": cont.period / gen.period,
                             "predicted_factor": family_factor(int(k))})
            elif gen is not None:
                unproven.append(f"k={k} {key[0]} ({gen.status})")
    f = pd.DataFrame(rows)
    if not f.empty:
        fig = px.line(f, x="k", y="measured_factor", color="general_method", markers=True,
                      labels={"measured_factor": "contiguous period / general period"},
                      title="general vs contiguous optimum on the family (dashed: predicted factor k)")
        fig.add_scatter(x=f["k"], y=f["predicted_factor"], mode="lines", line_dash="dash", name="predicted")
        fig.update_xaxes(dtick=1)                 # k is a whole number
        info.add("family", fig)
        for _, r in f.iterrows():
            info.headlines.append(f"k={r.k}: measured factor {r.measured_factor:.4g} ({r.general_method}), "
                                  f"predicted {r.predicted_factor:g}")
    if unproven:
        info.headlines.append("left out of the figure (no proven optimum): " + ", ".join(unproven))
    return info


def scaling_figure(df: pd.DataFrame) -> FigureInfo:
    info = FigureInfo("scaling", "Solve time against layers and devices (log scale, time-outs marked)")
    info.tables["scaling.csv"] = df.drop(columns=["note"], errors="ignore")
    d = df.copy()
    d["solver"] = d["method"] + " " + d["allocation"]
    d["outcome"] = np.where(d["timed_out"].astype(bool), "time-out", d["status"])
    fig = px.scatter(d, x="n_layers", y="seconds", color="solver", symbol="outcome", facet_col="devices", log_y=True,
                     category_orders={"devices": sorted(d.devices.unique())},
                     labels={"n_layers": "layers", "seconds": "solve time (s, log)", "devices": "P"},
                     title="Solve time against layers and devices (symbol: time-out)")
    _decades(fig, "y")
    info.add("scaling", fig)
    for (solver, P), g in d.groupby(["solver", "devices"]):
        to = g[g.timed_out.astype(bool)]
        first = int(to.n_layers.min()) if len(to) else None
        info.headlines.append(f"{solver}, P={P}: max {format_seconds(g.seconds.max())}; "
                              + (f"first time-out at {first} layers" if first else "no time-out"))
    return info


def gains_figure(df: pd.DataFrame) -> FigureInfo:
    info = FigureInfo("gains", "Gains over random instances: general over contiguous, memory-aware DP over PipeDream")
    info.tables["gains.csv"] = df
    long = pd.concat([
        pd.DataFrame({"memory_position": df.memory_position, "gain": df.gain_general, "what": "general / contiguous"}),
        pd.DataFrame({"memory_position": df.memory_position,
                      "gain": df.gain_dp_over_pipedream.replace(np.inf, np.nan),
                      "what": "memory-aware DP / PipeDream"}),
    ])
    fig = px.box(long, x="memory_position", y="gain", color="what", points="all",
                 labels={"memory_position": "memory limit (0 = least feasible, 1 = unlimited, log scale)",
                         "gain": "throughput gain"},
                 title="Throughput gains over random chains (PipeDream infeasible cases not shown; see report)")
    info.add("gains", fig)
    for pos, g in df.groupby("memory_position"):
        gg = g.gain_general.dropna()
        gd = g.gain_dp_over_pipedream.replace(np.inf, np.nan).dropna()
        nofit = int(np.isinf(g.gain_dp_over_pipedream).sum())
        info.headlines.append(
            f"memory position {pos:g}: general/contiguous median {gg.median():.3g}x, best {gg.max():.3g}x, >1 in "
            f"{int((gg > 1 + 1e-6).sum())}/{len(gg)}; DP/PipeDream median {gd.median():.3g}x, best {gd.max():.3g}x, "
            f"PipeDream infeasible in {nofit}/{len(g)}")
    return info


#: largest-model methods (short labels) -> the sweep variant whose colour they take (``+ auto``: the same colour,
#: hatched)
_LARGEST_COLOURS = {v.short: v.key for v in VARIANTS}


def _largest_panels(df: pd.DataFrame, title: str) -> go.Figure:
    """Parameters of the largest model per family (top) and the period over the bound there (bottom)."""
    fams = [f for f in ("depth", "width") if f in set(df.family)]
    fig = make_subplots(rows=2, cols=len(fams), shared_xaxes=True, vertical_spacing=0.1, horizontal_spacing=0.08,
                        subplot_titles=[f"by {f}: parameters of the largest that fits" for f in fams]
                        + [f"by {f}: period / lower bound there" for f in fams])
    for c, fam in enumerate(fams, start=1):
        g = df[df.family == fam]
        for label in dict.fromkeys(g.method):
            colour = METHOD_STYLES[_LARGEST_COLOURS.get(label.replace(" + auto", ""), "dp")][0]
            h = g[g.method == label].sort_values("devices")
            x = [f"P = {int(p)}" for p in h.devices]
            pattern = dict(shape="/" if label.endswith("auto") else "", fgcolor="white", solidity=0.35,
                           fillmode="overlay")
            text = [f"{v:.2f}x" if np.isfinite(v) else "" for v in h.vs_pipedream]
            fig.add_trace(go.Bar(x=x, y=h.parameters / 1e6, name=label, legendgroup=label, showlegend=c == 1,
                                 marker=dict(color=colour, pattern=pattern), text=text, textposition="outside",
                                 textfont=dict(size=9), hovertemplate=f"{label}<br>%{{x}}: %{{y:.0f}} M parameters"
                                 "<br>%{text} PipeDream's<extra></extra>"), row=1, col=c)
            fig.add_trace(go.Bar(x=x, y=h.period_over_bound, name=label, legendgroup=label, showlegend=False,
                                 marker=dict(color=colour, pattern=pattern),
                                 hovertemplate=f"{label}<br>%{{x}}: period / bound %{{y:.2f}}<extra></extra>"),
                          row=2, col=c)
        fig.update_yaxes(title_text="million parameters" if c == 1 else None, row=1, col=c)
        fig.update_yaxes(title_text="period / lower bound (1 = ideal)" if c == 1 else None, row=2, col=c)
    fig.update_layout(template=TEMPLATE, barmode="group", height=760, bargap=0.18, bargroupgap=0.05, title=title,
                      legend=dict(orientation="h", yanchor="top", y=-0.06, xanchor="left", x=0),
                      margin=dict(l=70, r=20, t=80, b=110))
    return fig


def largest_figure(df: pd.DataFrame) -> FigureInfo:
    """The largest model that fits (workbench.experiments.largest), one figure per criterion (any period; within 10 % of
    the method's full speed): parameters per family, device count and method (keep solid, ``+ auto``
    hatched), the ratio to PipeDream's partition on each bar, and below the throughput each pays there."""
    info = FigureInfo("largest", "The largest GPT that fits: PipeDream's partition, mCAP, dp and the general ILP, "
                                 "with and without recompute/offload chosen per layer")
    info.tables["largest.csv"] = df
    crits = list(dict.fromkeys(df.criterion)) if "criterion" in df else ["any period"]
    for crit in crits:
        g = df[df.criterion == crit] if "criterion" in df else df
        stem = "largest" if crit == crits[0] else "largest_" + "".join(ch if ch.isalnum() else "_" for ch in crit)
        info.add(stem, _largest_panels(g, f"Largest GPT that fits per device count ({crit}): bars labelled with "
                                          "the ratio to PipeDream's partition"))
    keys = ["family", "devices"] + (["criterion"] if "criterion" in df else [])
    for key, g in df.groupby(keys):
        r = g.set_index("method")
        parts = [f"{m} {r.vs_pipedream[m]:.2f}x (period/bound {r.period_over_bound[m]:.2f})"
                 for m in r.index if m != "PipeDream" and np.isfinite(r.vs_pipedream[m])]
        where = ", ".join([str(key[0]), f"P={key[1]}"] + [str(k) for k in key[2:]])
        info.headlines.append(f"{where}: PipeDream fits {r.parameters.get('PipeDream', 0) / 1e6:.0f} M parameters "
                              f"(period/bound {r.period_over_bound.get('PipeDream', math.nan):.2f}); "
                              + "; ".join(parts))
    return info
