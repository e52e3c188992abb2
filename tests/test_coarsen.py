"""Coarsening: expansion of block plans, and the coarse ILP on longer chains."""

from __future__ import annotations

import math

import numpy as np
import pytest

from instances import block_chain
from workbench.model.plan import lower_bound
from workbench.model.target import Target
from workbench.planners.blocks import block_groups
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.bounds import memory_period_bound
from workbench.planners.ilp.coarse import plan_coarse
from workbench.planners.ilp.coarsen import expand_assignment, expand_plan
from workbench.planners.ilp.planner import plan_ilp
from workbench.verify.check import check


def test_expand_assignment():
    assert expand_assignment([(0, 1), (2, 2), (3, 5)], [0, 1, 0]) == [0, 0, 1, 0, 0, 0]


@pytest.mark.parametrize("allocation", ["contiguous", "general"])
def test_expanded_block_plan_is_valid_with_the_same_period(allocation):
    rng = np.random.default_rng(3)
    ch = block_chain(rng, 20)
    plat = Target.of(3, bandwidth=4.0, memory_model="paper")
    free = plan_dp(ch, plat, graph=False).peak_memory
    plat = plat.with_(memory=free * 0.8)
    groups = block_groups(ch, 6, plat)
    coarse = ch.coarsen(groups)
    cp = plan_ilp(coarse, plat, allocation=allocation, coarsen=False, time_limit=20)
    if not cp.feasible:
        pytest.skip("blocks too coarse for this memory")
    fp = expand_plan(cp, ch, plat, groups)
    assert math.isclose(fp.period, cp.period, rel_tol=1e-9)
    assert not check(fp, ch, plat)
    assert max(fp.memory) == pytest.approx(max(cp.memory), rel=1e-9)


def test_plan_coarse_reports_cost_and_never_loses_to_the_fine_dp():
    rng = np.random.default_rng(8)
    ch = block_chain(rng, 45)
    plat = Target.of(4, bandwidth=4.0, memory_model="paper")
    free = plan_dp(ch, plat, graph=False).peak_memory
    plat = plat.with_(memory=free * 0.7)
    d = plan_dp(ch, plat, graph=False)
    for allocation in ("contiguous", "general"):
        p = plan_coarse(ch, plat, blocks=12, allocation=allocation, time_limit=15)
        # contiguous: the fine DP's plan meets its own bound, so no block solve runs
        assert allocation == "contiguous" or (p.extra["blocks"] == 12 and p.extra["largest_block"] > 0)
        assert p.extra["fine_lower_bound"] >= lower_bound(ch, plat) * (1 - 1e-12)
        assert p.feasible and not check(p, ch, plat)
        assert p.period <= d.period * (1 + 1e-9)
        assert p.gap == pytest.approx((p.period - p.extra["fine_lower_bound"]) / p.period, abs=1e-9) or p.gap == 0.0
    # contiguous: the fine DP is exact, so the coarse route is optimal too
    assert plan_coarse(ch, plat, blocks=12, time_limit=15).status == "optimal"


def test_default_coarsening_above_32_layers():
    rng = np.random.default_rng(12)
    ch = block_chain(rng, 40)
    p = plan_ilp(ch, Target.of(4, bandwidth=4.0, memory_model="paper"), allocation="general", time_limit=20)
    assert p.extra.get("blocks") == 32 or p.status == "optimal"
    assert p.extra["fine_lower_bound"] > 0
    assert not check(p, ch, Target.of(4, bandwidth=4.0, memory_model="paper"))


def test_memory_period_bound_is_a_lower_bound():
    from workbench.planners.brute import plan_brute

    rng = np.random.default_rng(2)
    for _ in range(8):
        ch = block_chain(rng, 6)
        plat = Target.of(2, bandwidth=5.0, memory_model="paper")
        free = plan_dp(ch, plat, graph=False).peak_memory
        plat = plat.with_(memory=free * float(rng.uniform(0.4, 1.0)))
        best = plan_brute(ch, plat, allocation="general")
        mb = memory_period_bound(ch, plat)
        assert mb <= best.period * (1 + 1e-9)
        if not best.feasible:
            continue
        assert math.isfinite(mb)


def test_general_refines_on_half_the_blocks_and_the_fine_chain():
    """General mode on 16+ blocks also solves on half as many blocks (cover search) and runs a
    local search on the fine chain; the result is valid, never worse than any of its sources."""
    rng = np.random.default_rng(21)
    ch = block_chain(rng, 40)
    plat = Target.of(3, bandwidth=4.0, memory_model="paper")
    plat = plat.with_(memory=plan_dp(ch, plat, graph=False).peak_memory * 0.6)
    p = plan_coarse(ch, plat, blocks=16, allocation="general", time_limit=12)
    half = p.extra["half_blocks"]
    assert half["blocks"] == 8 and half["period"] is not None
    assert p.feasible and not check(p, ch, plat)
    assert p.period <= min(half["period"], p.extra["coarse_period"], plan_dp(ch, plat, graph=False).period) * (1 + 1e-9)
    assert p.period >= p.extra["fine_lower_bound"] * (1 - 1e-9)
