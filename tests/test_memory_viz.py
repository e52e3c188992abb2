"""Memory views: the split follows rule 7, the limit is drawn, steps follow the trace."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan
from workbench.model.target import Target
from workbench.model.trace import Trace
from workbench.viz.memory import memory_bars, memory_bars_compare, memory_split, memory_timeline, memory_timelines

GiB = 2**30


def small(weights="stash", phi=1.0, memory=8 * GiB):
    chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 0.25 * GiB, 0.125 * GiB) for i in range(4)),
                  input_bytes=0.125 * GiB)
    plat = Target.of(2, memory=memory, weights=weights, weight_factor=phi, memory_model="paper")
    plan = make_plan(chain, plat, period=0.006, assignment=[0, 0, 1, 1], fwd_start=[0.0, 0.002],
                     bwd_start=[0.008, 0.004], method="hand")
    return chain, plat, plan


def test_split_is_rule_7_and_sums_to_plan_memory():
    chain, plat, plan = small(phi=4.0)
    df = memory_split(plan, chain, plat)
    assert [s.in_flight for s in plan.stages] == [2, 1]
    # stage 0: A = 2 * 0.125 GiB, W = 0.5 GiB, k = 2
    assert df.loc[0, "activations"] == pytest.approx(2 * 0.25 * GiB)
    assert df.loc[0, "weights"] == pytest.approx(4 * 0.5 * GiB)
    assert df.loc[0, "stashed"] == pytest.approx(1 * 0.5 * GiB)
    assert df.loc[1, "stashed"] == 0
    assert np.allclose(df["total"], plan.memory)


def test_bars_stacked_with_limit():
    chain, plat, plan = small()
    fig = memory_bars(plan, chain, plat)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name.split()[0] for b in bars] == ["live", "stashed", "activations"]
    assert fig.layout.barmode == "stack"
    assert list(bars[0].x) == ["GPU 0", "GPU 1"]
    tot = np.sum([b.y for b in bars], axis=0)
    assert np.allclose(tot, np.array(plan.memory) / GiB)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 1 and lines[0].y0 == pytest.approx(8.0)
    assert "GiB" in fig.layout.yaxis.title.text


def test_bars_single_policy_has_no_stash_and_marks_reported():
    chain, plat, plan = small(weights="single")
    fig = memory_bars(plan, chain, plat)
    assert len([t for t in fig.data if t.type == "bar"]) == 2
    odd = plan.with_(memory=(plan.memory[0] * 2, plan.memory[1]))
    fig = memory_bars(odd, chain, plat)
    sc = [t for t in fig.data if t.type == "scatter"]
    assert len(sc) == 1 and list(sc[0].x) == ["GPU 0"]


def test_no_limit_line_without_limit():
    chain, plat, plan = small(memory=math.inf)
    assert not memory_bars(plan, chain, plat).layout.shapes


def test_timeline_steps_per_device():
    mem = pd.DataFrame({"device": [0, 0, 1, 0], "time": [0.0, 0.002, 0.001, 0.004],
                        "activations": [1, 2, 1, 0.0], "weights": [1, 1, 1, 1.0],
                        "total": [2 * GiB, 3 * GiB, 2 * GiB, 1 * GiB]})
    ops = pd.DataFrame({"device": [0], "stage": [0], "first": [0], "last": [0], "kind": ["F"], "batch": [0],
                        "start": [0.0], "end": [0.005]})
    fig = memory_timeline(Trace(ops, mem, 2), limit=4 * GiB, split=True)
    totals = [t for t in fig.data if t.name in ("GPU 0", "GPU 1")]
    assert [t.name for t in totals] == ["GPU 0", "GPU 1"]
    assert all(t.line.shape == "hv" for t in fig.data)
    assert list(totals[0].x) == pytest.approx([0, 2, 4, 5])  # ms, extended to the end of the trace
    assert list(totals[0].y) == pytest.approx([2, 3, 1, 1])
    assert fig.layout.shapes[0].y0 == pytest.approx(4.0)
    assert len(fig.data) == 4


def test_bars_compare_share_one_unit_and_range():
    """Panels in MiB and in GiB alone come out in one unit, with one y range: the larger plan's."""
    chain, plat, plan = small(memory=math.inf)
    tiny = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 2**20, 2**20) for i in range(4)))
    tplat = plat.with_(memory=math.inf)
    tplan = make_plan(tiny, tplat, period=0.006, assignment=[0, 0, 1, 1], fwd_start=[0.0, 0.002],
                      bwd_start=[0.008, 0.004])
    assert memory_bars(tplan, tiny, tplat).layout.yaxis.title.text == "memory (MiB)"
    fig = memory_bars_compare({"large": (plan, chain, plat), "small": (tplan, tiny, tplat)}, title="both")
    assert fig.layout.yaxis.title.text == "memory (GiB)"
    assert fig.layout.yaxis.range == fig.layout.yaxis2.range
    assert fig.layout.yaxis.range[1] == pytest.approx(max(plan.memory) / GiB * 1.12)
    small_bars = [t for t in fig.data if t.type == "bar" and t.xaxis == "x2"]
    assert np.allclose(np.sum([b.y for b in small_bars], axis=0), np.array(tplan.memory) / GiB)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert len(names) == len(set(names))                    # each term once in the legend


