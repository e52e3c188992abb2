"""Gantt charts: lanes, bar counts and durations equal the trace's."""

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.model.trace import MEMORY_COLUMNS, Trace
from workbench.viz.gantt import KIND_COLORS, bar_durations, gantt, gantt_compare, lanes, steady_window, trace_unit

T = 0.006  # period (s)
# two stages on two devices: (device, stage, first, last, kind, start of batch 0, duration)
PATTERN = [
    (0, 0, 0, 1, "F", 0.000, 0.002),
    (0, 0, 0, 1, "send", 0.002, 0.0005),
    (1, 1, 2, 3, "recv", 0.002, 0.0005),
    (1, 1, 2, 3, "F", 0.0025, 0.002),
    (1, 1, 2, 3, "B", 0.0045, 0.003),
    (1, 1, 2, 3, "send", 0.0075, 0.0005),
    (0, 0, 0, 1, "recv", 0.0075, 0.0005),
    (0, 0, 0, 1, "B", 0.008, 0.003),
]


def periodic_trace(batches: int = 5, period: float = T, **meta) -> Trace:
    rows = []
    for i in range(batches):
        for d, s, a, b, k, st, du in PATTERN:
            rows.append(dict(device=d, stage=s, first=a, last=b, kind=k, batch=i,
                             start=st + i * period, end=st + du + i * period))
    ops = pd.DataFrame(rows)
    mem = pd.DataFrame({"device": [0, 0, 1], "time": [0.0, 0.011, 0.0025],
                        "activations": [10.0, 0.0, 5.0], "weights": [3.0, 3.0, 3.0], "total": [13.0, 3.0, 8.0]})
    return Trace(ops, mem, devices=2, period=period, meta=meta)


def compute_ops(tr):
    return tr.ops[tr.ops["kind"].isin(["F", "B"])]


def test_lanes_one_per_device_top_down():
    fig = gantt(periodic_trace())
    assert isinstance(fig, go.Figure)
    assert lanes(fig) == ["GPU 0", "GPU 1"]


def test_bar_count_and_durations_equal_trace():
    tr = periodic_trace(batches=6)
    fig = gantt(tr)
    comp = compute_ops(tr)
    assert len(bar_durations(fig)) == len(comp)
    assert sorted(bar_durations(fig)) == pytest.approx(sorted(((comp["end"] - comp["start"]) * 1e3).tolist()))
    # each bar starts where the op starts (in ms) on the op's device lane
    got = sorted((y, float(b), float(x)) for t in fig.data for y, b, x in zip(t.y, t.base, t.x))
    want = sorted((f"GPU {d}", s * 1e3, (e - s) * 1e3) for d, s, e in zip(comp["device"], comp["start"], comp["end"]))
    assert [g[0] for g in got] == [w[0] for w in want]
    assert np.allclose([g[1:] for g in got], [w[1:] for w in want])


def test_colour_by_kind_forward_backward_distinct():
    fig = gantt(periodic_trace())
    by_name = {t.name: t.marker.color for t in fig.data}
    assert by_name["forward"] == KIND_COLORS["F"] and by_name["backward"] == KIND_COLORS["B"]
    assert by_name["forward"] != by_name["backward"]
    assert fig.layout.barmode == "overlay"
    assert all(t.orientation == "h" for t in fig.data)


def test_colour_by_batch_hatches_backward():
    tr = periodic_trace(batches=3)
    fig = gantt(tr, color_by="batch")
    names = {t.name for t in fig.data}
    assert names == {"mini-batch 0", "mini-batch 1", "mini-batch 2"}
    assert {t.marker.pattern.shape for t in fig.data} == {"", "/"}
    assert len(bar_durations(fig)) == len(compute_ops(tr))
    with pytest.raises(ValueError):
        gantt(tr, color_by="colour")


def test_links_lanes():
    tr = periodic_trace(batches=2)
    fig = gantt(tr, show_links=True)
    assert lanes(fig) == ["GPU 0", "GPU 0 in", "GPU 0 out", "GPU 1", "GPU 1 in", "GPU 1 out"]
    assert len(bar_durations(fig)) == len(tr.ops)
    ops = tr.ops.assign(peer=[1 - d if k in ("send", "recv") else np.nan for d, k in zip(tr.ops.device, tr.ops.kind)])
    fig = gantt(Trace(ops, tr.memory, 2, period=T), show_links=True)
    assert lanes(fig) == ["GPU 0", "link 0→1", "GPU 1", "link 1→0"]


