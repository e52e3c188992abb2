"""Helpers the notebooks call, so that cells stay short and the logic is tested.

:func:`setup` picks the plotly renderer that works both in JupyterLab and in
exported HTML; :func:`teaching_chain` is a small chain with a heavy early
stage; :func:`three_schedules` runs GPipe, 1F1B and the periodic schedule on
one allocation; :func:`schedule_table` compares them; :func:`gantt_animation`
steps through the first periods of a trace.

>>> chain = teaching_chain()
>>> len(chain), chain.layers[0].name
(8, 'conv1')
>>> traces = three_schedules(chain, Target.of(4, bandwidth="10GB/s", memory_model="paper"), micro_batches=4)
>>> list(traces)
['GPipe', '1F1B', 'periodic (PipeDream)']
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from workbench.methods import METHODS
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.model.trace import Trace
from workbench.model.units import byte_unit, format_seconds, time_unit
from workbench.viz.explorer import quick
from workbench.viz.gantt import KIND_COLORS, KIND_NAMES, TEMPLATE, trace_unit

__all__ = ["setup", "quick", "teaching_chain", "three_schedules", "schedule_table", "gantt_animation",
           "contiguous_assignment", "layer_table", "readable"]

MiB = 2**20


def setup(renderer: str = "plotly_mimetype+notebook") -> bool:
    """Set plotly's renderer for notebooks (JupyterLab and HTML export); returns :func:`quick`."""
    pio.renderers.default = renderer
    return quick()


def teaching_chain() -> Chain:
    """Eight layers shaped like a small CNN: big activations early, big weights late (times in ms)."""
    spec = [  # name, forward ms, backward ms, weights MiB, activation MiB
        ("conv1", 2.0, 4.0, 1, 96), ("conv2", 3.0, 6.0, 4, 64), ("conv3", 3.0, 6.0, 16, 32),
        ("conv4", 3.0, 6.0, 32, 16), ("conv5", 2.0, 4.0, 64, 8), ("fc6", 1.0, 2.0, 256, 1),
        ("fc7", 1.0, 2.0, 64, 1), ("fc8", 0.5, 1.0, 16, 0.5),
    ]
    return Chain(tuple(Layer(n, f / 1e3, b / 1e3, w * MiB, a * MiB) for n, f, b, w, a in spec),
                 input_bytes=48 * MiB, meta={"network": "teaching"})


def layer_table(chain: Chain) -> pd.DataFrame:
    """The chain's layers to read: forward and backward in one time unit, weights, the output (sent to the next
    layer) and what autograd saves for the backward in one size unit, each named in its header.

    >>> row = layer_table(teaching_chain()).iloc[0]
    >>> list(row.index)
    ['layer', 'forward (ms)', 'backward (ms)', 'weights (MiB)', 'output (MiB)', 'saved for backward (MiB)']
    >>> [row['layer']] + [float(v) for v in row.iloc[1:]]
    ['conv1', 2.0, 4.0, 1.0, 96.0, 48.0]
    """
    tunit = time_unit(chain.forward, chain.backward)
    sizes = {"weights": chain.weights, "output": np.array([l.activation_bytes for l in chain.layers], dtype=float),
             "saved for backward": chain.saved_array}
    bunit = byte_unit(*sizes.values())
    table = {"layer": [l.name for l in chain.layers], tunit.axis("forward"): tunit.of(chain.forward).round(3),
             tunit.axis("backward"): tunit.of(chain.backward).round(3)}
    table.update({bunit.axis(name): bunit.of(v).round(2) for name, v in sizes.items()})
    return pd.DataFrame(table)


def readable(df: pd.DataFrame, *, seconds: Sequence[str] = (), sizes: Sequence[str] = (),
             fractions: Sequence[str] = (), digits: int = 3) -> pd.DataFrame:
    """``df`` to read: the ``seconds`` columns in one time unit, the ``sizes`` (bytes) in one size unit, the
    ``fractions`` in percent, each header naming its unit; numbers stay numbers (rounded to ``digits``).

    >>> df = pd.DataFrame({"period": [0.0042, 0.021], "limit": [2**30, 3 * 2**30], "error": [0.125, -0.5]})
    >>> readable(df, seconds=["period"], sizes=["limit"], fractions=["error"]).to_dict("list")
    {'period (ms)': [4.2, 21.0], 'limit (GiB)': [1.0, 3.0], 'error (%)': [12.5, -50.0]}
    """
    out = df.copy()
    names: dict[str, str] = {}
    for columns, unit in ((seconds, time_unit), (sizes, byte_unit)):
        if columns:
            u = unit(*(out[c].to_numpy(dtype=float) for c in columns))
            for c in columns:
                out[c] = u.of(out[c].astype(float)).round(digits)
                names[c] = u.axis(c)
    for c in fractions:
        out[c] = (out[c].astype(float) * 100).round(max(digits - 2, 1))
        names[c] = f"{c} (%)"
    return out.rename(columns=names)


