"""Tests for workbench.planners.evaluate.period: the evaluator's public API."""

from __future__ import annotations

import math

import pytest

from oracles import allocation_optimum, allocations, random_instance
from workbench.planners.budget import WorkDeadline
from workbench.planners.evaluate.period import allocation_best, allocation_period, normalise, path_period


def test_normalise_relabels_in_first_use_order():
    assert normalise((2, 2, 0, 1, 0)) == (0, 0, 1, 2, 1) and normalise(()) == ()


def test_best_is_the_period_below_a_cut_off_and_path_period_bounds_it():
    for seed in range(15):
        chain, plat = random_instance(900 + seed, max_layers=4)
        for a in allocations(len(chain), plat.devices, "general"):
            full = allocation_period(chain, plat, a)
            want = allocation_optimum(chain, plat, a)
            assert (full is None) == (want is None)
            if full is None:
                assert path_period(chain, plat, a) >= 0
                continue
            assert full[0] == pytest.approx(want.period, rel=1e-5)
            assert allocation_best(chain, plat, a, upper=full[0]) is None
            assert allocation_best(chain, plat, a, upper=full[0] * 1.01)[0] == pytest.approx(full[0])
            assert path_period(chain, plat, a) <= full[0] * (1 + 1e-9)


def test_a_work_deadline_is_charged_per_evaluation():
    chain, plat = random_instance(1, max_layers=4)
    d = WorkDeadline(10_000)
    allocation_best(chain, plat, (0,) * len(chain), deadline=d)
    assert d.used > 0 and not math.isinf(d.ticks_left)
