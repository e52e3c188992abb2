"""One model on the GPUs people rent: plan it on each and compare periods, throughput and memory.

:func:`compare_gpus` plans a chain profiled for each GPU (a fake profile per GPU:
:func:`workbench.profiles.fake.for_gpu`) on a platform of that GPU
(:meth:`workbench.model.chain.Platform.on`: its memory, its link within a node, the nodes),
once per activation policy, and returns one row per plan; :func:`gpu_chart` draws the throughput.

>>> from workbench.model.chain import Chain, Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1e-3, 2e-3, 1e9, 1e6) for i in range(8)),
...            meta={"input_shape": "1x2048", "input_dtype": "int64"})
>>> df = compare_gpus({"a100-40gb": ch, "h100-sxm": ch}, devices=4, activations=("keep",))
>>> list(df["gpu"]), bool(df["feasible"].all())
(['a100-40gb', 'h100-sxm'], True)
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from workbench.model.accelerators import accelerator
from workbench.model.chain import Chain
from workbench.model.target import Target
from workbench.model.units import Unit
from workbench.viz.gantt import TEMPLATE

__all__ = ["compare_gpus", "gpu_chart", "tokens_per_batch"]

GiB = Unit("GiB", 2.0**30)


def tokens_per_batch(chain: Chain) -> int:
    """What one mini-batch holds, from the profile's metadata: tokens (batch x sequence) for token ids,
    samples (the batch) for anything else.

    >>> from workbench.model.chain import Layer
    >>> tokens_per_batch(Chain((Layer("a", 1, 1),), meta={"input_shape": "2x1024", "input_dtype": "int64"}))
    2048
    >>> tokens_per_batch(Chain((Layer("a", 1, 1),), meta={"input_shape": "32x3x224x224", "input_dtype": "float32"}))
    32
    """
    dims = [int(d) for d in str(chain.meta.get("input_shape", "1")).split("x") if d.isdigit()] or [1]
    return math.prod(dims) if str(chain.meta.get("input_dtype", "")).startswith("int") else dims[0]


def compare_gpus(chains: Mapping[str, Chain], devices: int, *, devices_per_node: int | None = None,
                 activations: Sequence[str] = ("keep", "auto"), method: str = "dp",
                 time_limit: float | None = None, **platform: Any) -> pd.DataFrame:
    """Plan ``chains[gpu]`` on ``devices`` of each GPU, once per activation policy. One row per plan: gpu,
    activations, feasible, period_ms, throughput (tokens/s), stages, peak memory and the limit (GiB, as every
    chart: a datasheet's 80 GB is 74.5 GiB), the
    recomputed and offloaded layers, and the plan itself (``plan``) with its platform (``platform``).
    Where keeping every activation already reaches the period without a memory limit, no policy can do
    better (recompute and offload only add time): that plan stands for the other policies too."""
    from workbench.planners import plan as make_plan

    rows = []
    for gpu, chain in chains.items():
        plat = Target.on(gpu, devices, devices_per_node=devices_per_node, **platform)
        free = make_plan(chain, plat.with_(memory=math.inf), method, time_limit=time_limit).period
        keep = None
        for act in activations:
            if act != "keep" and keep is not None and keep.feasible and keep.period <= free * (1 + 1e-9):
                p = keep
            else:
                p = make_plan(chain, plat, method, activations=act, time_limit=time_limit)
            keep = p if act == "keep" else keep
            ok = p.feasible and p.fits
            rows.append({"gpu": gpu, "label": accelerator(gpu).label, "activations": act, "feasible": ok,
                         "period_ms": p.period * 1e3 if ok else math.nan,
                         "throughput": tokens_per_batch(chain) / p.period if ok else 0.0,
                         "stages": len(p.stages) if ok else 0,
                         "peak_memory_gib": GiB.of(max(p.memory)) if ok and p.memory else math.nan,
                         "limit_gib": GiB.of(plat.memory_limit),
                         "recomputed": sum(a == "recompute" for a in p.activations),
                         "offloaded": sum(a == "offload" for a in p.activations), "plan": p, "platform": plat})
    return pd.DataFrame(rows)


def gpu_chart(df: pd.DataFrame, *, title: str | None = None, unit: str = "tokens/s") -> go.Figure:
    """Grouped bars: throughput per GPU, one bar per activation policy (an infeasible plan: no bar, noted)."""
    fig = go.Figure()
    colors = {"keep": "#4c78a8", "auto": "#f58518", "recompute": "#54a24b", "offload": "#b279a2"}
    for act, sub in df.groupby("activations", sort=False):
        text = [f"{t:,.0f}<br>{s} stages" if ok else "does not fit"
                for t, s, ok in zip(sub["throughput"], sub["stages"], sub["feasible"])]
        fig.add_bar(x=sub["label"], y=sub["throughput"], name=f"activations {act}", text=text,
                    textposition="outside", marker_color=colors.get(str(act), None),
                    hovertemplate=f"%{{x}}<br>%{{y:,.0f}} {unit}<extra>{act}</extra>")
    top = float(df["throughput"].max()) if len(df) else 1.0
    fig.update_layout(barmode="group", template=TEMPLATE, height=420, yaxis_title=f"throughput ({unit})",
                      yaxis_range=[0, top * 1.25], title=title or "Throughput per GPU",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
                      margin=dict(l=70, r=20, t=70, b=60))
    return fig