def test_hover_has_stage_layers_batch_times():
    fig = gantt(periodic_trace(batches=1))
    tpl = fig.data[0].hovertemplate
    for word in ("stage", "layers", "mini-batch", "ms"):
        assert word in tpl
    assert list(fig.data[0].customdata[0][:4]) == [0, 0, 1, 0]


def test_period_lines_and_steady_state():
    tr = periodic_trace(batches=6)
    win = steady_window(tr)
    assert win is not None and win[0] == pytest.approx(0.008) and win[1] == pytest.approx(5 * T)
    fig = gantt(tr)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 1 and rects[0].x0 == pytest.approx(8.0)
    xs = sorted(s.x0 for s in lines)
    assert np.allclose(np.diff(xs), T * 1e3)
    assert any(math.isclose(x, 8.0) for x in xs)
    bare = gantt(tr, period_lines=False, steady_state=False)
    assert not bare.layout.shapes


def test_flushed_schedule_has_no_period_lines():
    # GPipe-like: all forwards then all backwards on one device
    rows = [dict(device=0, stage=0, first=0, last=0, kind="F", batch=i, start=i * 1.0, end=i + 1.0) for i in range(3)]
    rows += [dict(device=0, stage=0, first=0, last=0, kind="B", batch=i, start=3 + i * 2.0,
                  end=5 + i * 2.0) for i in range(3)]
    tr = Trace(pd.DataFrame(rows), pd.DataFrame(columns=MEMORY_COLUMNS), 1, period=3.0, meta={"schedule": "gpipe"})
    fig = gantt(tr)
    assert steady_window(tr) is None
    assert not fig.layout.shapes
    # a run of 9 s is drawn in seconds
    assert bar_durations(fig) == pytest.approx([1.0] * 3 + [2.0] * 3)
    assert fig.layout.xaxis.title.text == "time (s)"


def test_measured_trace_aligned():
    tr = periodic_trace(batches=2)
    shifted = Trace(tr.ops.assign(start=tr.ops.start + 100.0, end=tr.ops.end + 100.0), tr.memory, 2,
                    period=T, source="measured")
    fig = gantt(shifted, align=True)
    assert min(float(b) for t in fig.data for b in t.base) == pytest.approx(0.0)
    assert "Measured" in fig.layout.title.text


def test_compare_two_rows():
    pred = periodic_trace(batches=3)
    meas = Trace(pred.ops.assign(start=pred.ops.start * 1.1 + 5, end=pred.ops.end * 1.1 + 5), pred.memory, 2,
                 period=T, source="measured")
    fig = gantt_compare(pred, meas)
    ys = {t.yaxis for t in fig.data}
    assert ys == {"y", "y2"}
    n = len(compute_ops(pred))
    assert sum(len(t.x) for t in fig.data if t.yaxis == "y") == n
    assert sum(len(t.x) for t in fig.data if t.yaxis == "y2") == n
    assert sum(1 for t in fig.data if t.showlegend is not False) == 2  # one legend entry per kind
    # period boundaries (dotted lines) on the predicted chart only: the measured trace carries the plan's period
    dotted = [s for s in fig.layout.shapes if s.type == "line"]
    assert dotted and {s.xref for s in dotted} == {"x"}
    assert fig.layout.xaxis2.title.text == "time (ms)"


def test_empty_trace():
    fig = gantt(Trace.empty(devices=3))
    assert lanes(fig) == ["GPU 0", "GPU 1", "GPU 2"]
    assert bar_durations(fig) == []


def test_a_long_legend_is_shown_whole():
    fig = gantt(periodic_trace(batches=12), color_by="batch")
    entries = sum(1 for t in fig.data if t.showlegend)
    assert entries == 12 and fig.layout.legend.orientation == "v" and fig.layout.legend.tracegroupgap == 0
    assert fig.layout.height >= 110 + 19 * entries  # room for every entry: none cut off below the plot


