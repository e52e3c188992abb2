"""Solving a plan model with HiGHS (through Pyomo) and reading its solution back.

:func:`solve_model` runs HiGHS on a model of :mod:`workbench.planners.ilp.model`
with the project's solver options; :func:`polish` fixes every integer variable
of a solution and re-solves the LP, which gives that integer structure's exact
best period; :func:`plan_from_model` rebuilds the solution as a
:class:`~workbench.model.plan.Plan` (its period re-derived by
:func:`workbench.model.plan.make_plan`). :class:`MilpProgress` turns HiGHS's
branch-and-bound log into progress lines.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.ilp.model import build_model
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> m = build_model(ch, Target.of(2, memory=10_000, memory_model="paper"))
>>> str(solve_model(m).termination_condition).split(".")[-1]
'convergenceCriteriaSatisfied'
>>> plan_from_model(m, ch, Target.of(2, memory=10_000, memory_model="paper")).period
6.0
"""

from __future__ import annotations

import io
import math
import re
import time
from typing import Any

import numpy as np
import pyomo.environ as pyo
from pyomo.contrib.solver.common.factory import SolverFactory

from workbench.model.chain import Chain
from workbench.model.plan import Plan, make_plan, stages_of
from workbench.model.target import Target
from workbench.model.tolerances import MILP_GAP, SOLVER_FEASIBILITY
from workbench.planners.budget import POLISH_SECONDS, Budget

__all__ = ["DEFAULT_SOLVER_OPTIONS", "solve_model", "polish", "plan_from_model", "MilpProgress"]

#: HiGHS options every solve uses: presolve rule 8192 (parallel rows and columns) off (HiGHS presolve
#: otherwise sometimes misjudges models of this kind), tight integrality.
DEFAULT_SOLVER_OPTIONS: dict[str, Any] = {
    "presolve_rule_off": 8192,
    "mip_feasibility_tolerance": SOLVER_FEASIBILITY,
}


class _Log(io.TextIOBase):
    """Adapts any object with ``write()`` (a notebook's sys.stdout, a list's append...)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def write(self, s: str) -> int:
        if hasattr(self.sink, "write"):
            self.sink.write(s)
        else:
            self.sink(s)
        return len(s)

    def flush(self) -> None:
        fl = getattr(self.sink, "flush", None)
        if fl:
            fl()


def _solver():
    return SolverFactory("highs")


def solve_model(model: pyo.ConcreteModel, *, time_limit: float | None = None, rel_gap: float = MILP_GAP,
                threads: int | None = 1, log: Any = None, solver_options: dict | None = None):
    """Solve ``model`` with HiGHS; load the incumbent if there is one. Returns pyomo's results."""
    opts = {**DEFAULT_SOLVER_OPTIONS, **(solver_options or {})}
    kw: dict[str, Any] = dict(raise_exception_on_nonoptimal_result=False, load_solutions=False,
                              solver_options=opts, rel_gap=rel_gap)
    if time_limit is not None:
        kw["time_limit"] = max(float(time_limit), 0.01)
    if threads is not None:
        kw["threads"] = int(threads)
    if log is not None:
        kw["tee"] = [_Log(log)]
    res = _solver().solve(model, **kw)
    if res.incumbent_objective is not None:
        try:
            res.solution_loader.load_vars()
        except Exception:  # noqa: BLE001 - no usable solution
            res.incumbent_objective = None
    return res


def _integer_vars(model: pyo.ConcreteModel):
    return [v for v in model.component_data_objects(pyo.Var, descend_into=True)
            if v.is_integer() and not v.fixed]


def _assignment(model: pyo.ConcreteModel) -> list[int]:
    d = model._ilp
    return [int(np.argmax([pyo.value(model.x[l, p]) for p in range(d.P)])) for l in range(d.L)]


def plan_from_model(model: pyo.ConcreteModel, chain: Chain, platform: Target, **kw: Any) -> Plan:
    """Read the loaded solution of ``model`` into a :class:`Plan` (period re-derived by make_plan)."""
    d = model._ilp
    T = d.t_ref / pyo.value(model.u)
    assignment = _assignment(model)
    runs = stages_of(assignment)
    fwd = [pyo.value(model.tf[a]) * T for a, _ in runs]
    bwd = [pyo.value(model.tb[b]) * T for _, b in runs]
    return make_plan(chain, platform, T, assignment, fwd, bwd, method="ilp", **kw)


def polish(model: pyo.ConcreteModel, *, threads: int | None = 1, time_limit: float = POLISH_SECONDS) -> bool:
    """Fix every integer variable at its (rounded) value and re-solve the LP: the best period
    of that integer structure. Returns whether the LP solved (values loaded); unfixes afterwards."""
    ints = _integer_vars(model)
    saved = [(v, v.value) for v in model.component_data_objects(pyo.Var) if v.value is not None]
    for v in ints:
        v.fix(round(v.value if v.value is not None else 0))
    ok = False
    try:
        res = solve_model(model, threads=threads, time_limit=time_limit)
        ok = res.incumbent_objective is not None
    finally:
        for v in ints:
            v.unfix()
        if not ok:
            for v, val in saved:
                v.set_value(val, skip_validation=True)
    return ok


class MilpProgress:
    """A HiGHS log sink that turns its branch-and-bound rows into a progress line every ``every`` s
    (periods, not HiGHS's scaled objective), and passes everything on to ``log``."""

    ROW = re.compile(r"^\s*\S?\s+(\d+)\s+\d+\s+\d+\s+[\d.]+%\s+(\S+)\s+(\S+)\s+(\S+)")

    def __init__(self, budget: Budget, t_ref: float, log: Any = None, every: float = 5.0) -> None:
        self.budget, self.t_ref, self.log, self.every = budget, t_ref, log, every
        self.last = time.perf_counter()
        self.buf = ""

    def write(self, text: str) -> None:
        if self.log is not None:
            (self.log.write if hasattr(self.log, "write") else self.log)(text)
        self.buf += text
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            m = self.ROW.match(line)
            if m and time.perf_counter() - self.last >= self.every:
                self.last = time.perf_counter()
                self.budget.say(f"ilp: MILP: {m.group(1)} nodes, best period {self._period(m.group(3))}, "
                                f"bound {self._period(m.group(2))}, gap {m.group(4)}")

    def _period(self, objective: str) -> str:
        try:
            u = float(objective)
        except ValueError:
            return "none yet"
        return f"{self.t_ref / u:.6g} s" if u > 0 and math.isfinite(u) else "none yet"

    def flush(self) -> None:
        fl = getattr(self.log, "flush", None)
        if fl:
            fl()
