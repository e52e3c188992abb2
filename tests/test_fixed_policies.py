"""Tests for workbench.planners.fixed_policies."""

from __future__ import annotations

import pytest

from workbench.model.activations import apply_policies
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.fixed_policies import plan_with_policies
from workbench.planners.flushed import plan_gpipe

CHAIN = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(3)), input_bytes=10)


def test_the_effective_chain_is_planned_and_the_policies_recorded():
    plat = Target.of(2, memory_model="paper", host_bandwidth=100)
    p = plan_with_policies(CHAIN, plat, plan_dp, "dp", ["keep", "recompute", "offload"])
    q = plan_dp(apply_policies(CHAIN, ["keep", "recompute", "offload"]), plat)
    assert p.period == q.period and p.activations == ("keep", "recompute", "offload")
    assert p.setup["host_bandwidth"] == 100 and p.lower_bound < q.period
    assert plan_with_policies(CHAIN, plat, plan_dp, "dp", "keep").activations == ()


def test_flushed_schedules_refuse_offload():
    with pytest.raises(ValueError, match="offload needs a periodic plan"):
        plan_with_policies(CHAIN, Target.of(2), plan_gpipe, "gpipe", "offload")
