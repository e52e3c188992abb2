"""Tests for workbench.experiments.sweeps: what each unit of the experiments computes."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from workbench.experiments.settings import platform_for, settings_for
from workbench.experiments.sweeps import compute_unit
from workbench.experiments.units import Unit, plan_units
from workbench.planners import plan as run_planner
from workbench.profiles import load_profile

QUICK = settings_for(quick=True, networks=("resnet50",), devices=(2,), methods=("dp",))


def one_unit(figure: str) -> Unit:
    (unit,) = plan_units(QUICK, figures=(figure,))
    return unit


def splits_into_triples(numbers: list[int], bound: int) -> bool:
    """3-partition by brute force: can the numbers be grouped in threes, each summing to ``bound``?"""
    if not numbers:
        return True
    first, rest = numbers[0], numbers[1:]
    for i, j in itertools.combinations(range(len(rest)), 2):
        if first + rest[i] + rest[j] == bound:
            if splits_into_triples([x for k, x in enumerate(rest) if k not in (i, j)], bound):
                return True
    return False


def test_sweep_unit_rows_over_the_memory_levels():
    unit = one_unit("throughput")
    df = compute_unit(unit)
    levels = unit.settings["memory_levels"]
    assert df.level.tolist() == list(range(len(levels))) and df.memory_limit.tolist() == levels
    assert df.memory_relative.tolist() == pytest.approx([m / levels[0] for m in levels])
    assert (df.peak_memory <= df.memory_limit * (1 + 1e-9)).all() and df.fits.all()
    assert df.period.is_monotonic_decreasing                 # more memory: never a slower plan
    chain = load_profile("resnet50")
    free = run_planner(chain, platform_for(QUICK, 2), "dp")   # no memory limit: the top level is dp's own peak
    assert df.period.iloc[-1] == pytest.approx(free.period)


def test_sweep_unit_refuses_a_profile_that_changed():
    unit = one_unit("throughput")
    st = dict(unit.settings, profile={**unit.settings["profile"], "sha256": "0" * 64})
    with pytest.raises(ValueError, match="^resnet50: the profile file changed while the run was going on; run again$"):
        compute_unit(dataclasses.replace(unit, settings=st))


def test_three_partition_answers_agree_with_brute_force():
    df = compute_unit(one_unit("three_partition"))
    assert len(df) and set(df.generated_as) == {"yes", "no"}
    for _, row in df.iterrows():
        truth = splits_into_triples([int(x) for x in row.numbers.split()], int(row.bound))
        assert truth == row.exhaustive_yes == (row.generated_as == "yes")
        assert row.status == "optimal" and row.planner_says_yes == truth


def test_family_general_beats_contiguous_by_the_predicted_factor():
    df = compute_unit(one_unit("family"))
    for k, g in df.groupby("k"):
        contiguous = g[g.allocation == "contiguous"].period
        general = g[g.allocation == "general"].period
        assert len(contiguous) and len(general)
        assert contiguous.min() / general.max() == pytest.approx(g.predicted_factor.iloc[0])


def test_unknown_kind():
    with pytest.raises(ValueError, match="^unknown unit kind 'bogus'$"):
        compute_unit(Unit("x", "bogus", {}))
