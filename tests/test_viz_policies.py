"""Tests for workbench.viz.policies: throughput against memory per activation policy (notebook 02)."""

from __future__ import annotations

import math

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.viz.policies import POLICY_COLORS, policy_sweep, policy_sweep_figure

# 4 layers: forward 1 s, backward 2 s, output 10 B, 100 B saved for the backward; 2 devices, rule 7 of the paper
CHAIN = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
PLATFORM = Target.of(2, memory_model="paper", host_bandwidth=100)
MEMORIES = [10, 300, 500, 2000]


@pytest.fixture(scope="module")
def sweep():
    return policy_sweep(CHAIN, PLATFORM, MEMORIES)


def row(df, memory, policy):
    (r,) = df[(df.memory == memory) & (df.activations == policy)].to_dict("records")
    return r


def test_one_row_per_memory_and_policy(sweep):
    assert len(sweep) == len(MEMORIES) * 4
    assert sweep.activations.tolist()[:4] == ["keep", "recompute", "offload", "auto"]
    assert sweep.memory.tolist() == [float(m) for m in MEMORIES for _ in range(4)]


def test_hand_computed_plans_with_memory_to_spare(sweep):
    """Two layers a device. Kept: a period of 2 x 3 s, and stage 0 holds 2 mini-batches of 2 x 100 B. Recomputed:
    each layer runs its forward twice (2 x 4 s) and keeps only its 10 B input, 2 x 2 x 10 B. The bound is
    12 s of compute over 2 devices, 6 s."""
    keep, recompute = row(sweep, 2000, "keep"), row(sweep, 2000, "recompute")
    assert (keep["period"], keep["peak"], keep["throughput"]) == (6.0, 400.0, 1.0)
    assert (recompute["period"], recompute["peak"], recompute["throughput"]) == (8.0, 40.0, 0.75)
    assert recompute["chosen"] == "recompute 4" and keep["chosen"] == "keep"


def test_no_plan_where_nothing_fits(sweep):
    for policy in ("keep", "recompute", "offload", "auto"):
        r = row(sweep, 10, policy)
        assert r["throughput"] == 0.0 and math.isnan(r["period"]) and r["chosen"] == "no plan"


def test_throughput_is_the_bound_over_the_period_and_auto_is_best(sweep):
    ok = sweep[sweep.throughput > 0]
    assert ok.throughput.to_numpy() == pytest.approx(6.0 / ok.period.to_numpy(), abs=1e-4)
    assert (ok.peak <= ok.memory).all()
    for memory, g in sweep.groupby("memory"):
        by = dict(zip(g.activations, g.throughput))
        assert by["auto"] >= max(by["keep"], by["recompute"], by["offload"]) - 1e-9
    for policy, g in sweep.groupby("activations"):
        assert g.sort_values("memory").throughput.is_monotonic_increasing      # more memory never hurts
    mixed = row(sweep, 300, "auto")
    assert mixed["throughput"] > max(row(sweep, 300, p)["throughput"] for p in ("keep", "recompute", "offload"))


def test_figure_draws_a_line_per_policy_without_the_no_plan_points(sweep):
    fig = policy_sweep_figure(sweep, "four layers")
    assert [t.name for t in fig.data] == ["keep", "recompute", "offload", "auto"]
    for t in fig.data:
        assert len(t.x) == 3 and t.line.color == POLICY_COLORS[t.name]      # the 10 B limit: no plan, no point
        assert list(t.y) == sweep[(sweep.activations == t.name) & (sweep.throughput > 0)].throughput.tolist()
    assert fig.layout.title.text == "four layers" and fig.layout.xaxis.title.text.startswith("memory limit")
    assert list(fig.data[0].x) == pytest.approx([m / 1024 for m in MEMORIES[1:]])      # shown in KiB