def contiguous_assignment(chain: Chain, devices: int) -> list[int]:
    """A balanced contiguous allocation (the unconstrained DP's), or equal blocks without planners."""
    try:
        from workbench.planners import plan

        p = plan(chain, Target.of(devices), "dp")
        if p.feasible:
            return list(p.assignment)
    except Exception:  # noqa: BLE001
        pass
    L = len(chain)
    return [min(devices - 1, l * devices // L) for l in range(L)]


def three_schedules(chain: Chain, platform: Target, assignment: Sequence[int] | None = None, *,
                    micro_batches: int = 8, batches: int | None = None) -> dict[str, Trace]:
    """GPipe and 1F1B (one flush of ``micro_batches``) and the periodic schedule, on one allocation."""
    from workbench.schedules.builder import best_schedule
    from workbench.schedules.simulate import simulate, simulate_flushed

    a = list(assignment) if assignment is not None else contiguous_assignment(chain, platform.devices)
    out = {m.short: simulate_flushed(chain, platform, a, micro_batches, kind=m.name)
           for m in METHODS if m.family == "flushed" and not m.torch_schedule}
    periodic = best_schedule(chain, platform.with_(memory=math.inf), a, method="periodic")
    out["periodic (PipeDream)"] = simulate(periodic, chain, platform, batches=batches or micro_batches)
    return out


def schedule_table(traces: Mapping[str, Trace]) -> pd.DataFrame:
    """Per schedule: period, throughput, the most mini-batches GPU 0 holds, and peak memory of the first and
    last devices; every period in one unit and every memory in one (named in the column headers).

    >>> platform = Target.of(4, bandwidth="10GB/s", memory_model="paper")
    >>> t = schedule_table(three_schedules(teaching_chain(), platform, micro_batches=8))
    >>> list(t.columns)[:3], int(t.loc["GPipe", "in flight GPU 0"])
    (['period (ms)', 'throughput (/s)', 'in flight GPU 0'], 8)
    """
    from workbench.viz.lessons import in_flight

    tunit = time_unit([t.period for t in traces.values()])
    munit = byte_unit([t.peak_memory() for t in traces.values()])
    rows = []
    for name, t in traces.items():
        peak = t.peak_memory()
        rows.append({"schedule": name, tunit.axis("period"): round(tunit.of(t.period), 3),
                     "throughput (/s)": round(1 / t.period, 1) if t.period > 0 else 0.0,
                     "in flight GPU 0": in_flight(t, 0),
                     munit.axis("peak memory GPU 0"): round(munit.of(peak[0]), 2),
                     munit.axis(f"peak memory GPU {t.devices - 1}"): round(munit.of(peak[-1]), 2),
                     munit.axis("max peak"): round(munit.of(peak.max()), 2)})
    return pd.DataFrame(rows).set_index("schedule")


def gantt_animation(trace: Trace, *, periods: int = 4, steps_per_period: int = 4, title: str | None = None,
                    start: float | None = None) -> go.Figure:
    """Step through the first ``periods`` periods of ``trace``: each frame draws what has run so far.

    A slider and a play button move a "now" line; bars are clipped at "now".
    Frame ``i`` shows time ``t_i = start + (i+1) * T / steps_per_period``.
    """
    ops = trace.ops[trace.ops["kind"].isin(["F", "B"])]
    T = trace.period if trace.period and math.isfinite(trace.period) else trace.makespan / 4
    t0 = float(ops["start"].min()) if start is None else start
    times = [t0 + (i + 1) * T / steps_per_period for i in range(periods * steps_per_period)]
    lanes = [f"GPU {p}" for p in range(trace.devices)]
    u = trace_unit(trace)

    def bars(now: float) -> list[go.Bar]:
        out = []
        for kind in ("F", "B"):
            sub = ops[(ops["kind"] == kind) & (ops["start"] < now)]
            end = np.minimum(sub["end"].to_numpy(), now)
            out.append(go.Bar(y=[f"GPU {int(d)}" for d in sub["device"]], base=u.of(sub["start"]).tolist(),
                              x=u.of(end - sub["start"].to_numpy()).tolist(), orientation="h",
                              name=KIND_NAMES[kind], marker_color=KIND_COLORS[kind],
                              text=[str(int(b)) for b in sub["batch"]], textposition="inside", textangle=0,
                              insidetextanchor="middle", textfont=dict(color="white")))
        # an invisible point per lane keeps every device's lane on screen from the first frame
        out.append(go.Scatter(x=[u.of(t0)] * len(lanes), y=lanes, mode="markers", marker=dict(opacity=0),
                              showlegend=False, hoverinfo="skip"))
        return out

    def now_line(now: float) -> list[dict]:
        return [dict(type="line", xref="x", yref="y domain", x0=u.of(now), x1=u.of(now), y0=0, y1=1,
                     line=dict(color="#D62728", width=2))]

    frames = [go.Frame(data=bars(t), name=f"{u.of(t - t0):.3g}", layout=dict(shapes=now_line(t)))
              for t in times]
    fig = go.Figure(data=bars(times[0]), frames=frames)
    still = dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))
    steps = [dict(method="animate", label=f.name, args=[[f.name], still]) for f in frames]
    fig.update_layout(
        template=TEMPLATE, barmode="overlay", height=140 + 45 * trace.devices,
        title=title or f"The first {periods} periods, step by step (T = {format_seconds(T)})",
        xaxis=dict(range=[u.of(t0), u.of(times[-1])], title=u.axis("time")),
        yaxis=dict(categoryorder="array", categoryarray=lanes[::-1]), shapes=now_line(times[0]),
        margin=dict(l=70, r=20, t=60, b=40), uniformtext=dict(minsize=8, mode="hide"),
        transition=dict(duration=0),
        sliders=[dict(active=0, steps=steps, transition=dict(duration=0),
                      currentvalue=dict(prefix="now: ", suffix=f" {u.name}"), pad=dict(t=45))],
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
        updatemenus=[dict(type="buttons", direction="left", showactive=False, x=1, y=1.02, xanchor="right",
                          yanchor="bottom",
                          buttons=[dict(label="▶ play", method="animate",
                                        args=[None, dict(frame=dict(duration=350, redraw=True), fromcurrent=True,
                                                          transition=dict(duration=0), mode="immediate")]),
                                   dict(label="❚❚", method="animate",
                                        args=[[None], dict(mode="immediate", frame=dict(duration=0, redraw=False))])])],
    )
    fig.update_layout(height=fig.layout.height + 100, margin=dict(b=120, t=90))
    return fig
