"""``ilp``: the throughput-under-memory plan ILP, solved with HiGHS through Pyomo.

The model (scaled time, one MILP with the period as a variable) is in
:mod:`workbench.planners.ilp_model`; this module solves it:

1. quick infeasibility tests (a layer that alone does not fit; the least
   memory any plan needs);
2. an incumbent: the exact contiguous DP (:func:`workbench.planners.dp.plan_dp`);
   its period bounds the model (``T <= T_dp``, tighter big-M) and is returned
   when the solver finds nothing better;
3. general allocations: local search, then the exact cover search
   (:mod:`workbench.planners.ilp_cover`), which may already prove optimality;
4. the MILP, with a time limit, relative gap, threads and a solver log;
5. the integer solution is *polished*: every integer variable fixed, the LP
   maximises throughput, which gives that structure's exact best period;
   the plan is rebuilt with :func:`workbench.plan.make_plan` and re-checked
   with :func:`workbench.check.check`.

On a time-out the best plan known is returned with ``status="timeout"`` and
its proven ``gap`` = (T - T_bound) / T.

>>> from workbench.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> p = plan_ilp(ch, Platform(2, memory=10_000, memory_model="paper"))
>>> p.period, p.status
(6.0, 'optimal')
"""

from __future__ import annotations

import io
import math
import re
import time
from typing import Any, Sequence

import numpy as np
import pyomo.environ as pyo

from ..chain import Chain, Platform
from ..memory import layer_terms, linear_terms
from ..plan import REL_TOL, Plan, infeasible_plan, make_plan, stages_of
from .budget import Budget, milp_root_seconds
from .ilp_model import build_model, k_bounds

__all__ = ["build_model", "plan_ilp", "solve_model", "plan_from_model", "least_memory_bound",
           "sweep_memory", "DEFAULT_SOLVER_OPTIONS"]

#: HiGHS options every solve uses: presolve rule 8192 (parallel rows and columns) off (HiGHS presolve
#: otherwise sometimes misjudges models of this kind), tight integrality.
DEFAULT_SOLVER_OPTIONS: dict[str, Any] = {
    "presolve_rule_off": 8192,
    "mip_feasibility_tolerance": 1e-9,
}

COARSEN_ABOVE = 32  # layers; coarsen=None coarsens longer chains to this many blocks
POLISH_RESERVE = 1.0  # seconds of a time limit (at most 10 %) kept from the MILP for the polishing LP
MILP_MIN_SECONDS = 0.2  # with less left (wall-clock budgets), the MILP is skipped: the incumbent and its gap
GRAPH_AFTER_DP = 3.0  # graph mode needs about this many times the default order's DP (best_order + a DP)


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
    from pyomo.contrib.solver.common.factory import SolverFactory

    return SolverFactory("highs")


