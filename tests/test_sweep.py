"""The one sweep helper (workbench.planners.sweep): robust solves, levels smallest first, warm starts, rows."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import PLANNERS, plan
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.sweep import UNAVAILABLE, Failure, attempt, plan_row, run_method, solve, sweep


def chain4() -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1.0 + i, 2.0, 100, 10) for i in range(4)), input_bytes=10)


def test_unknown_missing_and_failing_methods_are_recorded_not_raised(monkeypatch):
    ch, plat = chain4(), Target.of(2, memory_model="paper")
    row = run_method(ch, plat, "nosuch")
    assert row["status"] == UNAVAILABLE and not row["fits"] and math.isnan(row["period"])
    assert "unknown method 'nosuch'" in row["note"]
    def broken(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'highspy'")

    monkeypatch.setitem(PLANNERS, "ilp", broken)
    row = run_method(ch, plat, "ilp")
    assert row["status"] == "error" and "ModuleNotFoundError" in row["note"]   # a broken install: an error
    row = run_method(ch, plat, "brute", max_layers=1)  # brute refuses: recorded as an error
    assert row["status"] == "error" and "max_layers" in row["note"]
    assert isinstance(attempt(ch, plat, "brute", max_layers=1), Failure)
    with pytest.raises(ValueError, match="max_layers"):
        solve(ch, plat, "brute", max_layers=1)


def test_sweep_sorts_the_levels_and_equals_one_plan_per_level():
    ch, plat = chain4(), Target.of(2, memory_model="paper")
    levels = [10_000, "300B", 200.0, 1000]
    got = sweep(ch, plat, levels, "dp")
    assert [M for M, _ in got] == [200.0, 300.0, 1000.0, 10_000.0]
    for M, p in got:
        ref = plan(ch, plat.with_(memory=M), "dp")
        assert (p.status, p.period, p.assignment) == (ref.status, ref.period, ref.assignment)


def test_warm_start_goes_only_to_methods_that_take_one(monkeypatch):
    seen = []

    def fake(chain, platform, *, allocation="contiguous", time_limit=None, warm_start=None, **options):
        seen.append(warm_start)
        return plan_dp(chain, platform)

    monkeypatch.setitem(PLANNERS, "ilp", fake)
    monkeypatch.setitem(PLANNERS, "dp", fake)
    ch, plat = chain4(), Target.of(2, memory_model="paper")
    out = sweep(ch, plat, [200, 1000, 2000], "ilp", warm_start=True)
    assert seen[0] is True and seen[1] is True  # level 200 is infeasible: still no plan to start from
    assert seen[2] is out[1][1]  # level 2000 starts from level 1000's plan
    seen.clear()
    sweep(ch, plat, [1000], "dp", warm_start=True)  # dp takes no warm start
    assert seen == [None]


def test_plan_row_columns_agree_with_the_plan():
    ch, plat = chain4(), Target.of(2, memory=1000, memory_model="paper")
    p = plan(ch, plat, "dp")
    row = plan_row(p, ch, plat)
    assert row["period"] == p.period and row["throughput"] == pytest.approx(1 / p.period)
    assert row["ratio"] == pytest.approx(p.period / p.lower_bound)
    assert row["normalised_throughput"] == pytest.approx(p.lower_bound / p.period)
    assert [float(x) for x in row["memory_per_device"].split(";")] == pytest.approx(list(p.memory), rel=1e-5)
    assert row["timed_out"] is False and row["n_stages"] == len(p.stages)
    bad = plan_row(Failure("error", "x" * 500, 1.5), ch, plat)
    assert bad["status"] == "error" and len(bad["note"]) == 300 and bad["seconds"] == 1.5
    assert bad["throughput"] == 0.0 and np.isnan(bad["period"]) and set(bad) == set(row)
    assert row["may_vary"] is False and bad["may_vary"] is False
    flagged = dataclasses.replace(p, extra={**p.extra, "may_vary": True})    # the safety net stopped a phase
    assert plan_row(flagged, ch, plat)["may_vary"] is True                    # recorded whatever the note says
