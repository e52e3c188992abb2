"""The exact cover search (workbench.planners.ilp.cover) against brute force."""

import math

import numpy as np
import pytest

from instances import footprint_limit, ilp_chain
from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan
from workbench.model.target import Target
from workbench.planners.brute import plan_brute
from workbench.planners.ilp.cover import TooManySets, cover_bound, cover_search, device_sets
from workbench.verify.check import check


def _instance(rng, L, P, tight=True):
    ch = ilp_chain(rng, L)
    M = footprint_limit(ch, P, rng, 1.2, 2.5) if tight else math.inf
    return ch, Target.of(P, memory=M, bandwidth=float(rng.uniform(2, 10)), memory_model="paper")


def _brute_cases(seed, n):
    rng = np.random.default_rng(seed)
    for i in range(n):
        L, P = int(rng.integers(3, 8)), int(rng.integers(2, 4))
        ch, plat = _instance(rng, L, P, tight=bool(i % 3))
        ref = plan_brute(ch, plat, allocation="general")
        if ref.feasible:
            yield ch, plat, ref


def test_thresholds_admit_the_optimal_plan():
    """Every device set of the brute-force optimum is possible at the optimal period."""
    done = rejected = 0
    for ch, plat, ref in _brute_cases(3, 14):
        ds = device_sets(ch, plat, ref.period * (1 + 1e-9))
        by_mask = dict(zip(ds.masks.tolist(), ds.thresholds.tolist()))
        parts = []
        for p in set(ref.assignment):
            mask = sum(1 << l for l, a in enumerate(ref.assignment) if a == p)
            assert mask in by_mask and by_mask[mask] <= ref.period * (1 + 1e-9), (p, mask)
            parts.append(mask)
        # the whole-partition test (every cut known) admits it too, and rejects it well below
        assert ds.allocation_fits(parts, ref.period)
        if math.isfinite(plat.memory) and len(parts) > 1:
            rejected += not ds.allocation_fits(parts, ref.period * 0.5)
        done += 1
    assert done >= 8 and rejected >= 3


def test_bound_valid_and_search_exact():
    done = 0
    for ch, plat, ref in _brute_cases(11, 16):
        start = ref.period * 1.5
        assert cover_bound(ch, plat, start) <= ref.period * (1 + 1e-9)
        r = cover_search(ch, plat, start)
        assert r.status == "optimal" and r.assignment is not None
        assert r.period == pytest.approx(ref.period, rel=1e-6)
        assert r.bound == pytest.approx(r.period, rel=1e-6)
        plan = make_plan(ch, plat, r.period, list(r.assignment), r.fwd, r.bwd)
        assert plan.feasible and not check(plan, ch, plat)
        # from the optimum itself nothing better is found, and the optimum is proven
        r2 = cover_search(ch, plat, ref.period)
        assert r2.status == "optimal" and r2.assignment is None
        done += 1
    assert done >= 8


def test_deadline_gives_a_valid_partial_bound():
    rng = np.random.default_rng(7)
    ch, plat = _instance(rng, 12, 3)
    from workbench.planners.dp.contiguous import plan_dp

    inc = plan_dp(ch, plat, graph=False).period
    r = cover_search(ch, plat, inc, deadline=0.0)  # already past: nothing searched
    assert r.status == "timeout" and r.bound <= inc and r.period == inc


def test_too_many_sets_is_reported():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0) for i in range(12)))
    with pytest.raises(TooManySets, match="device sets"):
        device_sets(ch, Target.of(2, memory_model="paper"), 100.0, limit=100)
