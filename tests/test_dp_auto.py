"""workbench.planners.dp.auto: dp with activation policies chosen per layer, against brute force."""

from __future__ import annotations

import itertools
import math
import time

import pytest

import workbench.planners.dp.auto as dp_auto
import workbench.planners.dp.versions as versions
from policy_instances import instance
from workbench.model.activations import POLICIES, apply_policies
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.planners.partition import bounds_to_assignment
from workbench.profiles import load_profile
from workbench.schedules.builder import Scheduler
from workbench.verify.check import check


def test_auto_equals_brute_force_on_120_instances():
    rescued = with_policies = 0
    for seed in range(120):
        chain, plat = instance(seed)
        a = run_planner(chain, plat, "dp", activations="auto")
        b = run_planner(chain, plat, "brute", activations="auto")
        assert a.feasible == b.feasible, seed
        if a.feasible:
            assert a.period == pytest.approx(b.period, rel=1e-6), seed
            assert a.status == "optimal" and check(a, chain, plat) == [], seed
            assert check(b, chain, plat) == [], seed
            with_policies += bool(a.activations)
            rescued += not run_planner(chain, plat, "dp").feasible
    assert with_policies >= 20 and rescued >= 5          # the instances exercise the policies


def test_auto_never_loses_to_keep_and_rescues_tight_limits():
    chain = load_profile("gpt-small")
    free = Target.of(4, optimizer="sgd", zero_grad="zeros")    # resident gradients: memory binds hardest
    keep, auto = run_planner(chain, free, "dp"), run_planner(chain, free, "dp", activations="auto")
    assert auto.period == pytest.approx(keep.period) and auto.activations == ()
    for frac in (0.9, 0.6, 0.5):
        plat = free.with_(memory=keep.peak_memory * frac)
        k, a = run_planner(chain, plat, "dp"), run_planner(chain, plat, "dp", activations="auto")
        assert a.feasible and check(a, chain, plat) == []
        assert not k.feasible or a.period <= k.period * (1 + 1e-9)
    tight = free.with_(memory=keep.peak_memory * 0.5)
    assert run_planner(chain, tight, "dp", activations="auto").period < run_planner(chain, tight, "dp").period * 0.85


def test_one_partition_gets_the_best_policies_for_it():
    for seed in range(25):
        chain, plat = instance(1000 + seed, max_layers=4)
        plat = plat.with_(devices=2)
        bounds = [(0, len(chain) // 2 - 1), (len(chain) // 2, len(chain) - 1)]
        a = dp_auto.auto_on_chain(chain, plat, allowed=bounds)
        T, found = a.period, a.bounds
        best = math.inf
        for vec in itertools.product(POLICIES, repeat=len(chain)):
            p = Scheduler(apply_policies(chain, vec), plat, bounds_to_assignment(bounds)).best()
            if p.feasible:
                best = min(best, p.period)
        assert (found is None) == math.isinf(best), seed
        if found is not None:
            assert found == bounds and T == pytest.approx(best, rel=1e-6), seed


def test_baselines_keep_their_partition_with_auto():
    chain = load_profile("gpt-small")
    plat = Target.of(4, memory="700MiB", optimizer="sgd")
    free = run_planner(chain, Target.of(4, optimizer="sgd"), "pipedream")
    p = run_planner(chain, plat, "pipedream", activations="auto")
    assert [(s.first, s.last) for s in p.stages] == [(s.first, s.last) for s in free.stages]
    assert p.feasible and check(p, chain, plat) == [] and "partition" in " ".join(p.notes)


def _around_brute_force(seeds: range, marked) -> int:
    """dp auto against brute force on ``seeds``: a plan dp finds is valid and not below the optimum, an
    infeasible answer is right, and where ``marked(plan)`` (not proven: thinned, or on blocks) the plan is
    ``feasible`` and its bound never exceeds the optimum. Returns how many were marked."""
    marked_count = 0
    for seed in seeds:
        chain, plat = instance(seed, max_layers=6)
        a = run_planner(chain, plat, "dp", activations="auto")
        b = run_planner(chain, plat, "brute", activations="auto")
        assert a.feasible <= b.feasible and (a.status != "infeasible" or not b.feasible), seed
        if not a.feasible:
            continue
        assert check(a, chain, plat) == [] and a.period >= b.period * (1 - 1e-9), seed
        if marked(a):
            marked_count += 1
            assert a.status == "feasible" and any("not proven optimal" in n for n in a.notes), seed
            assert a.period * (1 - a.gap) <= b.period * (1 + 1e-9), (seed, a.gap, b.period)
        elif a.status == "optimal":
            assert a.period == pytest.approx(b.period, rel=1e-6), seed
    return marked_count


def test_thinned_versions_give_a_plan_and_a_bound_around_brute_force(monkeypatch):
    """Versions thinned to one per group (relaxation rows for the rest): the plan is valid and not called
    optimal, and its lower bound never exceeds brute force's optimum."""
    monkeypatch.setattr(versions, "MIN_CAP", 1)
    monkeypatch.setattr(versions, "ROW_BUDGET", 1)
    assert _around_brute_force(range(2000, 2060), lambda p: p.status != "optimal") >= 10


def test_infeasible_says_the_least_memory_with_policies():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 100, 10, 100) for i in range(3)), input_bytes=10)
    p = run_planner(chain, Target.of(2, memory=50, optimizer="sgd"), "dp", activations="auto")
    assert not p.feasible and "even with recompute and offload" in p.notes[0]
    assert "unlimited" not in p.notes[0] and "cover the 3 layers" in p.notes[0]   # no 'least memory is unlimited'


