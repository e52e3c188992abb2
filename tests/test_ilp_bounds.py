"""Tests for workbench.planners.ilp.bounds: every bound holds for the oracle's optimal plans."""

from __future__ import annotations

from oracles import optimal_plan, random_instance
from workbench.planners.ilp.bounds import k_bounds, least_memory_bound, memory_period_bound


def test_bounds_hold_for_optimal_plans():
    checked = 0
    for seed in range(30):
        chain, plat = random_instance(1100 + seed, max_layers=5)
        best = optimal_plan(chain, plat, "general")
        need, why = least_memory_bound(chain, plat)
        if best is None:
            continue
        checked += 1
        assert need <= best.peak_memory * (1 + 1e-9) and "needs" in why
        assert memory_period_bound(chain, plat) <= best.period * (1 + 1e-9)
        kmax = k_bounds(chain, plat, t_ub=best.period)
        assert all(s.in_flight <= kmax[s.first] for s in best.stages)
    assert checked >= 15