def test_compare_titles_do_not_repeat_the_source_nor_sit_under_the_steady_state_label():
    meas = Trace(periodic_trace().ops, periodic_trace().memory, devices=2, period=T, source="measured")
    fig = gantt_compare(periodic_trace(), meas)
    titles = [a.text for a in fig.layout.annotations if a.text != "steady state"]
    assert titles == ["predicted (simulated)", "measured"]
    for a in fig.layout.annotations:
        if a.text == "steady state":
            assert a.xanchor == "right"  # at the band's right end; the subplot titles are at the left


def test_periods_shown_zooms_on_the_steady_state():
    tr = periodic_trace(batches=8)
    t0, _ = steady_window(tr)
    lo, hi = gantt(tr, periods_shown=3).layout.xaxis.range
    assert lo == pytest.approx((t0 - 0.1 * T) * 1e3) and hi - lo == pytest.approx(3.2 * T * 1e3)
    assert gantt(tr).layout.xaxis.range is None


def test_policy_operations_get_their_lanes():
    """Recompute is drawn on the device's lane (over its backward), host transfers on a host-link lane."""
    ops = pd.DataFrame({"device": [0, 0, 0, 0, 0], "stage": [0] * 5, "first": [0] * 5, "last": [1] * 5,
                        "kind": ["F", "offload", "prefetch", "B", "R"], "batch": [0] * 5,
                        "start": [0.0, 0.002, 0.004, 0.005, 0.005], "end": [0.002, 0.003, 0.005, 0.009, 0.006]})
    fig = gantt(Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), devices=1, period=0.01))
    assert lanes(fig) == ["GPU 0", "GPU 0 host link"]
    names = {t.name for t in fig.data if isinstance(t, go.Bar)}
    assert {"recompute (in the backward)", "to host", "from host"} <= names
    assert KIND_COLORS["R"] != KIND_COLORS["B"]


def test_unit_by_length_and_a_shared_unit_and_range():
    tr = periodic_trace(batches=3)
    assert gantt(tr).layout.xaxis.title.text == "time (ms)"
    long = Trace(tr.ops.assign(start=tr.ops.start * 500, end=tr.ops.end * 500), tr.memory, 2, period=T * 500)
    fig = gantt(long, periods_shown=1)
    assert fig.layout.xaxis.title.text.startswith("time (s)")
    assert sorted(bar_durations(fig)) == pytest.approx(sorted(((long.ops.end - long.ops.start)[
        long.ops.kind.isin(["F", "B"])]).tolist()))
    # two charts to compare: one unit, one range, given in seconds
    from workbench.model.units import time_unit
    span = (0.0, float(long.ops.end.max()))
    a, b = (gantt(t, unit=time_unit(span[1]), time_range=span) for t in (tr, long))
    assert a.layout.xaxis.title.text == b.layout.xaxis.title.text == "time (s)"
    assert list(a.layout.xaxis.range) == list(b.layout.xaxis.range) == pytest.approx([0, span[1]])
    assert max(x + base for t in a.data if t.type == "bar" for x, base in zip(t.x, t.base)) < 1


def test_compare_each_on_its_own_periods_from_a_mini_batch_with_the_measured_periods_dotted():
    pred = periodic_trace(batches=8)
    slow = 3.0                                              # the run took three times the prediction
    meas = Trace(pred.ops.assign(start=pred.ops.start * slow + 0.5, end=pred.ops.end * slow + 0.5), pred.memory, 2,
                 period=T, source="measured")
    fig = gantt_compare(pred, meas, periods_shown=2, window_from=3, measured_period=slow * T)

    def first(tr):
        f = tr.ops[(tr.ops.kind == "F") & (tr.ops.stage == 0) & (tr.ops.batch == 3)]
        return float(f.start.min() - tr.ops.start.min())

    for axis, tr, period in ((fig.layout.xaxis, pred, T), (fig.layout.xaxis2, meas, slow * T)):
        lo, hi = axis.range
        assert hi == pytest.approx((first(tr) + 2 * period) * 1e3) and hi - lo == pytest.approx(2.1 * period * 1e3)
    dotted = [s for s in fig.layout.shapes if s.type == "line"]
    gaps = {ref: sorted({round(s.x0, 6) for s in dotted if s.xref == ref}) for ref in ("x", "x2")}
    assert gaps["x2"] and gaps["x2"][1] - gaps["x2"][0] == pytest.approx(slow * T * 1e3)   # the measured period
    assert gaps["x"][1] - gaps["x"][0] == pytest.approx(T * 1e3)


