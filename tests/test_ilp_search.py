"""Local search over general allocations (workbench.planners.ilp.search) against brute force."""

import numpy as np

from instances import ilp_chain
from workbench.model.target import Target
from workbench.planners.brute import plan_brute
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.evaluate.period import allocation_best, normalise, path_period
from workbench.planners.ilp.search import guided_search, local_search
from workbench.verify.check import check


def test_normalise_relabels_in_first_use_order():
    assert normalise((2, 2, 0, 1, 0)) == (0, 0, 1, 2, 1)


def _instances(seed: int, n: int, layers: tuple[int, int], devices: tuple[int, int]):
    """Random chains with a memory limit that binds, and their contiguous DP plan (feasible ones only)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        L, P = int(rng.integers(*layers)), int(rng.integers(*devices))
        ch = ilp_chain(rng, L)
        plat = Target.of(P, bandwidth=float(rng.uniform(2, 10)), memory_model="paper")
        plat = plat.with_(memory=plan_dp(ch, plat, graph=False).peak_memory * float(rng.uniform(0.6, 1.0)))
        start = plan_dp(ch, plat, graph=False)
        if start.feasible:
            yield ch, plat, start


def test_never_worse_valid_and_never_below_the_optimum():
    improved = 0
    for ch, plat, start in _instances(3, 12, (4, 8), (2, 4)):
        got = local_search(ch, plat, start, seconds=5)
        opt = plan_brute(ch, plat, allocation="general")
        assert got.period <= start.period * (1 + 1e-12)
        assert got.period >= opt.period * (1 - 1e-9)
        assert not check(got, ch, plat)
        improved += got.period < start.period * (1 - 1e-9)
    assert improved >= 2


def _stopped_valid_and_optimal_at_best(search, ch, plat, start, upper, **kw):
    """Run ``search`` with 60 s but ten stale kicks; it must stop early, return a valid plan between
    the brute-force optimum and ``upper``. Returns (plan, optimum)."""
    import time

    t0 = time.perf_counter()
    got = search(ch, plat, start, seconds=60, kicks=10, **kw)
    assert time.perf_counter() - t0 < 30          # ten kicks in a row without gain end it, not the clock
    opt = plan_brute(ch, plat, allocation="general")
    assert opt.period * (1 - 1e-9) <= got.period <= upper.period * (1 + 1e-12)
    assert not check(got, ch, plat)
    return got, opt


def test_kicks_never_lose_and_stop_when_stale():
    for ch, plat, start in _instances(5, 8, (5, 8), (3, 4)):
        plain = local_search(ch, plat, start, seconds=5)
        # the kicks start from the plain descent's result and keep only improvements
        _stopped_valid_and_optimal_at_best(local_search, ch, plat, start, plain)


def test_path_period_is_a_lower_bound_on_the_exact_period():
    """The path period (no waits) never exceeds the exact period of the same allocation, and where
    it finds nothing that fits, neither does the exact search; it is tight on some allocations."""
    rng = np.random.default_rng(11)
    tight = compared = 0
    for ch, plat, _ in _instances(7, 20, (4, 8), (2, 4)):
        for _ in range(10):
            a = normalise(tuple(int(d) for d in rng.integers(0, plat.devices, len(ch))))
            exact = allocation_best(ch, plat, a)
            r = path_period(ch, plat, a)
            if r == float("inf"):
                assert exact is None
            if exact is None:
                continue
            compared += 1
            assert r <= exact[0] * (1 + 1e-9)
            tight += r >= exact[0] * (1 - 1e-9)
        assert path_period(ch, plat.with_(memory=1.0), (0,) * len(ch)) == float("inf")
    assert compared >= 50 and tight >= 10


def test_guided_search_never_worse_valid_and_never_below_the_optimum():
    improved = reached = 0
    for ch, plat, start in _instances(3, 12, (4, 8), (2, 4)):
        got, opt = _stopped_valid_and_optimal_at_best(guided_search, ch, plat, start, start)
        improved += got.period < start.period * (1 - 1e-9)
        reached += got.period <= opt.period * (1 + 1e-9)
    assert improved >= 2 and reached >= 6   # measured: 5 improved, 10 of 12 optimal
