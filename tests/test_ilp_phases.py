"""Tests for workbench.planners.ilp.phases: the phases run in order and the plan says which found it."""

from __future__ import annotations

import math
import time

from oracles import optimal_plan, random_instance
from workbench.model.chain import Chain, Layer, Platform
from workbench.planners.budget import MAY_VARY, Budget
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.phases import solve_chain

ORDER = ["feasibility", "incumbent", "stage_bound", "local_search", "cover", "milp"]


def _phases(p):
    return [r["phase"] for r in p.extra["solve"]["phases"]]


def test_phases_run_in_order_and_name_who_found_and_who_proved():
    seen_found, seen_bound = set(), set()
    for seed in range(12):
        chain, plat = random_instance(500 + seed, max_layers=5, max_devices=3)
        for allocation in ("contiguous", "general"):
            p = solve_chain(chain, plat, allocation, IlpOptions(), Budget())
            names = _phases(p)
            assert names == sorted(names, key=ORDER.index) and names[0] == "feasibility"
            solve = p.extra["solve"]
            if p.feasible:
                assert solve["found_by"] in names
                seen_found.add(solve["found_by"])
                seen_bound.add(solve["bound_by"])
                want = optimal_plan(chain, plat, allocation)
                if p.status == "optimal":
                    assert math.isclose(p.period, want.period, rel_tol=1e-5)
            periods = [r["period"] for r in solve["phases"] if r["period"] is not None]
            # the incumbent only improves (a MILP plan within BETTER of it may replace it)
            assert all(b <= a * (1 + 1e-9) for a, b in zip(periods, periods[1:]))
    assert {"incumbent", "milp"} <= seen_found and len(seen_bound) >= 2 and seen_bound <= set(ORDER) | {None}


def test_a_layer_that_does_not_fit_stops_at_the_first_phase():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 100, 10) for i in range(3)))
    p = solve_chain(chain, Platform(2, memory=50, memory_model="paper"), "general", IlpOptions(), Budget())
    assert p.status == "infeasible" and _phases(p) == ["feasibility"]
    assert p.extra["least_memory_bound"] > 50 and p.extra["solve"]["found_by"] is None


def test_a_phase_the_safety_net_stops_makes_the_plan_say_it_may_vary():
    """Deterministic budgets whose wall-clock safety net has already passed: the local search is stopped
    by it, and the plan says so in its notes and as ``extra["may_vary"]``."""
    chain, plat = random_instance(0, max_layers=6, max_devices=3)
    budget = Budget(10.0, deterministic=True, wall_end=time.perf_counter() - 1.0)
    p = solve_chain(chain, plat, "general", IlpOptions(deterministic=True), budget)
    calm = solve_chain(chain, plat, "general", IlpOptions(deterministic=True), Budget(10.0, deterministic=True))
    assert p.extra["may_vary"] is True and p.extra["deterministic"] is False and p.notes[-1] == MAY_VARY
    assert calm.extra["may_vary"] is False and MAY_VARY not in calm.notes