def test_a_measured_optimizer_step_is_drawn_over_its_backward():
    ops = pd.DataFrame({"device": [0, 0, 0], "stage": [0] * 3, "first": [0] * 3, "last": [0] * 3,
                        "kind": ["F", "B", "step"], "batch": [0] * 3,
                        "start": [0.0, 0.002, 0.004], "end": [0.002, 0.005, 0.005]})
    fig = gantt(Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), devices=1, period=0.01, source="measured"))
    assert lanes(fig) == ["GPU 0"]
    step = next(t for t in fig.data if t.name == "optimizer step (in the backward)")
    assert list(step.x) == pytest.approx([1.0]) and list(step.base) == pytest.approx([4.0])


def test_windowed_charts_take_the_unit_of_what_they_show():
    pred = periodic_trace(batches=8)
    long = Trace(pred.ops.assign(start=pred.ops.start * 20, end=pred.ops.end * 20), pred.memory, 2, period=T,
                 source="measured")                          # a long run: its whole is in seconds
    assert trace_unit(long).name == "s"
    fig = gantt_compare(pred, long, periods_shown=1, window_from=1, measured_period=20 * T)
    assert fig.layout.xaxis2.title.text == "time (ms)" and fig.layout.xaxis2.range[1] < 1000


@pytest.fixture(scope="module")
def sixty_four():
    """A plan on 64 devices (64 equal layers), simulated long enough to fill and drain its pipeline."""
    from workbench.model.chain import Chain, Layer
    from workbench.model.target import Target
    from workbench.planners import plan
    from workbench.schedules.simulate import simulate

    chain = Chain(tuple(Layer(f"l{i}", 1e-3, 2e-3, 10, 4) for i in range(64)))
    p = plan(chain, Target.of(64), "dp")
    assert len({s.device for s in p.stages}) == 64
    return simulate(p, chain, Target.of(64), batches=max(s.in_flight for s in p.stages) + 40)


def test_sixty_four_devices_draw_a_compact_chart_with_every_bar(sixty_four):
    """A 64-GPU chart was 3,142 px tall (6,284 px as a PNG at scale 2) of bars thinner than their white outlines:
    the compact view is about a third of that, its bars without outline, label or hatching, a lane label every 4th
    device; every operation is still a bar of its duration, and a long run draws no period line."""
    from workbench.viz.gantt_many import LANE_PX

    fig = gantt(sixty_four)
    comp = compute_ops(sixty_four)
    assert lanes(fig) == [f"GPU {d}" for d in range(64)]
    assert fig.layout.height == 110 + LANE_PX * 64 < 3142 / 3
    bars = [t for t in fig.data if t.type == "bar"]
    assert all(t.marker.line.width == 0 and t.text is None and not t.marker.pattern.shape for t in bars)
    assert list(fig.layout.yaxis.tickvals) == [f"GPU {d}" for d in range(0, 64, 4)]
    assert sorted(bar_durations(fig)) == pytest.approx(sorted(1e3 * (comp["end"] - comp["start"])), abs=1e-9)
    assert not [s for s in fig.layout.shapes if s.type == "line"]
    zoomed = gantt(sixty_four, periods_shown=2)
    assert [s for s in zoomed.layout.shapes if s.type == "line"]            # a few periods: their lines
    batch = gantt(sixty_four, color_by="batch")
    assert all(not t.marker.pattern.shape for t in batch.data if t.type == "bar")   # no hatch


def test_a_window_of_devices_is_drawn_at_full_size(sixty_four):
    fig = gantt(sixty_four, devices=range(56, 70))
    mine = compute_ops(sixty_four)[compute_ops(sixty_four)["device"] >= 56]
    assert lanes(fig) == [f"GPU {d}" for d in range(56, 64)] and "(GPU 56–63 of 64)" in fig.layout.title.text
    assert sorted(bar_durations(fig)) == pytest.approx(sorted(1e3 * (mine["end"] - mine["start"])), abs=1e-9)
    assert all(t.marker.line.width == 0.6 and t.text for t in fig.data if t.type == "bar")
    assert fig.layout.height == 70 + 48 * 8
    with pytest.raises(ValueError, match="none of .* is a device of this trace"):
        gantt(sixty_four, devices=[64, 65])
    assert gantt(periodic_trace()).layout.height == 220                  # two devices: as before
