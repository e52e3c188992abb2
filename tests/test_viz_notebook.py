"""Notebook helpers: the three schedules, their table, the step-through animation."""

import pandas as pd
import plotly.io as pio
import pytest

from workbench.model.chain import Platform
from workbench.viz.notebook import gantt_animation, schedule_table, setup, teaching_chain, three_schedules


@pytest.fixture(scope="module")
def traces():
    return three_schedules(teaching_chain(), Platform(4, bandwidth="10GB/s"), micro_batches=4)


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