def test_timelines_share_axes_and_units():
    mem = pd.DataFrame({"device": [0, 0], "time": [0.0, 0.002], "activations": [0, 0.0], "weights": [0, 0.0],
                        "total": [2 * GiB, 3 * GiB]})
    ops = pd.DataFrame({"device": [0], "stage": [0], "first": [0], "last": [0], "kind": ["F"], "batch": [0],
                        "start": [0.0], "end": [2.5]})
    big = Trace(ops, mem, 1)
    small_ = Trace(ops.assign(end=0.004), mem.assign(total=[2**20, 300 * 2**20]), 1)
    assert memory_timeline(small_).layout.yaxis.title.text == "memory (MiB)"
    assert memory_timeline(small_).layout.xaxis.title.text == "time (ms)"
    fig = memory_timelines({"big": big, "small": small_}, limit=4 * GiB)
    assert fig.layout.yaxis.title.text == "memory (GiB)" and fig.layout.yaxis.range == fig.layout.yaxis2.range
    assert fig.layout.xaxis2.title.text == "time (s)"       # the longer run's unit, on the shared axis
    assert list(fig.data[1].y) == pytest.approx([1 / 1024, 300 / 1024, 300 / 1024])
    assert list(fig.data[1].x) == pytest.approx([0, 0.002, 0.004])
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == 2


def test_the_split_of_a_plan_with_activation_policies_is_its_effective_chains():
    """A plan that recomputes layers: the bars add up to the plan's own memory (not the chain keeping all)."""
    import numpy as np

    from workbench.model.chain import Chain, Layer
    from workbench.model.target import Target
    from workbench.planners import plan as make_plan
    from workbench.viz.memory import memory_split

    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10, 400) for i in range(6)), input_bytes=10)
    plat = Target.of(2, memory=1900, optimizer="sgd", weights="single", zero_grad="zeros")
    p = make_plan(ch, plat, "dp", activations="auto")
    assert p.feasible and "recompute" in p.activations
    df = memory_split(p, ch, plat)
    assert np.allclose(df["total"], df["reported"], rtol=1e-9)


def test_a_gpipe_split_under_zero_grad_none_draws_no_gradients_before_any_backward():
    """GPipe, activations dominating: the peak comes at the end of the forwards, before any backward, so under
    ``none`` the split holds no gradients (under ``zeros`` they are resident); both sum to the plan's memory."""
    from workbench.planners import plan as run_planner

    chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 400, 10) for i in range(4)), input_bytes=10)
    for zero_grad, grads in (("none", 0.0), ("zeros", 200.0)):
        plat = Target.of(2, optimizer="adam", zero_grad=zero_grad)
        plan = run_planner(chain, plat, "gpipe", micro_batches=4)
        df = memory_split(plan, chain, plat)
        assert df["gradients"].tolist() == [grads, grads]
        assert np.allclose(df["total"], plan.memory)
