"""The planners against the exhaustive oracle of tests/oracles.py, which shares none of their code.

The oracle enumerates every allocation and solves each one's least period with its own MILP
(scipy), certifies its plan with the checker, and computes memory with the checker's own
re-derivation (workbench.verify.check_memory). dp, brute force, the per-allocation evaluator, the ILP
and the cover search must agree with it.
"""

from __future__ import annotations

import math
import time

import pytest

from oracles import allocation_optimum, allocations, optimal_plan, random_instance
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.brute import plan_brute
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.evaluate.period import allocation_period
from workbench.planners.ilp.cover import cover_bound, cover_search
from workbench.planners.ilp.planner import plan_ilp
from workbench.verify.check import check

REL = 1e-5   # the oracle is exact to about 1e-6 (its MILP's tolerances), the planners to 1e-9


def _instances(n: int, seed: int, max_layers: int = 5, max_devices: int = 3):
    for i in range(n):
        yield random_instance(seed * 1000 + i, max_layers, max_devices)


def _same(got: float, want: float) -> bool:
    return (math.isinf(got) and math.isinf(want)) or got == pytest.approx(want, rel=REL)


def test_the_oracle_on_instances_worked_by_hand():
    three = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
    # 3 layers of 3 s on 2 devices: the loads are 6 and 3 whatever the allocation
    assert optimal_plan(three, Target.of(2, memory_model="paper"), "general").period == pytest.approx(6.0)
    # one device holds 2 mini-batches' activations (2 x 10 bytes) or the period doubles: window 2 (1 + 1) + 2 = 6
    two = Chain((Layer("a", 1.0, 1.0, 0, 0, saved_bytes=10), Layer("b", 1.0, 1.0, 0, 0, saved_bytes=10)))
    roomy = optimal_plan(two, Target.of(2, memory=20, memory_model="paper"), "contiguous")
    tight = optimal_plan(two, Target.of(2, memory=10, memory_model="paper"), "contiguous")
    assert roomy.period == pytest.approx(2.0) and tight.period == pytest.approx(4.0)
    assert optimal_plan(two, Target.of(2, memory=9, memory_model="paper"), "contiguous") is None
    assert sorted(allocations(3, 2, "general")) == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]


def test_dp_and_brute_force_against_the_oracle():
    n_bound = 0
    for chain, plat in _instances(40, seed=1, max_layers=6):
        free = plan_dp(chain, plat.with_(memory=math.inf)).period
        for allocation in ("contiguous", "general"):
            want = optimal_plan(chain, plat, allocation)
            want_T = want.period if want is not None else math.inf
            got = plan_brute(chain, plat, allocation=allocation, cache=False)
            assert _same(got.period, want_T), (allocation, got.period, want_T)
            if allocation == "contiguous":
                dp = plan_dp(chain, plat)
                assert _same(dp.period, want_T) and (dp.status == "optimal") == (want is not None)
                n_bound += want is not None and want_T > free * (1 + 1e-6)
            if got.feasible:
                assert check(got, chain, plat) == []
    assert n_bound >= 5    # the memory limit binds in enough of them


def test_the_per_allocation_evaluator_against_the_oracle():
    for chain, plat in _instances(20, seed=2, max_layers=4):
        for a in allocations(len(chain), plat.devices, "general"):
            want = allocation_optimum(chain, plat, a)
            got = allocation_period(chain, plat, a)
            assert _same(got[0] if got else math.inf, want.period if want else math.inf), a
            if got is not None and list(a) == sorted(a):      # contiguous: the closed form, and the search
                assert _same(allocation_period(chain, plat, a, exact_general=True)[0], got[0])


@pytest.mark.parametrize("allocation", ["contiguous", "general"])
def test_the_ilp_against_the_oracle(allocation):
    for chain, plat in _instances(15, seed=3, max_layers=5):
        want = optimal_plan(chain, plat, allocation)
        got = plan_ilp(chain, plat, allocation=allocation, time_limit=30)
        if want is None:
            assert not got.feasible
            continue
        assert got.period >= want.period * (1 - REL)           # never below the optimum
        if got.status == "optimal":
            assert got.period == pytest.approx(want.period, rel=REL)
        assert check(got, chain, plat) == []
        assert got.extra["solve"]["found_by"] in [r["phase"] for r in got.extra["solve"]["phases"]]


def test_the_cover_search_against_the_oracle():
    proved = 0
    for chain, plat in _instances(30, seed=4, max_layers=6):
        if plat.devices < 2:
            continue
        want = optimal_plan(chain, plat, "general")
        dp = plan_dp(chain, plat)
        if want is None or not dp.feasible:
            continue
        assert cover_bound(chain, plat, dp.period) <= want.period * (1 + REL)
        res = cover_search(chain, plat, dp.period, deadline=time.perf_counter() + 1.0)
        assert res.bound <= want.period * (1 + REL)
        if res.status == "optimal":
            proved += 1
            assert min(dp.period, res.period) == pytest.approx(want.period, rel=REL)
    assert proved >= 5
