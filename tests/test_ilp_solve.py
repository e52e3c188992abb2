"""Tests for workbench.planners.ilp.solve: solve, polish and read back a plan model."""

from __future__ import annotations

import pyomo.environ as pyo
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.budget import Budget
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.solve import MilpProgress, plan_from_model, polish, solve_model
from workbench.verify.check import check


def test_solve_polish_and_read_back_the_dp_optimum():
    chain = Chain(tuple(Layer(f"l{i}", 1.0 + i % 2, 2.0, 40, 10) for i in range(6)))
    plat = Target.of(3, memory=160, memory_model="paper")
    m = build_model(chain, plat)
    log: list[str] = []
    res = solve_model(m, log=log.append)
    assert str(res.termination_condition).endswith("convergenceCriteriaSatisfied") and log
    assert polish(m)
    p = plan_from_model(m, chain, plat)
    assert p.period == pytest.approx(plan_dp(chain, plat).period, rel=1e-6) and check(p, chain, plat) == []
    assert pyo.value(m.u) == pytest.approx(m._ilp.t_ref / p.period, rel=1e-6)


def test_progress_lines_from_the_solver_log():
    lines: list[str] = []
    budget = Budget(progress=lines.append)
    sink = MilpProgress(budget, t_ref=2.0, every=0.0)
    sink.write("        12     3      1   50.00%   0.5   0.25   100.00%        0      0      0        10     0.2s\n")
    assert lines == ["ilp: MILP: 12 nodes, best period 8 s, bound 4 s, gap 100.00%"]
