"""What recompute and offload buy and cost: throughput against memory per activation policy (notebook 02).

:func:`policy_sweep` plans one chain at several memory limits with every layer kept,
recomputed or offloaded, and with the policies chosen per layer (``auto``);
:func:`policy_sweep_figure` draws normalised throughput (lower bound / period) against the
limit, one line per policy.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
>>> df = policy_sweep(ch, Target.of(2, memory_model="paper", host_bandwidth=100), [300, 500])
>>> df[df.memory == 300][["activations", "throughput"]].values.tolist()
[['keep', 0.6667], ['recompute', 0.75], ['offload', 0.6], ['auto', 0.8571]]
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from workbench.model.chain import Chain
from workbench.model.target import Target
from workbench.model.units import byte_unit
from workbench.viz.gantt import TEMPLATE

__all__ = ["policy_sweep", "policy_sweep_figure", "POLICY_COLORS"]

POLICY_COLORS = {"keep": "#3366CC", "recompute": "#B6471B", "offload": "#4E9A96", "auto": "#2CA02C"}


def policy_sweep(chain: Chain, platform: Target, memories: Sequence[float | str], *, method: str = "dp",
                 policies: Sequence[str] = ("keep", "recompute", "offload", "auto")) -> pd.DataFrame:
    """One row per (memory limit, policy): ``throughput`` (lower bound / period, 0 without a plan), period,
    peak memory and, for ``auto``, the policies chosen."""
    from workbench.model.activations import describe
    from workbench.planners import plan as run_planner

    rows = []
    for M in memories:
        plat = platform.with_(memory=M)
        for pol in policies:
            p = run_planner(chain, plat, method, activations=pol)
            ok = p.feasible and p.fits
            rows.append({"memory": plat.memory_limit, "activations": pol,
                         "throughput": round(p.lower_bound / p.period, 4) if ok else 0.0,
                         "period": p.period if ok else float("nan"),
                         "peak": p.peak_memory if ok else float("nan"),
                         "chosen": (describe(p.activations) if p.activations else "keep") if ok else "no plan"})
    return pd.DataFrame(rows)


def policy_sweep_figure(df: pd.DataFrame, title: str) -> go.Figure:
    """Normalised throughput against the memory limit, one line per policy (no point: no plan fits)."""
    fig = go.Figure()
    unit = byte_unit(df["memory"].to_numpy(dtype=float))
    for pol, g in df.groupby("activations", sort=False):
        g = g[g.throughput > 0].sort_values("memory")
        fig.add_trace(go.Scatter(x=unit.of(g.memory), y=g.throughput, mode="lines+markers", name=pol,
                                 line=dict(color=POLICY_COLORS.get(pol), width=3 if pol == "auto" else 2,
                                           dash="solid" if pol in ("auto", "keep") else "dot"),
                                 customdata=g.chosen, hovertemplate=f"{pol}<br>%{{x:.3g}} {unit.name}: %{{y:.3f}}"
                                 "<br>%{customdata}<extra></extra>"))
    fig.update_layout(template=TEMPLATE, title=title, height=420, legend=dict(orientation="h", y=1.02, yanchor="bottom",
                                                                             x=1, xanchor="right"))
    fig.update_xaxes(title=unit.axis("memory limit per device"))
    fig.update_yaxes(title="lower bound / period (1 = ideal)", rangemode="tozero")
    return fig
