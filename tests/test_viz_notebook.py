"""Notebook helpers: the three schedules, their table, the step-through animation."""

import pandas as pd
import plotly.io as pio
import pytest

from workbench.model.target import Target
from workbench.viz.notebook import (
    gantt_animation,
    layer_table,
    readable,
    schedule_table,
    setup,
    teaching_chain,
    three_schedules,
)


@pytest.fixture(scope="module")
def traces():
    return three_schedules(teaching_chain(), Target.of(4, bandwidth="10GB/s"), micro_batches=4)


def test_setup_sets_renderer(monkeypatch):
    old = pio.renderers.default
    try:
        monkeypatch.setenv("WORKBENCH_QUICK", "1")
        assert setup() is True
        assert pio.renderers.default == "plotly_mimetype+notebook"
    finally:
        pio.renderers.default = old


def test_three_schedules_and_table(traces):
    assert [t.meta.get("schedule") for t in traces.values()] == ["gpipe", "1f1b", "periodic"]
    table = schedule_table(traces)
    assert isinstance(table, pd.DataFrame) and list(table.index) == list(traces)
    # the periodic schedule has the shortest period (no flush)
    periods = table["period (ms)"]
    assert periods.idxmin() == "periodic (PipeDream)"


def test_animation_frames_clip_at_now(traces):
    tr = traces["periodic (PipeDream)"]
    fig = gantt_animation(tr, periods=2, steps_per_period=3)
    assert len(fig.frames) == 6 and len(fig.layout.sliders[0].steps) == 6
    T = tr.period * 1e3
    assert fig.layout.xaxis.title.text == "time (ms)"
    for i, fr in enumerate(fig.frames):
        now = fr.layout.shapes[0].x0
        assert now == pytest.approx(tr.ops["start"].min() * 1e3 + (i + 1) * T / 3)
        for bar in fr.data[:2]:
            assert all(b + x <= now + 1e-9 for b, x in zip(bar.base, bar.x))
    # the last frame shows every lane
    assert set(fig.frames[-1].data[2].y) == {f"GPU {p}" for p in range(tr.devices)}


def test_schedule_table_uses_one_unit_per_column_group(traces):
    table = schedule_table(traces)
    units = {c.rsplit("(", 1)[1].rstrip(")") for c in table.columns if "memory" in c or "peak" in c}
    assert len(units) == 1                                      # every memory column in one unit
    assert "period (ms)" in table.columns and table.loc["GPipe", "in flight GPU 0"] == 4   # all m = 4
    # the values are the traces' own, in that unit
    unit = units.pop()
    scale = {"MiB": 2**20, "GiB": 2**30}[unit]
    for name, t in traces.items():
        assert table.loc[name, f"max peak ({unit})"] == pytest.approx(t.peak_memory().max() / scale, abs=0.01)


def test_readable_puts_each_group_in_one_unit():
    df = pd.DataFrame({"a": [0.0005, 0.002], "b": [1.5, 0.5], "m": [512 * 2**20, 3 * 2**30], "e": [0.021, -0.5]})
    out = readable(df, seconds=["a", "b"], sizes=["m"], fractions=["e"])
    assert list(out.columns) == ["a (s)", "b (s)", "m (GiB)", "e (%)"]          # the larger time decides: s
    assert out["a (s)"].tolist() == pytest.approx([0.001, 0.002], abs=1e-3)
    assert out["m (GiB)"].tolist() == [0.5, 3.0] and out["e (%)"].tolist() == [2.1, -50.0]
    assert list(readable(df, seconds=["a"]).columns)[0] == "a (ms)"


def test_layer_table_in_units():
    from workbench.profiles import load_profile

    table = layer_table(load_profile("resnet50"))
    assert list(table.columns)[1:3] == ["forward (ms)", "backward (ms)"]
    assert all(c.endswith("(MiB)") for c in table.columns[3:])


def test_gantt_animation_in_seconds_for_a_long_run():
    from workbench.profiles import load_profile
    from workbench.schedules.simulate import simulate

    chain = load_profile("gpt-small")
    platform = Target.of(4, bandwidth="12GB/s", optimizer="sgd")
    p = __import__("workbench.planners", fromlist=["plan"]).plan(chain, platform, "dp")
    fig = gantt_animation(simulate(p, chain, platform, batches=8), periods=2, steps_per_period=2)
    assert fig.layout.xaxis.title.text == "time (s)" and fig.layout.sliders[0].currentvalue.suffix == " s"
    assert fig.layout.xaxis.range[1] < 60                              # seconds, not thousands of ms
