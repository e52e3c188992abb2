"""Tests for workbench.planners.partition: the greedy bottleneck against the matrix DP and an enumeration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from instances import compositions
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.partition import (
    StageSums,
    bottleneck_partition,
    boundary_costs,
    bounds_to_assignment,
    suffix_bounds,
    unconstrained_period,
)


def _chain(rng: np.random.Generator, L: int, ties: bool) -> Chain:
    times = rng.integers(0, 4, size=(L, 2)).astype(float) if ties else rng.uniform(0, 3, size=(L, 2))
    return Chain(tuple(Layer(f"l{i}", float(f), float(b), 0.0, float(rng.integers(0, 60)))
                       for i, (f, b) in enumerate(times)), input_bytes=4.0)


def _enumerated(chain: Chain, platform: Target) -> float:
    """min over every partition into at most P runs of the largest max(F + B, c_j): written out here."""
    L = len(chain)
    c = [platform.comm_time(chain.cut(j)) if j < L - 1 else 0.0 for j in range(L)]
    best = math.inf
    for parts in compositions(L, platform.devices):
        worst = max(max(sum(chain.layers[l].forward + chain.layers[l].backward for l in range(a, b + 1)), c[b])
                    for a, b in parts)
        best = min(best, worst)
    return best


@pytest.mark.parametrize("ties", [False, True])
def test_unconstrained_period_is_the_matrix_dps_value_bit_for_bit(ties):
    rng = np.random.default_rng(5 + ties)
    for _ in range(150):
        L, P = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        chain = _chain(rng, L, ties)
        plat = Target.of(P, bandwidth=float(rng.choice([5.0, 30.0, math.inf])))
        sums = StageSums(chain, plat)
        want, _ = bottleneck_partition(np.maximum(sums.FB, sums.c[None, :]), P)
        got, bounds = unconstrained_period(chain, plat)
        assert got == want
        assert len(bounds) <= P and bounds[0][0] == 0 and bounds[-1][1] == L - 1
        assert all(b + 1 == a for (_, b), (a, _) in zip(bounds, bounds[1:]))
        assert max(max(sums.FB[a, b], sums.c[b]) for a, b in bounds) == got


def test_unconstrained_period_against_enumeration():
    rng = np.random.default_rng(9)
    for _ in range(80):
        chain = _chain(rng, int(rng.integers(1, 9)), bool(rng.integers(0, 2)))
        plat = Target.of(int(rng.integers(1, 5)), bandwidth=float(rng.choice([10.0, 40.0])))
        assert unconstrained_period(chain, plat)[0] == pytest.approx(_enumerated(chain, plat), rel=1e-12)


def test_helpers():
    assert bounds_to_assignment([(0, 2), (3, 3)]) == (0, 0, 0, 1)
    assert suffix_bounds([np.array([3, 3, 3, 3]), np.array([1, 2, 2, 2])], 2) == [(0, 1), (2, 3)]
    chain = Chain((Layer("a", 1, 1, 0, 8), Layer("b", 1, 1, 0, 8), Layer("c", 1, 1, 0, 8)))
    assert boundary_costs(chain, Target.of(2, bandwidth=2.0, latency=0.5)).tolist() == [4.5, 4.5, 0.0]
    assert bottleneck_partition(np.array([[2.0, 2.0], [0.0, 2.0]]), 2) == (2.0, [(0, 1)])   # fewest stages