def test_without_a_memory_limit_every_layer_keeps():
    chain = load_profile("pipedream/resnet50")
    p = run_planner(chain, Target.of(4), "dp", activations="auto")
    keep = run_planner(chain, Target.of(4), "dp")
    assert p.status == "optimal" and p.period == pytest.approx(keep.period) and not p.activations
    assert any("no memory limit" in n for n in p.notes)


def test_a_dag_profile_honours_the_time_limit_and_says_what_it_returns():
    """pipedream/resnet50 on 8 devices at a binding limit: the whole call within 10 % + 2 s of its limit, and the
    plan checked, with the status and gap of what was searched."""
    chain = load_profile("pipedream/resnet50")
    plat = Target.of(8, memory="5GiB")
    for limit in (1.0, 4.0):
        t0 = time.perf_counter()
        p = run_planner(chain, plat, "dp", activations="auto", time_limit=limit)
        assert time.perf_counter() - t0 <= 1.1 * limit + 2.0
        assert p.status in ("timeout", "feasible") and p.gap is not None and 0 <= p.gap < 1
        assert p.feasible and check(p, chain, plat) == []


def test_blocks_give_a_plan_and_a_bound_around_brute_force(monkeypatch):
    """Stage boundaries on blocks (the step budget forced down): the plan is valid and not called optimal, and
    its bound never exceeds brute force's optimum."""
    monkeypatch.setattr(dp_auto, "STEP_BUDGET", 1)
    monkeypatch.setattr(dp_auto, "BLOCKS", 3)
    assert _around_brute_force(range(3000, 3040), lambda p: any("blocks" in n for n in p.notes)) >= 10


def test_the_least_memory_with_policies_is_exact_against_brute_force():
    """The least memory of any plan with per-layer policies (every stage one mini-batch in flight): brute force
    over every policy vector finds no plan just below it and one at it."""
    from workbench.planners.partition import SuffixLinks

    checked = 0
    for seed in range(4000, 4030):
        chain, plat = instance(seed, max_layers=6)
        need, _ = dp_auto.least_memory_plan(chain, plat.with_(memory=math.inf), SuffixLinks(chain, plat), 1e12)
        if not math.isfinite(need):
            continue
        below = run_planner(chain, plat.with_(memory=need * (1 - 1e-6)), "brute", activations="auto")
        at = run_planner(chain, plat.with_(memory=need * (1 + 1e-9)), "brute", activations="auto")
        assert not below.feasible and at.feasible, seed
        checked += 1
    assert checked >= 20


def test_thinned_versions_still_find_a_plan_wherever_one_fits(monkeypatch):
    """Versions thinned to one per group: wherever brute force finds a plan, dp auto finds one (the plan of
    least memory when the thinned search misses), and where it finds none it proves it (status infeasible)."""
    monkeypatch.setattr(versions, "MIN_CAP", 1)
    monkeypatch.setattr(versions, "ROW_BUDGET", 1)
    for seed in range(2000, 2060):
        chain, plat = instance(seed, max_layers=6)
        a = run_planner(chain, plat, "dp", activations="auto")
        b = run_planner(chain, plat, "brute", activations="auto")
        assert a.feasible == b.feasible and a.status != "timeout", seed
        assert not a.feasible or check(a, chain, plat) == [], seed


def test_between_the_least_memory_and_keeps_auto_plans_or_proves_none_fits():
    """pipedream/vgg16 on 2 devices (the full model, Adam): the least memory with policies is what keep needs,
    9.96 GiB; at 8.5 and 9.5 GiB auto proves that nothing fits and says so (at 9.5 GiB it answered 'no plan
    found, not proven', and at 8.5 GiB named 8.95 GiB, a relaxation's bound); above it, a checked plan."""
    from workbench.planners.dp.contiguous import least_contiguous_memory

    chain = load_profile("pipedream/vgg16")
    keep_least = least_contiguous_memory(chain, Target.of(2))[0]
    for memory in ("8.5GiB", "9.5GiB"):
        p = run_planner(chain, Target.of(2, memory=memory), "dp", activations="auto")
        assert p.status == "infeasible" and "the least memory one needs on 2 devices is 9.96 GiB" in p.notes[0]
    plat = Target.of(2, memory=keep_least * 1.02)
    p = run_planner(chain, plat, "dp", activations="auto")
    assert p.feasible and check(p, chain, plat) == []