def solve_model(model: pyo.ConcreteModel, *, time_limit: float | None = None, rel_gap: float = 1e-6,
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


def plan_from_model(model: pyo.ConcreteModel, chain: Chain, platform: Platform, **kw: Any) -> Plan:
    """Read the loaded solution of ``model`` into a :class:`Plan` (period re-derived by make_plan)."""
    d = model._ilp
    T = d.t_ref / pyo.value(model.u)
    assignment = _assignment(model)
    runs = stages_of(assignment)
    fwd = [pyo.value(model.tf[a]) * T for a, _ in runs]
    bwd = [pyo.value(model.tb[b]) * T for _, b in runs]
    return make_plan(chain, platform, T, assignment, fwd, bwd, method="ilp", **kw)


def polish(model: pyo.ConcreteModel, *, threads: int | None = 1, time_limit: float = 30.0) -> bool:
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


def least_memory_bound(chain: Chain, platform: Platform) -> tuple[float, str]:
    """A lower bound on the memory per device any allocation needs (every k = 1), and why."""
    lin = linear_terms(layer_terms(chain, platform))
    foot = lin.a + lin.w0                      # each layer with one mini-batch in flight, no boundary terms
    big = int(np.argmax(foot))
    per_layer = float(foot[big])
    avg = float(foot.sum() / platform.devices)
    why = (f"layer {chain[big].name!r} alone needs {per_layer:.6g} bytes (one mini-batch in flight); "
           f"all layers together need {foot.sum():.6g} bytes, {avg:.6g} per device")
    return max(per_layer, avg), why


def _check(plan: Plan, chain: Chain, platform: Platform) -> list:
    try:
        from ..check import check
    except ImportError:  # pragma: no cover
        return []
    return check(plan, chain, platform)


def _incumbent(chain: Chain, platform: Platform, known: Plan | None = None) -> Plan | None:
    """The exact contiguous DP's plan (``known``: already computed) if the checker accepts it."""
    try:
        from .dp import plan_dp
    except ImportError:  # pragma: no cover
        return None
    p = known if known is not None else plan_dp(chain, platform, graph=False)
    if p.feasible and not _check(p, chain, platform):
        return p
    return None


def plan_ilp(chain: Chain, platform: Platform, *, allocation: str = "contiguous",
             time_limit: float | None = None, rel_gap: float = 1e-6, threads: int | None = 1,
             warm_start: bool | Plan = True, log: Any = None, coarsen: int | bool | None = None,
             pairwise: bool = True, tighten: bool = True, search_seconds: float = 10.0, solver_options: dict | None = None,
             cover: bool = True, cover_share: float = 0.85, progress: Any = None, deterministic: bool = False,
             budget: Budget | None = None, **options: Any) -> Plan:
    """Best periodic plan under the memory limit by the ILP (contiguous or general allocations).

    ``warm_start``: True uses the exact contiguous DP as incumbent (bound and fallback);
    a :class:`Plan` is used as given; False solves cold. ``log``: anything with ``write()``
    receives HiGHS's log. ``coarsen``: number of blocks to solve on (see
    :mod:`workbench.planners.coarsen`); None coarsens chains longer than
    ``COARSEN_ABOVE`` layers, False/0 never. ``search_seconds``: general mode improves the
    incumbent by local search (:mod:`workbench.planners.ilp_search`) for at most this long
    (and a quarter of the time limit). ``cover`` (default on): general mode then runs the exact
    cover search of :mod:`workbench.planners.ilp_cover` (an exact-cover master over device
    sets, every candidate allocation checked exactly) for ``cover_share`` of the time limit
    (all of it without one); it raises the bound, improves the incumbent and often proves it
    optimal, in which case the MILP is skipped. ``cover=False``: the MILP alone.
    ``graph`` (default True): on a chain linearised from a DAG, solve in the layer order
    that ``dp``'s graph mode chose and record it as ``chain_order``. Other options are ignored.

    ``time_limit`` covers the whole call, every phase included: it returns by about
    ``time_limit`` (HiGHS and the DP phases overrun by a fraction of a second). ``progress``:
    a callable receiving a line per phase. ``deterministic``: work budgets instead of wall-clock
    ones (see :mod:`workbench.planners.budget`): the same plan on every run; then the time
    limit is a guide and the wall clock a safety net at 3 times it.
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    if options.get("activations") == "auto":   # per-layer activation policies: workbench.planners.ilp_auto
        from .ilp_auto import plan_ilp_auto

        return plan_ilp_auto(chain, platform, allocation=allocation, time_limit=time_limit, rel_gap=rel_gap,
                             threads=threads, log=log, solver_options=solver_options)
    budget = budget or Budget(time_limit, deterministic=deterministic, progress=progress)
    t_start = time.perf_counter()
    common = dict(allocation=allocation, rel_gap=rel_gap, threads=threads, warm_start=warm_start, log=log,
                  coarsen=coarsen, pairwise=pairwise, tighten=tighten, search_seconds=search_seconds,
                  solver_options=solver_options, cover=cover, cover_share=cover_share, budget=budget)
    fine_dp: Plan | None = options.pop("fine_dp", None)
    if chain.graph is not None and options.pop("graph", True):
        # A chain linearised from a DAG: plan in the layer order dp's graph mode chose (its cut
        # sets are the best found), so dp on another order never beats the ILP.
        from ..plan import chain_for_plan

        ref, skipped = _graph_order(chain, platform, budget)
        if ref.chain_order is None:
            res = plan_ilp(chain, platform, graph=False, fine_dp=ref, **common, **options)
            return res.with_(notes=res.notes + ((skipped,) if skipped else ()))
        res = plan_ilp(chain_for_plan(ref, chain), platform, graph=False, fine_dp=ref.with_(chain_order=None),
                       **common, **options)
        notes = res.notes + ("layer order from dp's graph mode (best_order)",)
        return res.with_(chain_order=ref.chain_order, notes=notes, solve_seconds=time.perf_counter() - t_start)
    L = len(chain)
    if coarsen is None:
        coarsen = COARSEN_ABOVE if L > COARSEN_ABOVE else 0
    if coarsen and int(coarsen) < L:
        from .coarsen import plan_coarse

        return plan_coarse(chain, platform, blocks=int(coarsen), allocation=allocation, rel_gap=rel_gap,
                           threads=threads, log=log, warm_start=bool(warm_start), pairwise=pairwise,
                           solver_options=solver_options, budget=budget, fine_dp=fine_dp)
    need, why = least_memory_bound(chain, platform)
    if need > platform.memory * (1 + REL_TOL):
        return infeasible_plan(chain, platform, "ilp", f"no plan fits in memory: {why}, above the limit",
                               allocation=allocation, solve_seconds=budget.elapsed(),
                               extra={"least_memory_bound": need})
    inc = _warm_incumbent(chain, platform, warm_start, fine_dp)
    from .stage_bound import stage_path_bound

    lb = stage_path_bound(chain, platform, inc.period if inc is not None else None)
    notes: list[str] = []
    if inc is not None:
        budget.say(f"ilp: incumbent {inc.method} ({inc.allocation}) period {inc.period:.6g} s; bound {lb:.6g} s")
    if allocation == "general" and inc is not None and search_seconds and platform.devices > 1:
        inc = _local_search(chain, platform, inc, budget, search_seconds, notes)
    if inc is not None and inc.period <= lb * (1 + rel_gap):
        notes.append(f"incumbent {inc.method} ({inc.allocation}) period {inc.period:.6g} s")
        return _finish(inc, chain, platform, "optimal", 0.0, budget, allocation,
                       notes + ["incumbent meets the lower bound"])
    if allocation == "general" and cover and inc is not None and platform.devices > 1:
        inc, lb, proof = _cover(chain, platform, inc, lb, budget, cover_share, rel_gap, notes)
        if proof:
            return _finish(inc, chain, platform, "optimal", 0.0, budget, allocation, notes + [proof])
    if inc is not None:
        notes.append(f"incumbent {inc.method} ({inc.allocation}) period {inc.period:.6g} s")
    return _milp(chain, platform, inc, lb, need, why, budget, notes, allocation=allocation, rel_gap=rel_gap,
                 threads=threads, log=log, pairwise=pairwise, tighten=tighten, solver_options=solver_options)


def _graph_order(chain: Chain, platform: Platform, budget: Budget) -> tuple[Plan, str]:
    """dp's plan in the best layer order of ``chain.graph`` (graph mode), and a note if the order
    search was skipped: with a time limit (not deterministic), when after the DP in the default
    order less than ``GRAPH_AFTER_DP`` times its time (plus a second) is left."""
    from .dp import plan_dp

    if budget.limited and not budget.deterministic:
        budget.say(f"ilp: the exact contiguous DP on the {len(chain)} layers in their default order")
        t0 = time.perf_counter()
        base = plan_dp(chain, platform, graph=False)
        took = time.perf_counter() - t0
        if budget.left() < GRAPH_AFTER_DP * took + 1.0:
            why = (f"layer order search (dp graph mode) skipped: {budget.left():.1f} s left after "
                   f"{took:.1f} s of DP")
            budget.say(f"ilp: {why}")
            return base, why
    budget.say(f"ilp: choosing the layer order of the {len(chain)}-node graph (dp, graph mode)")
    return plan_dp(chain, platform, graph=True), ""


def _warm_incumbent(chain: Chain, platform: Platform, warm_start: bool | Plan,
                    fine_dp: Plan | None = None) -> Plan | None:
    """The incumbent to start from: the DP's plan, or a given plan if it is valid and better."""
    if isinstance(warm_start, Plan):
        given = warm_start.with_(memory_limit=platform.memory)
        inc = given if (given.feasible and len(given.assignment) == len(chain)
                        and not _check(given, chain, platform)) else None
        dp = _incumbent(chain, platform, fine_dp)
        if dp is not None and (inc is None or dp.period < inc.period):
            inc = dp
        return inc
    return _incumbent(chain, platform, fine_dp) if warm_start else None


def _local_search(chain: Chain, platform: Platform, inc: Plan, budget: Budget, search_seconds: float,
                  notes: list[str]) -> Plan:
    """General mode: improve the incumbent by local search (a quarter of what is left at most)."""
    from .ilp_search import local_search

    secs = min(search_seconds, budget.phase_seconds(0.25, default=search_seconds) or 0.0)
    budget.say(f"ilp: local search from the incumbent, {budget.describe(secs)}")
    deadline = budget.deadline(0.25, "local_search", default=search_seconds, cap=search_seconds)
    better = local_search(chain, platform, inc, seconds=search_seconds, deadline=deadline)
    if better is not inc and better.period < inc.period and not _check(better, chain, platform):
        notes.append(f"local search improved the incumbent from {inc.period:.6g} s to {better.period:.6g} s")
        budget.say(f"ilp: local search: period {inc.period:.6g} s -> {better.period:.6g} s")
        return better
    return inc


def _cover(chain: Chain, platform: Platform, inc: Plan, lb: float, budget: Budget, cover_share: float,
           rel_gap: float, notes: list[str]) -> tuple[Plan, float, str | None]:
    """General mode: the exact cover search. Returns (incumbent, bound, why it is optimal or None)."""
    from .ilp_cover import TooManySets, cover_search

    budget.say(f"ilp: cover search, {budget.describe(budget.phase_seconds(cover_share))}")
    deadline = budget.deadline(cover_share, "cover")

    def report(bound: float, period: float) -> None:
        budget.say(f"ilp: cover search: period {period:.6g} s, bound {bound:.6g} s")

    try:
        cr = cover_search(chain, platform, inc.period, deadline=deadline, progress=report if budget.progress else None)
    except TooManySets as e:
        notes.append(f"cover search skipped: {e}")
        budget.say(f"ilp: cover search skipped: {e}")
        return inc, lb, None
    notes.append(f"cover search: {cr.status} after {cr.evaluated} allocations of {cr.sets} device sets "
                 f"({cr.seconds:.2f} s); bound {cr.bound:.6g} s")
    if cr.assignment is not None:
        cand = make_plan(chain, platform, cr.period, list(cr.assignment), cr.fwd, cr.bwd, method="cover")
        bad = _check(cand, chain, platform)
        if cand.feasible and not bad:
            notes.append(f"cover search improved the incumbent from {inc.period:.6g} s to {cand.period:.6g} s")
            inc = cand
        else:  # pragma: no cover - the evaluator is exact; never trust it blindly
            notes.append(f"cover search plan rejected by the checker: {bad[0] if bad else 'infeasible'}")
            cr.status = "timeout"
    lb = max(lb, cr.bound)  # cr.bound <= every period the search started from or found
    searched = cr.status == "optimal" and inc.period <= cr.period * (1 + 1e-9)
    if searched or inc.period <= lb * (1 + rel_gap):
        why = "the cover search proves" if searched else "the cover bound proves"
        return inc, lb, f"{why} the incumbent optimal"
    return inc, lb, None


class _MilpProgress:
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


def _milp(chain: Chain, platform: Platform, inc: Plan | None, lb: float, need: float, why: str, budget: Budget,
          notes: list[str], *, allocation: str, rel_gap: float, threads: int | None, log: Any, pairwise: bool,
          tighten: bool, solver_options: dict | None) -> Plan:
    """Build and solve the MILP (bounded by the incumbent), polish and re-check its solution; with
    too little time left, the incumbent and its gap to ``lb``."""
    if budget.limited and not budget.deterministic and budget.left() < MILP_MIN_SECONDS:
        return _skip_milp(chain, platform, inc, lb, budget, notes, allocation, rel_gap,
                          f"MILP skipped: {budget.left():.2f} s of the time limit left")
    hi = inc.period * (1 + 1e-7) if inc is not None else None
    model = build_model(chain, platform, allocation=allocation, period_bounds=(lb, hi) if hi else None,
                        pairwise=pairwise, tighten=tighten)
    build_s = budget.elapsed()
    reserve = min(POLISH_RESERVE, 0.1 * (budget.seconds or 0.0))
    rows = sum(1 for _ in model.component_data_objects(pyo.Constraint, active=True))
    limits = budget.milp_limits(reserve=reserve, root_seconds=milp_root_seconds(rows))
    if limits is None:   # deterministic: the share left cannot pay for the root node
        return _skip_milp(chain, platform, inc, lb, budget, notes, allocation, rel_gap,
                          f"MILP skipped: its share of the work is below its root node's estimate ({rows} rows)")
    if budget.limited:
        limits["time_limit"] = max(float(limits["time_limit"]), 0.05)
    budget.say(f"ilp: MILP (HiGHS) on {len(chain)} layers x {platform.devices} devices, "
               f"{budget.describe(budget.phase_seconds(reserve=reserve))}")
    opts = {**(solver_options or {}), **{k: v for k, v in limits.items() if k != "time_limit"}}
    sink = _MilpProgress(budget, model._ilp.t_ref, log) if (budget.progress or log is not None) else None
    res = solve_model(model, time_limit=limits.get("time_limit"), rel_gap=rel_gap, threads=threads, log=sink,
                      solver_options=opts)
    tc = str(res.termination_condition).split(".")[-1]
    if budget.deterministic:
        budget.spend_nodes(int(getattr(res.extra_info, "mip_node_count", 0) or 0))
        if tc == "maxTimeLimit":
            budget.note_cut_short()
    d = model._ilp
    bound_T = lb
    if res.objective_bound is not None and math.isfinite(res.objective_bound) and res.objective_bound > 0:
        bound_T = max(lb, d.t_ref / res.objective_bound)
    found: Plan | None = None
    if res.incumbent_objective is not None:
        polish(model, threads=threads, time_limit=max(0.05, budget.left()) if budget.limited else 30.0)
        cand = plan_from_model(model, chain, platform, allocation=allocation)
        bad = _check(cand, chain, platform)
        if bad:
            notes.append(f"ILP solution rejected by the checker: {bad[0]}")
        else:
            found = cand
    best = found
    if inc is not None and (best is None or inc.period < best.period * (1 - 1e-9)):
        best = inc
    proven = tc in ("convergenceCriteriaSatisfied", "provenInfeasible", "infeasibleOrUnbounded")
    if best is None:
        if proven:
            return infeasible_plan(chain, platform, "ilp",
                                   f"the ILP proves no {allocation} plan fits in memory "
                                   f"(a bound on the least memory needed: {need:.6g} bytes; {why})",
                                   allocation=allocation, solve_seconds=budget.elapsed(),
                                   extra={"least_memory_bound": need, "termination": tc})
        p = infeasible_plan(chain, platform, "ilp", f"no plan found within the time limit ({tc})",
                            allocation=allocation, solve_seconds=budget.elapsed(), extra={"termination": tc})
        return p.with_(status="timeout")
    if proven:
        # infeasible with the incumbent bound => the incumbent is optimal
        status, gap = "optimal", max(0.0, (best.period - bound_T) / best.period) if tc == "convergenceCriteriaSatisfied" else 0.0
    else:
        status, gap = "timeout", max(0.0, (best.period - bound_T) / best.period)
        if gap <= rel_gap:  # the bound met the plan before the time ran out: proven all the same
            status = "optimal"
    # contiguous: the dp incumbent is exact, so a plan no better than it is optimal whatever the MILP's bound
    dp_proves = (allocation == "contiguous" and inc is not None and inc.method == "dp"
                 and best.period >= inc.period * (1 - 1e-9))
    if status == "optimal" and getattr(model, "_ilp_excess_bounded", False) and math.isfinite(platform.memory) \
            and best.period > lb * (1 + rel_gap) and not dp_proves:
        # the MILP bounds each device's transient from above: its proof holds for that bound only
        status = "feasible"
        notes.append("optimal for the MILP's bound on each device's transient memory (workbench.memory."
                     "linear_terms), not proven for the exact memory model")
    notes.append(f"HiGHS: {tc}; period bound {bound_T:.6g} s; model ready {build_s:.2f} s into the solve")
    return _finish(best, chain, platform, status, gap, budget, allocation, notes, termination=tc)


def _skip_milp(chain: Chain, platform: Platform, inc: Plan | None, lb: float, budget: Budget, notes: list[str],
               allocation: str, rel_gap: float, why: str) -> Plan:
    """The result without the MILP: the incumbent and its gap to ``lb`` (a time-out without one)."""
    budget.say(f"ilp: {why}")
    if inc is None:
        return infeasible_plan(chain, platform, "ilp", f"no plan found ({why})", allocation=allocation,
                               solve_seconds=budget.elapsed()).with_(status="timeout")
    gap = max(0.0, (inc.period - lb) / inc.period)
    notes.append(f"{why}; gap against the bound {lb:.6g} s")
    return _finish(inc, chain, platform, "optimal" if gap <= rel_gap else "timeout", gap, budget, allocation, notes)


def _finish(plan: Plan, chain: Chain, platform: Platform, status: str, gap: float, budget: Budget,
            allocation: str, notes: Sequence[str], **extra: Any) -> Plan:
    notes = list(notes)
    if budget.deterministic:
        extra["deterministic"] = not budget.cut_short
        if budget.cut_short:
            notes.append("deterministic budgets: the wall-clock safety net stopped a phase; this result may vary")
    budget.say(f"ilp: {status}, period {plan.period:.6g} s" + (f", gap {gap:.1%}" if gap else "")
               + f" ({budget.elapsed():.1f} s)")
    return plan.with_(method="ilp", allocation=allocation, status=status, gap=gap, solve_seconds=budget.elapsed(),
                      memory_limit=platform.memory,
                      notes=tuple(plan.notes) + tuple(notes), extra={**plan.extra, **extra})


def sweep_memory(chain: Chain, platform: Platform, memories: Sequence[float | str], *,
                 methods: Sequence[str] = ("ilp",), allocation: str = "contiguous",
                 time_limit: float | None = None, **options: Any):
    """Throughput against the memory limit: one solve per (memory level, method), as a DataFrame.

    Columns: memory, method, allocation, status, period, throughput, gap, solve_seconds,
    peak_memory. Levels are solved from the smallest up; the ILP re-uses the plan of the
    previous level as a warm start (a plan that fits a smaller limit fits a larger one).

    >>> from workbench.chain import Chain, Layer, Platform
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)), input_bytes=10)
    >>> df = sweep_memory(ch, Platform(2, memory_model="paper"), [200, 1000, 10_000])
    >>> list(df["status"])
    ['infeasible', 'optimal', 'optimal']
    """
    import pandas as pd

    from .sweep import sweep

    # the ILP's options go to the ILP; each method starts from its last feasible plan where it takes one
    runs = [sweep(chain, platform, memories, method, allocation=allocation, time_limit=time_limit, warm_start=True,
                  **(options if method == "ilp" else {})) for method in methods]
    rows = []
    for level in zip(*runs):
        for method, (M, p) in zip(methods, level):
            rows.append({"memory": M, "method": method, "allocation": allocation, "status": p.status,
                         "period": p.period, "throughput": p.throughput, "gap": p.gap,
                         "solve_seconds": p.solve_seconds, "peak_memory": p.peak_memory if p.feasible else float("nan")})
    return pd.DataFrame(rows)
