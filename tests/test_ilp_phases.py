"""Tests for workbench.planners.ilp.phases: the phases run in order and the plan says which found it."""

from __future__ import annotations

import math
import random
import time

from oracles import optimal_plan, random_instance
from workbench.model.chain import Chain, Layer
from workbench.model.plan import chain_for_plan
from workbench.model.target import Target
from workbench.planners.budget import MAY_VARY, Budget
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.phases import solve_chain
from workbench.planners.ilp.planner import plan_ilp
from workbench.profiles.pipedream import Graph, Node

ORDER = ["feasibility", "incumbent", "stage_bound", "packing", "background", "local_search", "cover", "milp"]


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
    p = solve_chain(chain, Target.of(2, memory=50, memory_model="paper"), "general", IlpOptions(), Budget())
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


def _dag_instance(seed: int):
    """A chain linearised from a random DAG of 4-6 nodes (cuts carry every crossing edge)."""
    rng = random.Random(seed)
    n = rng.randint(4, 6)
    nodes = [Node(f"v{i}", "", rng.uniform(0.2, 2), rng.uniform(0.4, 3), float(rng.randint(1, 40)),
                  float(rng.randint(0, 30))) for i in range(n)]
    edges = [(f"v{i}", f"v{i + 1}") for i in range(n - 1)] + [
        (f"v{i}", f"v{j}") for i in range(n) for j in range(i + 2, n) if rng.random() < 0.3]
    chain = Graph(tuple(nodes), tuple(edges), "rand").linearise()
    plat = Target.of(rng.randint(2, 3), bandwidth=rng.uniform(5, 40), memory_model="paper")
    free = max(optimal_plan(chain, plat, "general").memory)
    return chain, plat.with_(memory=free * rng.uniform(0.6, 1.0))


def test_every_reported_bound_stays_below_the_oracle_optimum():
    """The general ILP's proven bound (period x (1 - gap)) never exceeds the exhaustive oracle's optimum and its
    plan is never below it: on generic random chains, on chains of identical layers (ties everywhere), and on
    chains linearised from DAGs; on some the coarse path's fine bound (two blocks), under a time limit (the
    background search runs)."""
    cases = [random_instance(7000 + s, max_layers=5, max_devices=3) for s in range(6)]
    cases += [(Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 20, 6) for i in range(5)), input_bytes=6),
               Target.of(P, memory=m, memory_model="paper")) for P, m in ((2, 90.0), (3, 70.0))]
    cases += [_dag_instance(s) for s in range(5)]
    checked = 0
    for k, (chain, plat) in enumerate(cases):
        for coarsen in (None, 2):
            p = plan_ilp(chain, plat, allocation="general", time_limit=3.0, coarsen=coarsen)
            if not p.feasible:
                continue
            lin = chain_for_plan(p, chain)
            want = optimal_plan(lin, plat, "general")
            assert want is not None and p.period >= want.period * (1 - 1e-6), (k, coarsen)
            assert p.period * (1 - (p.gap or 0.0)) <= want.period * (1 + 1e-6), (k, coarsen, p.gap)
            if p.status == "optimal":
                assert math.isclose(p.period, want.period, rel_tol=1e-5), (k, coarsen)
            checked += 1
    assert checked >= 20
