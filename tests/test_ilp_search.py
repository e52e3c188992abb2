"""Local search over general allocations (workbench.planners.ilp_search) against brute force."""

import numpy as np

from workbench.chain import Chain, Layer, Platform
from workbench.check import check
from workbench.planners.brute import plan_brute
from workbench.planners.dp import plan_dp
from workbench.planners.ilp_search import local_search, normalise


def test_normalise_relabels_in_first_use_order():
    assert normalise((2, 2, 0, 1, 0)) == (0, 0, 1, 2, 1)


def _instances(seed: int, n: int, layers: tuple[int, int], devices: tuple[int, int]):
    """Random chains with a memory limit that binds, and their contiguous DP plan (feasible ones only)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        L, P = int(rng.integers(*layers)), int(rng.integers(*devices))
        ls = tuple(Layer(f"l{i}", float(rng.uniform(0.5, 10)), float(rng.uniform(0.5, 20)),
                         float(rng.integers(1, 60)), float(rng.integers(1, 40))) for i in range(L))
        ch = Chain(ls, input_bytes=float(rng.integers(1, 40)))
        plat = Platform(P, bandwidth=float(rng.uniform(2, 10)))
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



def test_kicks_never_lose_and_stop_when_stale():
    import time

    for ch, plat, start in _instances(5, 8, (5, 8), (3, 4)):
        plain = local_search(ch, plat, start, seconds=5)
        t0 = time.perf_counter()
        kicked = local_search(ch, plat, start, seconds=60, kicks=10)
        assert time.perf_counter() - t0 < 30          # ten kicks in a row without gain end it, not the clock
        opt = plan_brute(ch, plat, allocation="general")
        # the kicks start from the plain descent's result and keep only improvements
        assert opt.period * (1 - 1e-9) <= kicked.period <= plain.period * (1 + 1e-12)
        assert not check(kicked, ch, plat)
