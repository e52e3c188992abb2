"""workbench.planners.dp.auto: dp with activation policies chosen per layer, against brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest

import workbench.planners.dp.auto as dp_auto
from policy_instances import instance, random_chain
from workbench.model.activations import POLICIES, apply_policies
from workbench.model.chain import Chain, Layer, Platform
from workbench.planners import plan as run_planner
from workbench.planners.partition import bounds_to_assignment
from workbench.profiles import load_profile
from workbench.verify.check import check
from workbench.verify.schedule import Scheduler


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
    free = Platform(4, optimizer="sgd", zero_grad="zeros")    # resident gradients: memory binds hardest
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
        T, found, pol, _ = dp_auto.auto_on_chain(chain, plat, allowed=bounds)
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
    plat = Platform(4, memory="700MiB", optimizer="sgd")
    free = run_planner(chain, Platform(4, optimizer="sgd"), "pipedream")
    p = run_planner(chain, plat, "pipedream", activations="auto")
    assert [(s.first, s.last) for s in p.stages] == [(s.first, s.last) for s in free.stages]
    assert p.feasible and check(p, chain, plat) == [] and "partition" in " ".join(p.notes)


def test_thinned_versions_are_not_called_optimal(monkeypatch):
    monkeypatch.setattr(dp_auto, "VERSION_CAP", 4)
    chain = random_chain(random.Random(9), 6)
    plat = Platform(2, optimizer="sgd")
    p = run_planner(chain, plat.with_(memory=run_planner(chain, plat, "dp").peak_memory * 0.7), "dp",
                    activations="auto")
    if p.feasible:
        assert p.status == "feasible" and any("not proven optimal" in n for n in p.notes)


def test_infeasible_says_the_least_memory_with_policies():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 100, 10, 100) for i in range(3)), input_bytes=10)
    p = run_planner(chain, Platform(2, memory=50, optimizer="sgd"), "dp", activations="auto")
    assert not p.feasible and "even with recompute and offload" in p.notes[0]
