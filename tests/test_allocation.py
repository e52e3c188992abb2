"""Tests for workbench.planners.evaluate.allocation: stage data and bounds of one allocation, the contiguous
closed form."""

from __future__ import annotations

import math

import pytest

from oracles import allocation_optimum, allocations, random_instance
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.evaluate.allocation import allocation_of, contiguous_period, memory_floor, paths_fit


def test_stage_data_from_the_layers():
    chain = Chain((Layer("a", 1, 2, 0, 8), Layer("b", 3, 4, 0, 8), Layer("c", 5, 6, 0, 8)))
    al = allocation_of(chain, Target.of(2, bandwidth=4.0), (0, 1, 0))
    assert al.runs == [(0, 0), (1, 1), (2, 2)] and al.dev == [0, 1, 0] and al.devices == [[0, 2], [1]]
    assert al.F == [1, 3, 5] and al.B == [2, 4, 6] and al.c == [2.0, 2.0, 0.0]
    assert al.static_lb == 14.0                                 # device 0: 1 + 2 + 5 + 6
    assert al.path == [1 + 2 + 2 * 2 + 3 + 4 + 2 * 2 + 5 + 6, 3 + 4 + 2 * 2 + 5 + 6, 11]


def test_the_closed_form_against_the_oracle_and_its_bounds():
    for seed in range(25):
        chain, plat = random_instance(300 + seed, max_layers=5)
        for a in allocations(len(chain), plat.devices, "contiguous"):
            al = allocation_of(chain, plat, a)
            got = contiguous_period(al, plat)
            want = allocation_optimum(chain, plat, a)
            assert (got is None) == (want is None), a
            if got is None:
                continue
            assert got[0] == pytest.approx(want.period, rel=1e-5)
            assert memory_floor(al, plat) <= got[0] * (1 + 1e-9) and al.static_lb <= got[0] * (1 + 1e-9)
            assert paths_fit(al, plat, got[0] * (1 + 1e-9)) and paths_fit(al, plat, got[0] * 4)
            if math.isfinite(plat.memory):
                assert not paths_fit(al, plat.with_(memory=0.0), got[0])
