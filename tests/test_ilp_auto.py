"""workbench.planners.ilp.auto: the ILP with per-layer policies against brute force (every plan checked)."""

from __future__ import annotations

import pytest

from policy_instances import instance
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.verify.check import check


def _feasible_instances(n: int):
    """The first n instances (seeds from 200) with a plan: brute force with policies finds one."""
    seed = 200
    while n:
        chain, plat = instance(seed, max_layers=4)
        seed += 1
        if run_planner(chain, plat, "dp", activations="auto").feasible:
            n -= 1
            yield seed, chain, plat


@pytest.mark.parametrize("allocation", ["contiguous", "general"])
def test_never_below_brute_force_and_always_valid(allocation):
    equal = 0
    for seed, chain, plat in _feasible_instances(10):
        a = run_planner(chain, plat, "ilp", allocation=allocation, activations="auto", time_limit=30)
        b = run_planner(chain, plat, "brute", allocation=allocation, activations="auto")
        assert a.feasible and b.feasible, seed
        assert check(a, chain, plat) == [], seed
        assert a.period >= b.period * (1 - 1e-6), seed
        equal += a.period <= b.period * (1 + 1e-6)
    assert equal >= 8


def test_general_plan_with_recompute_beats_keep():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
    plat = Target.of(2, memory=300, memory_model="paper", host_bandwidth=100)
    dp_keep = run_planner(ch, plat, "dp")
    keep = run_planner(ch, plat, "ilp", allocation="general")
    auto = run_planner(ch, plat, "ilp", allocation="general", activations="auto")
    assert (dp_keep.period, keep.period, auto.period) == pytest.approx((9.0, 7.0, 6.0))
    assert auto.activations and check(auto, ch, plat) == [] and auto.allocation == "general"


def test_long_chains_fall_back_to_the_dp_plan():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(41)), input_bytes=10)   # bound 30.75
    plat = Target.of(4, memory=3000, memory_model="paper")
    p = run_planner(ch, plat, "ilp", allocation="general", activations="auto")
    assert p.feasible and p.method == "ilp" and any("no MILP with policies" in n for n in p.notes)


def test_without_a_limit_auto_is_keep():
    ch = Chain(tuple(Layer(f"l{i}", 1.0 + 0.3 * i, 2.0, 0, 10, 100) for i in range(5)), input_bytes=10)
    plat = Target.of(2, memory_model="paper")
    keep = run_planner(ch, plat, "ilp", allocation="general")
    auto = run_planner(ch, plat, "ilp", allocation="general", activations="auto")
    assert auto.period == pytest.approx(keep.period) and auto.activations == ()
