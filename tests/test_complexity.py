"""Tests of workbench.experiments.complexity: generators, the 3-PARTITION reduction, the factor family, studies.

Optima are recomputed here by independent enumeration (compositions for
contiguous allocations, every layer -> device map for general ones).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from instances import compositions
from workbench.experiments.complexity import (
    family_factor,
    gain_distribution,
    general_beats_contiguous_family,
    is_three_partition_yes,
    least_contiguous_memory,
    memory_levels,
    random_chain,
    scaling_study,
    three_partition_instance,
    three_partition_no_instance,
    three_partition_yes_instance,
)
from workbench.model.target import Target
from workbench.planners import plan
from workbench.planners.sweep import UNAVAILABLE, run_method

TOL = 1e-6


# ---------------------------------------------------------------- independent oracles
def contiguous_load_optimum(compute, weights, P, M):
    """min over compositions with every interval's weight <= M of the max interval load."""
    best = math.inf
    for comp in compositions(len(compute), P):
        if all(sum(weights[a:b + 1]) <= M + 1e-9 for a, b in comp):
            best = min(best, max(sum(compute[a:b + 1]) for a, b in comp))
    return best


def general_load_optimum(compute, weights, P, M):
    """min over every map layer -> device with per-device weight <= M of the max device load (P||Cmax)."""
    best = math.inf
    for assign in itertools.product(range(P), repeat=len(compute)):
        load, w = [0.0] * P, [0.0] * P
        for x, d in enumerate(assign):
            load[d] += compute[x]
            w[d] += weights[x]
        if max(w) <= M + 1e-9:
            best = min(best, max(load))
    return best


def three_partition_by_groups(numbers, bound):
    """Yes iff some map number -> group (m groups) gives every group the sum B."""
    m = len(numbers) // 3
    for assign in itertools.product(range(m), repeat=len(numbers)):
        sums = [0] * m
        for x, g in zip(numbers, assign):
            sums[g] += x
        if all(s == bound for s in sums):
            return True
    return False


# ---------------------------------------------------------------- random chains
def test_random_chain_deterministic_and_valid():
    a = random_chain(7, heterogeneity=0.8, seed=5)
    assert a == random_chain(7, heterogeneity=0.8, seed=5)
    assert a != random_chain(7, heterogeneity=0.8, seed=6)
    assert len(a) == 7
    assert all(l.forward > 0 and l.backward == pytest.approx(2 * l.forward) for l in a.layers)


def test_random_chain_heterogeneity_controls_spread():
    flat = random_chain(50, heterogeneity=0.0, seed=0)
    assert np.ptp(flat.forward) == 0 and np.ptp(flat.weights) == 0
    for h in (0.3, 1.0):
        big = random_chain(4000, heterogeneity=h, seed=1)
        for arr in (big.forward, big.weights, np.array([l.activation_bytes for l in big.layers])):
            assert np.std(np.log(arr)) == pytest.approx(h, rel=0.08)
    with pytest.raises(ValueError):
        random_chain(0)
    with pytest.raises(ValueError):
        random_chain(3, heterogeneity=-1)


def test_random_chain_trend_shrinks_activations():
    c = random_chain(20, heterogeneity=0.0, trend=2.0, seed=0)
    acts = [l.activation_bytes for l in c.layers]
    assert acts[0] > acts[-1] and c.weights[0] < c.weights[-1]
    assert acts[0] / acts[-1] == pytest.approx(math.exp(2.0), rel=1e-3)


# ---------------------------------------------------------------- memory levels
@pytest.mark.parametrize("seed,P", [(0, 2), (1, 3), (2, 4)])
def test_least_contiguous_memory_matches_enumeration(seed, P):
    ch = random_chain(7, heterogeneity=1.0, seed=seed)
    plat = Target.of(P, weight_factor=2.0, memory_model="paper")
    foot = ch.saved_array + 2.0 * ch.weights
    expect = min(max(foot[a:b + 1].sum() for a, b in comp) for comp in compositions(len(ch), P))
    assert least_contiguous_memory(ch, plat) == pytest.approx(expect, rel=1e-12)


def test_memory_levels_span_least_feasible_to_unlimited():
    ch = random_chain(8, heterogeneity=0.7, seed=3)
    base = Target.of(3, bandwidth="12GB/s", memory_model="paper")
    lv = memory_levels(ch, base, 5)
    assert len(lv) == 5 and all(a < b for a, b in zip(lv, lv[1:]))
    low = plan(ch, base.with_(memory=lv[0]), "dp")
    assert low.fits
    below = plan(ch, base.with_(memory=least_contiguous_memory(ch, base) * 0.999), "dp")
    assert not below.fits
    free = plan(ch, base, "dp")
    top = plan(ch, base.with_(memory=lv[-1]), "dp")
    assert top.period == pytest.approx(free.period, rel=TOL)
    # tighter memory never helps the exact DP
    periods = [plan(ch, base.with_(memory=m), "dp").period for m in lv]
    assert all(p1 >= p2 * (1 - TOL) for p1, p2 in zip(periods, periods[1:]))


# ---------------------------------------------------------------- the factor family
@pytest.mark.parametrize("k", [1, 2, 3])
def test_family_factor_by_independent_enumeration(k):
    ch, plat = general_beats_contiguous_family(k)
    compute = list(ch.forward + ch.backward)
    weights = list(ch.weights)
    cont = contiguous_load_optimum(compute, weights, plat.devices, plat.memory)
    gen = general_load_optimum(compute, weights, plat.devices, plat.memory)
    assert cont == pytest.approx(k) and gen == pytest.approx(1.0)
    assert cont / gen == pytest.approx(family_factor(k)) == pytest.approx(k)


