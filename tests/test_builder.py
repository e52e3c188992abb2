"""The periodic schedule builder: valid plans, least memory, and the best period against an LP brute force."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from scipy.optimize import linprog

from instances import py_chain, py_contiguous, py_general
from oracles import paper_stage_memory
from workbench.model.chain import Chain, Layer
from workbench.model.plan import stages_of
from workbench.model.target import Target
from workbench.schedules.builder import (
    NoSchedule,
    Scheduler,
    best_schedule,
    build_schedule,
    load_period,
    one_in_flight_memory,
)
from workbench.verify.check import check

# ----- an independent brute force: enumerate in-flight vectors, LP for the period -----------------

def _lp_best_period(sch: Scheduler) -> float:
    """min T over in-flight vectors k that fit the memory, each by an LP over (T, f, b).

    Constraints: rules 2-4, link and device load <= T, and for each stage
    window <= k T and (start of backward - end of forward) >= (k-1) T, which is
    exactly rule 5 for a stage alone on its device with k = ceil(window / T).
    """
    S = sch.stage_count
    F, B, c = sch.F, sch.B, sch.c
    costs = [sch.chain.stage_costs(a, b) for a, b in sch.runs]
    A, W = [x.saved for x in costs], [x.weights for x in costs]
    plat = sch.platform
    t0 = sch.load_period
    total = sch.max_window
    kmax = [math.ceil(total / t0) + (S - s) for s in range(S)]
    best = math.inf
    n = 1 + 2 * S  # T, f_0..f_{S-1}, b_0..b_{S-1}
    iT, fi, bi = 0, (lambda s: 1 + s), (lambda s: 1 + S + s)
    for ks in itertools.product(*[range(1, km + 1) for km in kmax]):
        mem = [0.0] * plat.devices
        for s, k in enumerate(ks):
            mem[sch.dev[s]] += paper_stage_memory(plat, A[s], W[s], k)
        if any(m > plat.memory * (1 + 1e-9) for m in mem):
            continue
        rows, rhs = [], []

        def le(coefs: dict[int, float], bound: float) -> None:
            r = np.zeros(n)
            for j, v in coefs.items():
                r[j] += v
            rows.append(r)
            rhs.append(bound)

        for s in range(S - 1):
            le({fi(s): 1, fi(s + 1): -1}, -(F[s] + c[s]))
            le({bi(s + 1): 1, bi(s): -1}, -(B[s + 1] + c[s]))
        le({fi(S - 1): 1, bi(S - 1): -1}, -F[S - 1])
        for s, k in enumerate(ks):
            le({bi(s): 1, fi(s): -1, iT: -k}, -B[s])
            le({iT: k - 1, bi(s): -1, fi(s): 1}, -F[s])
        eq = np.zeros((1, n))
        eq[0, fi(0)] = 1
        bounds = [(t0, None)] + [(None, None)] * (2 * S)
        res = linprog(np.eye(n)[0], A_ub=np.array(rows), b_ub=np.array(rhs), A_eq=eq, b_eq=[0.0],
                      bounds=bounds, method="highs")
        if res.status == 0:
            best = min(best, res.x[0])
    return best


@pytest.mark.parametrize("seed", range(40))
def test_best_period_matches_lp_brute_force_on_contiguous(seed):
    rng = random.Random(seed)
    L, P = rng.randint(2, 6), rng.randint(2, 4)
    chain = py_chain(rng, L)
    assign = py_contiguous(rng, L, P)
    bw = rng.choice([math.inf, 5.0, 10.0])
    plat0 = Target.of(P, bandwidth=bw, weights=rng.choice(["stash", "single"]), weight_factor=rng.choice([1, 2]),
                     memory_model="paper")
    least = max(one_in_flight_memory(chain, plat0, assign))
    # the memory of the schedule at the smallest period, then a limit in between
    at_t0 = max(build_schedule(chain, plat0, assign, load_period(chain, plat0, assign)).memory)
    limit = least + rng.uniform(0.0, 1.0) * (at_t0 - least)
    plat = plat0.with_(memory=limit)
    plan = best_schedule(chain, plat, assign, method="test")
    assert plan.feasible and plan.fits
    assert check(plan, chain, plat) == []
    expect = _lp_best_period(Scheduler(chain, plat, assign))
    assert plan.period == pytest.approx(expect, rel=1e-6)
    # just below the best period nothing built fits
    if plan.period > load_period(chain, plat, assign) * (1 + 1e-4):
        below = build_schedule(chain, plat, assign, plan.period * (1 - 1e-4))
        assert not below.fits


@pytest.mark.parametrize("seed", range(30))
def test_contiguous_builder_gives_valid_plans_and_least_windows(seed):
    rng = random.Random(100 + seed)
    L, P = rng.randint(1, 8), rng.randint(1, 5)
    chain = py_chain(rng, L)
    assign = py_contiguous(rng, L, P)
    plat = Target.of(P, bandwidth=rng.choice([math.inf, 3.0, 20.0]), latency=rng.choice([0.0, 0.1]),
                    memory_model="paper")
    sch = Scheduler(chain, plat, assign)
    T = sch.load_period * rng.uniform(1.0, 3.0)
    plan = build_schedule(chain, plat, assign, T)
    assert check(plan, chain, plat) == [], check(plan, chain, plat)
    assert plan.allocation == "contiguous"
    # the list scheduler (general path) reproduces the closed-form construction
    f, b = sch._general(T, "asap")
    assert np.allclose(f, [s.fwd_start for s in plan.stages])
    assert np.allclose(b, [s.bwd_start for s in plan.stages])
    # no window is below its raw (dependency-only) length, and each is the least admissible one:
    # w in [ (k-1)T + F + B, kT ]
    for s, st in enumerate(plan.stages):
        w = st.bwd_start + sch.B[s] - st.fwd_start
        k = st.in_flight
        assert w <= k * T * (1 + 1e-9)
        assert w >= (k - 1) * T + sch.F[s] + sch.B[s] - 1e-9 * T


@pytest.mark.parametrize("seed", range(30))
def test_general_builder_gives_valid_plans(seed):
    rng = random.Random(200 + seed)
    L, P = rng.randint(2, 9), rng.randint(1, 4)
    chain = py_chain(rng, L)
    assign = py_general(rng, L, P)
    plat = Target.of(P, bandwidth=rng.choice([math.inf, 4.0, 30.0]), memory_model="paper")
    T0 = load_period(chain, plat, assign)
    for T in (T0, T0 * rng.uniform(1.0, 2.5)):
        # packed never fails while loads fit
        plan = build_schedule(chain, plat, assign, T, mode="packed")
        assert check(plan, chain, plat) == []
        for mode in ("asap", "auto"):
            try:
                plan = build_schedule(chain, plat, assign, T, mode=mode)
            except NoSchedule as e:
                assert mode == "asap" and "fragmented" in str(e)
                continue
            assert check(plan, chain, plat) == [], (mode, check(plan, chain, plat))
    assert build_schedule(chain, plat, assign,
                          T0).allocation == ("contiguous" if len(stages_of(assign)) == len(set(assign)) else "general")


@pytest.mark.parametrize("seed", range(15))
def test_best_schedule_on_general_allocations_fits_and_is_valid(seed):
    rng = random.Random(300 + seed)
    L, P = rng.randint(3, 8), rng.randint(2, 3)
    chain = py_chain(rng, L)
    assign = py_general(rng, L, P)
    plat0 = Target.of(P, bandwidth=10.0, memory_model="paper")
    least = max(one_in_flight_memory(chain, plat0, assign))
    plat = plat0.with_(memory=least * rng.uniform(1.0, 1.5))
    plan = best_schedule(chain, plat, assign)
    assert plan.feasible and plan.fits
    assert check(plan, chain, plat) == []
    assert plan.period >= load_period(chain, plat, assign) * (1 - 1e-9)


def test_no_schedule_when_a_device_or_link_is_overloaded():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 1, 10) for i in range(4)))
    plat = Target.of(2, bandwidth=2.0, memory_model="paper")  # c = 5 s per boundary; one layer: F + B = 3 s
    with pytest.raises(NoSchedule, match=r"device 0 load 6.000 s exceeds the period 5.500 s"):
        build_schedule(chain, Target.of(2, memory_model="paper"), [0, 0, 1, 1], 5.5)
    with pytest.raises(NoSchedule, match=r"link 0->1 load 5.000 s exceeds the period 4.500 s"):
        build_schedule(chain, plat.with_(devices=4), [0, 1, 2, 3], 4.5)
    with pytest.raises(ValueError, match="device 7"):
        build_schedule(chain, plat, [0, 7, 1, 1], 10.0)
    with pytest.raises(NoSchedule, match="positive"):
        build_schedule(chain, plat, [0, 0, 1, 1], 0.0)
    # a general allocation loads the link with every boundary: 0->1 three times
    assert load_period(chain, plat, [0, 1, 0, 1]) == pytest.approx(15.0)


def test_best_schedule_infeasible_says_why():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)), input_bytes=10)
    plat = Target.of(2, memory=150, memory_model="paper")
    plan = best_schedule(chain, plat, [0, 0, 1, 1], method="m")
    assert not plan.feasible and plan.status == "infeasible" and plan.method == "m"
    assert "device 0 needs at least 220 B" in plan.notes[0] and "limit 150 B" in plan.notes[0]


def test_best_schedule_unlimited_memory_reaches_the_load_bound():
    rng = random.Random(7)
    chain = py_chain(rng, 8)
    plat = Target.of(3, bandwidth=50.0, memory_model="paper")
    for assign in ([0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 2, 0, 1, 2, 0, 1]):
        plan = best_schedule(chain, plat, assign)
        assert plan.period == pytest.approx(load_period(chain, plat, assign))
        assert check(plan, chain, plat) == []


def test_memory_decreases_with_the_period_on_contiguous():
    rng = random.Random(11)
    chain = py_chain(rng, 8)
    plat = Target.of(4, bandwidth=5.0, memory_model="paper")
    assign = [0, 0, 1, 1, 2, 2, 3, 3]
    sch = Scheduler(chain, plat, assign)
    prev = None
    for T in np.linspace(sch.load_period, sch.max_window * 1.01, 200):
        mem = sch.memory(T)
        if prev is not None:
            assert all(m <= p + 1e-9 for m, p in zip(mem, prev))
        prev = mem
    assert prev == pytest.approx(sch.one_in_flight_memory)
