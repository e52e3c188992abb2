"""Tests for workbench.bisection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.bisection import Found, bisect, least_feasible


def test_bisect_brackets_the_threshold_for_floats_and_arrays():
    lo, hi = bisect(0.0, 10.0, lambda T: T >= math.pi, rel=1e-12)
    assert lo < math.pi <= hi and hi - lo <= 1e-12 * hi
    want = np.array([0.5, 2.0, 7.25])
    lo, hi = bisect(np.zeros(3), np.full(3, 8.0), lambda T: T >= want, rel=1e-9)
    assert np.all(lo < want) and np.all(hi >= want) and np.all(hi - lo <= 1e-9 * hi)


def test_bisect_stops_after_max_steps():
    calls = []
    bisect(0.0, 1.0, lambda T: calls.append(T) or T > 0.3, rel=0.0, max_steps=5)
    assert len(calls) == 5


def test_least_feasible_finds_the_least_reached_period_and_uses_steps():
    # structures: the integers; structure n is valid from period n (its exact period)
    probes = []

    def probe(T):
        probes.append(T)
        return math.floor(T) if T >= 7.0 else None

    got = least_feasible(1.0, 1000.0, probe, float)
    assert got == Found(7.0, 7, got.lower, True) and 7.0 * (1 - 1e-9) <= got.lower < 7.0
    probes.clear()
    stepped = least_feasible(1.0, 1000.0, probe, float, steps=[2.0, 4.0, 8.0, 16.0])
    assert stepped.period == 7.0 and probes[:4] == [1.0, 2.0, 4.0, 8.0] and 1000.0 not in probes
    assert least_feasible(1.0, 5.0, probe, float) is None


def test_least_feasible_stops_early_with_the_incumbent():
    got = least_feasible(1.0, 1000.0, lambda T: T if T >= 7.0 else None, float, stop=lambda lo, hi: True)
    assert not got.complete and got.period == 1000.0 and got.lower == 1.0

    def slow(T):    # the probe at t0 finds nothing, the one at 1000 a structure, then time is up
        if T == 1.0:
            return None
        if T < 500:
            raise TimeoutError
        return T

    got = least_feasible(1.0, 1000.0, slow, float)
    assert not got.complete and 500 <= got.period <= 1000.0
    with pytest.raises(TimeoutError):
        least_feasible(1.0, 1000.0, lambda T: (_ for _ in ()).throw(TimeoutError), float)


def test_least_feasible_starts_from_a_known_structure():
    """``start``: a structure and its exact period; the probe at hi is not made, the search below it is the same,
    and a time-out before any probe finds a structure returns the known one."""
    probes = []

    def probe(T):
        probes.append(T)
        return math.floor(T) if T >= 7.0 else None

    got = least_feasible(1.0, 1000.0, probe, float, start=(12, 12.0))
    assert got.period == 7.0 and got.complete and 1000.0 not in probes and max(probes) < 12.0

    def late(T):
        if T > 2.0:
            raise TimeoutError
        return None

    got = least_feasible(1.0, 1000.0, late, float, steps=[2.0, 4.0], start=(12, 12.0))
    assert got == Found(12.0, 12, 2.0, False)
