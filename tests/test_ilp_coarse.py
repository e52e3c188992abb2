"""Tests for workbench.planners.ilp.coarse: the ILP on blocks, expanded, with its phases recorded."""

from __future__ import annotations

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.coarse import plan_coarse
from workbench.verify.check import check


def test_blocks_expand_to_a_valid_plan_no_worse_than_the_fine_dp():
    chain = Chain(tuple(Layer(f"l{i}", 1.0 + (i * 7 % 5) / 4, 2.0, 30, 6) for i in range(24)))
    plat = Target.of(3, memory_model="paper")
    plat = plat.with_(memory=plan_dp(chain, plat).peak_memory * 0.7)
    for allocation in ("contiguous", "general"):
        p = plan_coarse(chain, plat, blocks=8, allocation=allocation, time_limit=6)
        assert check(p, chain, plat) == [] and p.period <= plan_dp(chain, plat).period * (1 + 1e-9)
        phases = [r["phase"] for r in p.extra["solve"]["phases"]]
        assert phases[:2] == ["incumbent", "fine_bound"]
        assert p.extra["fine_lower_bound"] <= p.period
        if allocation == "contiguous":    # the fine DP is exact: no block solve
            assert phases == ["incumbent", "fine_bound"] and p.status == "optimal"
            continue
        met = p.period <= p.extra["fine_lower_bound"] * (1 + 1e-6)
        assert "block_ilp" in phases and ("guided_search" in phases) == (not met) and p.extra["blocks"] == 8
