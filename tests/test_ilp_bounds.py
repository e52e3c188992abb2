"""The assignment master bound and the Benders search (workbench.planners.ilp_bounds) vs brute force."""

import numpy as np

from workbench.chain import Chain, Layer, Platform
from workbench.planners.brute import plan_brute
from workbench.planners.ilp_bounds import benders, master_lower_bound, side_search
from workbench.planners.ilp_search import normalise


def _instance(rng, L, P):
    layers = tuple(Layer(f"l{i}", float(rng.uniform(0.5, 10)), float(rng.uniform(0.5, 20)),
                         float(rng.integers(1, 60)), float(rng.integers(1, 40))) for i in range(L))
    ch = Chain(layers, input_bytes=float(rng.integers(1, 40)))
    foot = ch.saved_array + ch.weights
    M = max(float(foot.max()), float(foot.sum()) / P) * float(rng.uniform(1.2, 2.5))
    return ch, Platform(P, memory=M, bandwidth=float(rng.uniform(2, 10)))


def test_master_bound_valid_and_benders_exact():
    rng = np.random.default_rng(11)
    done = 0
    for _ in range(12):
        L, P = int(rng.integers(3, 7)), int(rng.integers(2, 4))
        ch, plat = _instance(rng, L, P)
        ref = plan_brute(ch, plat, allocation="general")
        if not ref.feasible:
            continue
        lb = master_lower_bound(ch, plat, ref.period * 1.5)
        assert lb <= ref.period * (1 + 1e-6), (lb, ref.period)
        # Benders from a poor incumbent reaches the optimum and proves it
        st, hit, _ = benders(ch, plat, ref.period * 1.5)
        assert st == "optimal" and hit is not None
        assert abs(hit[0] - ref.period) <= 1e-6 * ref.period, (hit[0], ref.period)
        # from the optimum itself: nothing better exists
        st, hit, _ = benders(ch, plat, ref.period)
        assert st == "optimal" and (hit is None or hit[0] >= ref.period * (1 - 1e-6))
        done += 1
    assert done >= 6


def test_side_search_emits_and_normalises():
    rng = np.random.default_rng(5)
    ch, plat = _instance(rng, 5, 2)
    got = []
    out = side_search(ch, plat, 1e9, 20.0, emit=got.append)
    assert got and got[-1] == out
    if out[2] is not None:
        assert tuple(out[2][1]) == normalise(out[2][1])
