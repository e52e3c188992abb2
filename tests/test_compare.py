"""Comparison figures."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan
from workbench.model.target import Target
from workbench.viz.compare import allocation_map, period_vs_bound, throughput_vs_memory


def test_throughput_from_period_drops_infeasible():
    df = pd.DataFrame({"memory": [1, 2, 3] * 2, "method": ["dp"] * 3 + ["ilp"] * 3,
                       "period": [math.inf, 0.5, 0.25, 1.0, 0.5, 0.5]})
    fig = throughput_vs_memory(df, lower_bound=0.25)
    assert [t.name for t in fig.data] == ["dp", "ilp"]
    assert list(fig.data[0].y) == [2.0, 4.0] and list(fig.data[0].x) == [2, 3]
    assert len(fig.data[1].x) == 3
    assert fig.layout.shapes[0].y0 == pytest.approx(4.0)


def test_throughput_column_and_units():
    df = pd.DataFrame({"memory": [2**30, 2**31], "method": ["a", "a"], "throughput": [1.0, 2.0]})
    fig = throughput_vs_memory(df)
    assert list(fig.data[0].x) == [1.0, 2.0]
    assert "GiB" in fig.layout.xaxis.title.text
    with pytest.raises(ValueError):
        throughput_vs_memory(pd.DataFrame({"memory": [1], "method": ["a"]}))


def test_period_vs_bound():
    df = pd.DataFrame({"method": ["dp", "dp", "pipedream"], "period": [0.01, 0.02, math.inf],
                       "lower_bound": [0.01, 0.01, 0.01], "net": ["a", "b", "c"]})
    fig = period_vs_bound(df, label="net")
    pts = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in pts] == ["dp"]
    assert list(pts[0].customdata) == pytest.approx([1.0, 2.0])
    assert fig.data[-1].name == "period = bound"


def test_allocation_map_rows_and_values():
    chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    plat = Target.of(2)
    a = make_plan(chain, plat, 0.006, [0, 0, 1, 1], [0.0, 0.002], [0.008, 0.004], method="dp")
    b = make_plan(chain, plat, 0.006, [0, 1, 1, 0], [0.0, 0.001, 0.003], [0.009, 0.006, 0.004], method="ilp")
    fig = allocation_map({"dp": a, "ilp": b}, chain)
    hm = fig.data[0]
    assert list(hm.y) == ["dp", "ilp"]
    assert np.array_equal(np.array(hm.z), [[0, 0, 1, 1], [0, 1, 1, 0]])
    assert "l3" in hm.text[1][3]
    single = allocation_map(a)
    assert list(single.data[0].y) == ["dp"]
    both = allocation_map([a, a])
    assert len(both.data[0].y) == 2


def test_prediction_errors_label_every_bar_and_explain_a_zero():
    from workbench.viz.compare import prediction_errors

    cmp = pd.DataFrame({"device": [0, 1], "busy_error": [1.08, 1.083], "cpu_busy_error": [-0.44, -0.412],
                        "memory_error": [0.0, 0.0]})
    fig = prediction_errors(cmp)
    assert [t.name for t in fig.data] == ["wall busy time", "CPU busy time", "peak memory"]
    assert list(fig.data[0].text) == ["+108%", "+108%"] and list(fig.data[2].text) == ["0 (exact)", "0 (exact)"]
    assert fig.layout.yaxis.title.text == "(measured - predicted) / predicted"


def test_calibration_chart_has_both_axis_titles():
    from workbench.viz.compare import calibration_chart

    loop = pd.DataFrame({"iteration": [0, 1], "error": [-1.3, 0.9], "error after calibration": [0.12, None]})
    fig = calibration_chart(loop)
    assert fig.layout.yaxis.title.text == "|period error|" and fig.layout.xaxis.title.text.startswith("iteration")
    assert list(fig.data[0].y) == [1.3, 0.9] and list(fig.data[1].x) == [0]


def test_the_period_budget_chart_stacks_every_part_and_marks_both_periods():
    from workbench.runtime.period_budget import PARTS
    from workbench.viz.compare import period_budget_chart

    b = pd.DataFrame([[0.010, 0.001, 0.0, 0.002, 0.001, 0.0, 0.001, 0.003, 0.002],
                      [0.011, -0.001, 0.0005, 0.0015, 0.0, 0.0, 0.001, 0.005, 0.002]], columns=list(PARTS),
                     index=pd.Index([0, 1], name="device"))
    b.attrs.update(measured_period=0.020, predicted_period=0.011)
    fig = period_budget_chart({"dp": b})
    bars = {t.name: list(t.x) for t in fig.data if t.type == "bar"}
    assert "sending" not in bars                                    # an empty part is left out of the legend
    assert bars["profile"] == pytest.approx([10.0, 11.0]) and bars["layers now"] == pytest.approx([1.0, -1.0])
    stacked = np.sum([v for v in bars.values()], axis=0)
    assert stacked == pytest.approx([20.0, 20.0])                  # each bar adds up to the measured period
    marks = {t.name: list(t.x) for t in fig.data if t.type == "scatter"}
    assert marks == {"predicted period": [11.0, 11.0], "measured period": [20.0, 20.0]}
    assert list(fig.data[0].y) == ["dp, GPU 0", "dp, GPU 1"] and fig.layout.barmode == "relative"