@pytest.mark.parametrize("k", [2, 3])
def test_family_factor_with_planners(k):
    ch, plat = general_beats_contiguous_family(k)
    dp = plan(ch, plat, "dp")
    bc = plan(ch, plat, "brute", allocation="contiguous")
    bg = plan(ch, plat, "brute", allocation="general")
    assert dp.status == bc.status == bg.status == "optimal"
    assert dp.period == pytest.approx(bc.period, rel=TOL) == pytest.approx(k)
    assert bg.period == pytest.approx(1.0, rel=TOL)
    assert dp.period / bg.period == pytest.approx(family_factor(k), rel=TOL)
    assert bg.fits and dp.fits


def test_family_factor_with_general_ilp():
    ch, plat = general_beats_contiguous_family(2)
    row = run_method(ch, plat, "ilp", allocation="general", time_limit=30)
    if row["status"] == UNAVAILABLE:
        pytest.skip("ilp unavailable")
    assert row["status"] == "optimal" and row["period"] == pytest.approx(1.0, rel=TOL)


# ---------------------------------------------------------------- 3-PARTITION
@pytest.mark.parametrize("seed", range(4))
def test_three_partition_generators_agree_with_group_enumeration(seed):
    yes = three_partition_yes_instance(2, 20, seed=seed)
    no = three_partition_no_instance(2, 20, seed=seed)
    for nums, expect in ((yes, True), (no, False)):
        assert len(nums) == 6 and sum(nums) == 40 and all(5 < x < 10 for x in nums)
        assert is_three_partition_yes(nums, 20) is expect
        assert three_partition_by_groups(nums, 20) is expect


def test_is_three_partition_yes_on_hand_instances():
    assert is_three_partition_yes([26, 27, 47, 30, 30, 40, 28, 32, 40], 100)  # 26+27+47, 30+30+40, 28+32+40
    assert is_three_partition_yes([26, 26, 26, 26, 48, 48], 100)  # 26+26+48 twice
    assert not is_three_partition_yes([26, 26, 26, 40, 40, 42], 100)  # 42 needs a pair of sum 58: none
    assert not three_partition_by_groups([26, 26, 26, 40, 40, 42], 100)
    with pytest.raises(ValueError):
        is_three_partition_yes([1, 2, 3, 4], 5)  # not 3m numbers
    with pytest.raises(ValueError):
        is_three_partition_yes([5, 5, 10, 6, 7, 7], 20)  # 5 is not > B/4, 10 not < B/2
    with pytest.raises(ValueError):
        three_partition_instance([6, 7, 8, 6, 7, 7], 20)  # sum 41 != 40


@pytest.mark.parametrize("seed", range(3))
def test_reduction_yes_iff_period_equals_bound_brute(seed):
    B = 20
    for nums, yes in ((three_partition_yes_instance(2, B, seed=seed), True),
                      (three_partition_no_instance(2, B, seed=seed), False)):
        ch, plat = three_partition_instance(nums, B)
        p = plan(ch, plat, "brute", allocation="general")
        assert p.status == "optimal"
        # independent: P||Cmax optimum of the numbers
        assert p.period == pytest.approx(general_load_optimum(nums, [0] * len(nums), plat.devices, math.inf), rel=TOL)
        if yes:
            assert p.period == pytest.approx(B, rel=TOL)
        else:
            assert p.period > B * (1 + TOL)


def test_reduction_with_general_ilp():
    B = 20
    for nums, yes in ((three_partition_yes_instance(2, B, seed=7), True),
                      (three_partition_no_instance(2, B, seed=7), False)):
        ch, plat = three_partition_instance(nums, B)
        row = run_method(ch, plat, "ilp", allocation="general", time_limit=30)
        if row["status"] == UNAVAILABLE:
            pytest.skip("ilp unavailable")
        assert row["status"] == "optimal"
        assert (abs(row["period"] - B) <= TOL * B) is yes


# ---------------------------------------------------------------- robust runs and studies
def test_scaling_study_small():
    df = scaling_study(layers=(4, 6), devices=(2, 8), time_limit=20)
    assert set(df["n_layers"]) == {4, 6} and set(df["devices"]) == {2}  # P=8 > L skipped
    assert len(df) == 2 * 3
    assert {"seconds", "timed_out", "status", "period", "method", "allocation"} <= set(df.columns)
    for _, g in df.groupby("n_layers"):
        dp = g[g.method == "dp"].iloc[0]
        assert dp["status"] == "optimal"
        for _, r in g[g.method == "ilp"].iterrows():
            if r["status"] == UNAVAILABLE:
                continue
            assert r["period"] >= dp["lower_bound"] * (1 - TOL)
            if r["status"] == "optimal":
                if r["allocation"] == "contiguous":
                    assert r["period"] == pytest.approx(dp["period"], rel=1e-5)
                else:
                    assert r["period"] <= dp["period"] * (1 + 1e-5)


def test_gain_distribution_small():
    df = gain_distribution(4, n_layers=5, devices=2, memory_positions=(0.0, 0.5))
    assert len(df) == 8
    both = df[(df.general_status == "optimal") & (df.dp_status == "optimal")]
    assert len(both) > 0
    assert (both.gain_general >= 1 - TOL).all()
    assert (both.general_period >= both.lower_bound * (1 - TOL)).all()
    fits = df[df.pipedream_fits & (df.dp_status == "optimal")]
    assert (fits.gain_dp_over_pipedream >= 1 - TOL).all()
    # independent check of one gain_general with brute contiguous
    r = df.iloc[0]
    ch = random_chain(5, heterogeneity=1.0, seed=int(r.seed))
    bc = plan(ch, Target.of(2, memory=r.memory_limit, bandwidth="12GB/s", memory_model="paper"), "brute")
    assert bc.period == pytest.approx(r.dp_period, rel=1e-5)
