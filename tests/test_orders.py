"""Tests for workbench.planners.evaluate.orders: the certified period of general allocations."""

from __future__ import annotations

import math

import pytest

from oracles import allocation_optimum, allocations, random_instance
from workbench.planners.evaluate.allocation import allocation_of
from workbench.planners.evaluate.orders import general_period


def test_general_period_against_the_oracle_and_both_order_searches():
    interleaved = 0
    for seed in range(20):
        chain, plat = random_instance(700 + seed, max_layers=5)
        for a in allocations(len(chain), plat.devices, "general"):
            al = allocation_of(chain, plat, a)
            if al.contiguous:
                continue
            got = general_period(al, plat, math.inf)
            want = allocation_optimum(chain, plat, a)
            assert (got is None) == (want is None), a
            if got is None:
                continue
            interleaved += 1
            assert got[0] == pytest.approx(want.period, rel=1e-5)
            full = general_period(al, plat, math.inf, loose=False)      # one order search per k vector
            assert full[0] == pytest.approx(got[0], rel=1e-7)
            assert general_period(al, plat, got[0]) is None              # nothing below its own period
    assert interleaved >= 30


def test_a_passed_deadline_stops_the_search():
    chain, plat = random_instance(3, max_layers=5)
    a = next(a for a in allocations(len(chain), plat.devices, "general")
             if not allocation_of(chain, plat, a).contiguous)
    try:
        general_period(allocation_of(chain, plat, a), plat.with_(memory=math.inf), math.inf, deadline=0.0)
    except TimeoutError:
        return
    pytest.skip("the allocation needed no order search")
