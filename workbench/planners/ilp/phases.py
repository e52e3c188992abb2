"""The ILP on one chain, as a sequence of phases: each returns (plan, bound, record).

:func:`solve_chain` runs, in this order (docs/model.md, "Planners"):

1. ``feasibility``: a layer that alone does not fit, or all layers together
   above P M (:func:`workbench.planners.ilp.bounds.least_memory_bound`): no
   model is built;
2. ``incumbent``: the exact contiguous DP's plan
   (:func:`workbench.planners.dp.contiguous.plan_dp`), or a warm start; its period
   bounds the MILP (``T <= T_inc``) and it is the fallback;
3. ``stage_bound``: the stage-path lower bound
   (:func:`workbench.planners.ilp.stage_bound.stage_path_bound`);
4. general allocations: ``local_search`` from the incumbent
   (:func:`workbench.planners.ilp.search.local_search`); if the incumbent
   then meets the bound it is optimal;
5. general allocations: ``cover``, the exact cover search
   (:func:`workbench.planners.ilp.cover.cover_search`), which raises the bound,
   may improve the incumbent and often proves it optimal;
6. ``milp``: the MILP (:mod:`workbench.planners.ilp.model`), its solution
   polished (integers fixed, the LP re-solved) and re-checked, or skipped
   when too little time is left.

Each phase returns a :class:`PhaseResult`: the incumbent and the proven
bound after it, a :class:`~workbench.model.plan_extra.PhaseRecord`, and, when it
settles the answer, a :class:`Verdict`. The plan records every phase, the
phase whose plan it is (``found_by``) and the one that proved its bound
(``bound_by``) in ``extra["solve"]`` (:class:`~workbench.model.plan_extra.SolveRecord`).

>>> from workbench.model.chain import Chain, Layer, Platform
>>> from workbench.planners.budget import Budget
>>> from workbench.planners.ilp.options import IlpOptions
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> p = solve_chain(ch, Platform(2, memory=10_000, memory_model="paper"), "contiguous", IlpOptions(), Budget())
>>> p.status, [r["phase"] for r in p.extra["solve"]["phases"]], p.extra["solve"]["found_by"]
('optimal', ['feasibility', 'incumbent', 'stage_bound'], 'incumbent')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyomo.environ as pyo

from workbench.model.chain import Chain, Platform
from workbench.model.plan import Plan, infeasible_plan, make_plan
from workbench.model.plan_extra import PhaseRecord, SolveRecord, phase_record
from workbench.model.tolerances import BETTER, INCUMBENT_CAP, REL_TOL
from workbench.planners.budget import Budget, milp_root_seconds
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.bounds import least_memory_bound
from workbench.planners.ilp.cover import TooManySets, cover_search
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.search import local_search
from workbench.planners.ilp.solve import MilpProgress, plan_from_model, polish, solve_model
from workbench.planners.ilp.stage_bound import stage_path_bound
from workbench.verify.check import check

__all__ = ["solve_chain", "PhaseResult", "Verdict", "finish"]


@dataclass(frozen=True)
class Verdict:
    """How a phase settles the answer: the status and gap of the incumbent (or, without one, why not),
    notes to add, extra fields, and the phase that proved the bound (None: the run's)."""

    status: str
    gap: float = 0.0
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    bound_by: str | None = None


@dataclass(frozen=True)
class PhaseResult:
    """What a phase leaves: the incumbent, the proven bound, its record, and a verdict if it settles."""

    plan: Plan | None
    bound: float
    record: PhaseRecord
    verdict: Verdict | None = None


class _Run:
    """One solve: the instance, options and budget, the incumbent, bound, notes and records so far."""

    def __init__(self, chain: Chain, platform: Platform, allocation: str, opts: IlpOptions, budget: Budget) -> None:
        self.chain, self.platform, self.allocation, self.opts, self.budget = chain, platform, allocation, opts, budget
        self.general = allocation == "general" and platform.devices > 1
        self.inc: Plan | None = None
        self.bound = 0.0
        self.notes: list[str] = []
        self.records: list[PhaseRecord] = []
        self.found_by: str | None = None
        self.bound_by: str | None = None
        self.need, self.why = 0.0, ""
        self._t = budget.elapsed()

    def result(self, phase: str, plan: Plan | None, bound: float, outcome: str,
               verdict: Verdict | None = None) -> PhaseResult:
        """A phase's result, its record timed since the previous phase ended."""
        now = self.budget.elapsed()
        rec = phase_record(phase, now - self._t, plan.period if plan is not None else None, bound, outcome)
        self._t = now
        return PhaseResult(plan, bound, rec, verdict)

    def apply(self, res: PhaseResult) -> Verdict | None:
        """Take in a phase's result: a different plan becomes the incumbent (found by that phase), a
        higher bound the bound (proved by it)."""
        self.records.append(res.record)
        phase = res.record["phase"]
        if res.plan is not None and res.plan is not self.inc:
            self.inc, self.found_by = res.plan, phase
        if res.bound > self.bound:
            self.bound, self.bound_by = res.bound, phase
        if res.verdict is not None and res.verdict.bound_by is not None:
            self.bound_by = res.verdict.bound_by
        return res.verdict

    def meets_bound(self) -> bool:
        return self.inc is not None and self.inc.period <= self.bound * (1 + self.opts.rel_gap)

    def incumbent_note(self) -> str:
        return f"incumbent {self.inc.method} ({self.inc.allocation}) period {self.inc.period:.6g} s"

    def solve_record(self) -> SolveRecord:
        return SolveRecord(phases=list(self.records), found_by=self.found_by if self.inc is not None else None,
                           bound_by=self.bound_by)


def _valid(plan: Plan, run: _Run) -> bool:
    return plan.feasible and not check(plan, run.chain, run.platform)


# ----------------------------------------------------------------------------
# the phases
# ----------------------------------------------------------------------------
def feasibility_phase(run: _Run) -> PhaseResult:
    """A bound on the memory any plan needs (every k = 1): above the limit, nothing fits."""
    run.need, run.why = need, why = least_memory_bound(run.chain, run.platform)
    if need > run.platform.memory * (1 + REL_TOL):
        why = f"no plan fits in memory: {why}, above the limit"
        return run.result("feasibility", None, 0.0, "no plan fits: " + why,
                          Verdict("infeasible", notes=(why,), extra={"least_memory_bound": need}))
    return run.result("feasibility", None, 0.0, "memory allows a plan")


def incumbent_phase(run: _Run, fine_dp: Plan | None) -> PhaseResult:
    """The exact contiguous DP's plan (``fine_dp``: already computed), or a valid warm start if better."""
    ws = run.opts.warm_start
    dp = None
    if ws:
        p = fine_dp if fine_dp is not None else plan_dp(run.chain, run.platform, graph=False)
        dp = p if _valid(p, run) else None
    inc = dp
    if isinstance(ws, Plan):
        given = ws.with_(memory_limit=run.platform.memory)
        if given.feasible and len(given.assignment) == len(run.chain) and not check(given, run.chain, run.platform):
            inc = given if dp is None or not dp.period < given.period else dp
    if inc is None:
        return run.result("incumbent", None, 0.0, "no incumbent" if ws else "cold start")
    what = "the exact contiguous DP" if inc is dp else "the warm start"
    return run.result("incumbent", inc, 0.0, f"{what}: period {inc.period:.6g} s")


def stage_bound_phase(run: _Run) -> PhaseResult:
    """The stage-path lower bound (capped by the incumbent's period)."""
    lb = stage_path_bound(run.chain, run.platform, run.inc.period if run.inc is not None else None)
    if run.inc is not None:
        run.budget.say(f"ilp: incumbent {run.inc.method} ({run.inc.allocation}) period {run.inc.period:.6g} s; "
                       f"bound {lb:.6g} s")
    return run.result("stage_bound", run.inc, lb, f"bound {lb:.6g} s")


def local_search_phase(run: _Run) -> PhaseResult:
    """General mode: improve the incumbent by local search (``shares.local_search`` of what is left at most)."""
    budget, secs_opt, share = run.budget, run.opts.search_seconds, run.opts.shares.local_search
    inc = run.inc
    secs = min(secs_opt, budget.phase_seconds(share, default=secs_opt) or 0.0)
    budget.say(f"ilp: local search from the incumbent, {budget.describe(secs)}")
    deadline = budget.deadline(share, "local_search", default=secs_opt, cap=secs_opt)
    better = local_search(run.chain, run.platform, inc, seconds=secs_opt, deadline=deadline)
    if better is not inc and better.period < inc.period and not check(better, run.chain, run.platform):
        run.notes.append(f"local search improved the incumbent from {inc.period:.6g} s to {better.period:.6g} s")
        budget.say(f"ilp: local search: period {inc.period:.6g} s -> {better.period:.6g} s")
        return run.result("local_search", better, run.bound, "improved the incumbent")
    return run.result("local_search", inc, run.bound, "nothing better")


def cover_phase(run: _Run) -> PhaseResult:
    """General mode: the exact cover search; it may prove the incumbent optimal."""
    budget, inc, lb = run.budget, run.inc, run.bound
    budget.say(f"ilp: cover search, {budget.describe(budget.phase_seconds(run.opts.cover_share))}")
    deadline = budget.deadline(run.opts.cover_share, "cover")

    def report(bound: float, period: float) -> None:
        budget.say(f"ilp: cover search: period {period:.6g} s, bound {bound:.6g} s")

    try:
        cr = cover_search(run.chain, run.platform, inc.period, deadline=deadline,
                          progress=report if budget.progress else None)
    except TooManySets as e:
        run.notes.append(f"cover search skipped: {e}")
        budget.say(f"ilp: cover search skipped: {e}")
        return run.result("cover", inc, lb, f"skipped: {e}")
    run.notes.append(f"cover search: {cr.status} after {cr.evaluated} allocations of {cr.sets} device sets "
                     f"({cr.seconds:.2f} s); bound {cr.bound:.6g} s")
    outcome = cr.status
    if cr.assignment is not None:
        cand = make_plan(run.chain, run.platform, cr.period, list(cr.assignment), cr.fwd, cr.bwd, method="cover")
        bad = check(cand, run.chain, run.platform)
        if cand.feasible and not bad:
            run.notes.append(f"cover search improved the incumbent from {inc.period:.6g} s to {cand.period:.6g} s")
            inc, outcome = cand, f"{cr.status}, improved the incumbent"
        else:  # pragma: no cover - the evaluator is exact; never trust it blindly
            run.notes.append(f"cover search plan rejected by the checker: {bad[0] if bad else 'infeasible'}")
            cr.status = "timeout"
    lb = max(lb, cr.bound)  # cr.bound <= every period the search started from or found
    searched = cr.status == "optimal" and inc.period <= cr.period * (1 + BETTER)
    if searched or inc.period <= lb * (1 + run.opts.rel_gap):
        why = "the cover search proves" if searched else "the cover bound proves"
        proof = f"{why} the incumbent optimal"
        return run.result("cover", inc, lb, f"{outcome}; {proof}", Verdict("optimal", 0.0, (proof,), bound_by="cover"))
    return run.result("cover", inc, lb, f"{outcome}; bound {lb:.6g} s")


def milp_phase(run: _Run) -> PhaseResult:
    """Build and solve the MILP (bounded by the incumbent), polish and re-check its solution; with too
    little time left, the incumbent and its gap to the bound."""
    budget, opts, inc, lb = run.budget, run.opts, run.inc, run.bound
    shares = opts.shares   # the time shares: workbench.planners.budget.PhaseShares
    if budget.limited and not budget.deterministic and budget.left() < shares.milp_min_seconds:
        return _skip_milp(run, f"MILP skipped: {budget.left():.2f} s of the time limit left")
    hi = inc.period * (1 + INCUMBENT_CAP) if inc is not None else None
    model = build_model(run.chain, run.platform, allocation=run.allocation, period_bounds=(lb, hi) if hi else None,
                        pairwise=opts.pairwise, tighten=opts.tighten)
    build_s = budget.elapsed()
    reserve = min(shares.polish_reserve, shares.polish_reserve_share * (budget.seconds or 0.0))
    rows = sum(1 for _ in model.component_data_objects(pyo.Constraint, active=True))
    limits = budget.milp_limits(reserve=reserve, root_seconds=milp_root_seconds(rows))
    if limits is None:   # deterministic: the share left cannot pay for the root node
        return _skip_milp(run, f"MILP skipped: its share of the work is below its root node's estimate ({rows} rows)")
    if budget.limited:
        limits["time_limit"] = max(float(limits["time_limit"]), shares.solver_floor)
    budget.say(f"ilp: MILP (HiGHS) on {len(run.chain)} layers x {run.platform.devices} devices, "
               f"{budget.describe(budget.phase_seconds(reserve=reserve))}")
    solver_opts = {**(opts.solver_options or {}), **{k: v for k, v in limits.items() if k != "time_limit"}}
    sink = MilpProgress(budget, model._ilp.t_ref, opts.log) if (budget.progress or opts.log is not None) else None
    res = solve_model(model, time_limit=limits.get("time_limit"), rel_gap=opts.rel_gap, threads=opts.threads,
                      log=sink, solver_options=solver_opts)
    tc = str(res.termination_condition).split(".")[-1]
    if budget.deterministic:
        budget.spend_nodes(int(getattr(res.extra_info, "mip_node_count", 0) or 0))
        if tc == "maxTimeLimit":
            budget.note_cut_short()
    bound_T = lb
    if res.objective_bound is not None and math.isfinite(res.objective_bound) and res.objective_bound > 0:
        bound_T = max(lb, model._ilp.t_ref / res.objective_bound)
    found: Plan | None = None
    if res.incumbent_objective is not None:
        polish(model, threads=opts.threads,
               time_limit=max(shares.solver_floor, budget.left()) if budget.limited else shares.polish_seconds)
        cand = plan_from_model(model, run.chain, run.platform, allocation=run.allocation)
        bad = check(cand, run.chain, run.platform)
        if bad:
            run.notes.append(f"ILP solution rejected by the checker: {bad[0]}")
        else:
            found = cand
    return _milp_verdict(run, found, bound_T, tc, build_s, getattr(model, "_ilp_excess_bounded", False))


def _milp_verdict(run: _Run, found: Plan | None, bound_T: float, tc: str, build_s: float,
                  excess_bounded: bool) -> PhaseResult:
    """The MILP phase's result: the better of its plan and the incumbent, status and gap. ``excess_bounded``:
    the model bounds each device's transient memory from above (its proofs hold for that bound only)."""
    inc, lb, rel_gap, allocation = run.inc, run.bound, run.opts.rel_gap, run.allocation
    best = found
    if inc is not None and (best is None or inc.period < best.period * (1 - BETTER)):
        best = inc
    proven = tc in ("convergenceCriteriaSatisfied", "provenInfeasible", "infeasibleOrUnbounded")
    if best is None:
        if proven:
            why = (f"the ILP proves no {allocation} plan fits in memory (a bound on the least memory needed: "
                   f"{run.need:.6g} bytes; {run.why})")
            v = Verdict("infeasible", notes=(why,), extra={"least_memory_bound": run.need, "termination": tc},
                        bound_by="milp")
        else:
            v = Verdict("timeout", notes=(f"no plan found within the time limit ({tc})",), extra={"termination": tc})
        return run.result("milp", None, bound_T, f"HiGHS: {tc}, no plan", v)
    if proven:
        # infeasible with the incumbent bound => the incumbent is optimal
        status = "optimal"
        gap = max(0.0, (best.period - bound_T) / best.period) if tc == "convergenceCriteriaSatisfied" else 0.0
    else:
        status, gap = "timeout", max(0.0, (best.period - bound_T) / best.period)
        if gap <= rel_gap:  # the bound met the plan before the time ran out: proven all the same
            status = "optimal"
    # contiguous: the dp incumbent is exact, so a plan no better than it is optimal whatever the MILP's bound
    dp_proves = (allocation == "contiguous" and inc is not None and inc.method == "dp"
                 and best.period >= inc.period * (1 - BETTER))
    notes: list[str] = []
    if (status == "optimal" and excess_bounded and math.isfinite(run.platform.memory)
            and best.period > lb * (1 + rel_gap) and not dp_proves):
        # the MILP bounds each device's transient from above: its proof holds for that bound only
        status = "feasible"
        notes.append("optimal for the MILP's bound on each device's transient memory (workbench.model.memory."
                     "linear_terms), not proven for the exact memory model")
    notes.append(f"HiGHS: {tc}; period bound {bound_T:.6g} s; model ready {build_s:.2f} s into the solve")
    bound_by = "incumbent" if dp_proves and status == "optimal" else ("milp" if proven or bound_T > lb else None)
    outcome = f"HiGHS: {tc}" + ("; its plan" if best is found else "; the incumbent stands")
    return run.result("milp", best, bound_T, outcome,
                      Verdict(status, gap, tuple(notes), {"termination": tc}, bound_by=bound_by))


def _skip_milp(run: _Run, why: str) -> PhaseResult:
    """The result without the MILP: the incumbent and its gap to the bound (a time-out without one)."""
    run.budget.say(f"ilp: {why}")
    inc, lb = run.inc, run.bound
    if inc is None:
        return run.result("milp", None, lb, why, Verdict("timeout", notes=(f"no plan found ({why})",)))
    gap = max(0.0, (inc.period - lb) / inc.period)
    v = Verdict("optimal" if gap <= run.opts.rel_gap else "timeout", gap, (f"{why}; gap against the bound {lb:.6g} s",))
    return run.result("milp", inc, lb, why, v)


# ----------------------------------------------------------------------------
# the sequence
# ----------------------------------------------------------------------------
def solve_chain(chain: Chain, platform: Platform, allocation: str, opts: IlpOptions, budget: Budget,
                fine_dp: Plan | None = None) -> Plan:
    """The ILP's plan for ``chain`` as it is (no coarsening, no re-ordering): the phases of the module
    docstring, in order, until one settles the answer. ``fine_dp``: the DP's plan if already known."""
    run = _Run(chain, platform, allocation, opts, budget)
    if (v := run.apply(feasibility_phase(run))) is not None:
        return finish(run, v)
    run.apply(incumbent_phase(run, fine_dp))
    run.apply(stage_bound_phase(run))
    if run.general and run.inc is not None and opts.search_seconds:
        run.apply(local_search_phase(run))
    if run.meets_bound():
        run.notes.append(run.incumbent_note())
        return finish(run, Verdict("optimal", 0.0, ("incumbent meets the lower bound",)))
    if run.general and opts.cover and run.inc is not None:
        if (v := run.apply(cover_phase(run))) is not None:
            return finish(run, v)
    if run.inc is not None:
        run.notes.append(run.incumbent_note())
    return finish(run, run.apply(milp_phase(run)))


def finish(run: _Run, v: Verdict) -> Plan:
    """The plan of a settled run: the incumbent with the verdict's status and gap, its notes, and the
    solve record; without an incumbent, an infeasible plan (status ``timeout`` if time ran out)."""
    budget = run.budget
    notes = list(run.notes) + list(v.notes)
    extra: dict[str, Any] = dict(v.extra)
    if budget.deterministic:
        extra["deterministic"] = not budget.cut_short
        if budget.cut_short and run.inc is not None:
            notes.append("deterministic budgets: the wall-clock safety net stopped a phase; this result may vary")
    extra["solve"] = run.solve_record()
    if run.inc is None or v.status == "infeasible":
        p = infeasible_plan(run.chain, run.platform, "ilp", notes[-1] if notes else "no plan",
                            allocation=run.allocation, solve_seconds=budget.elapsed(), extra=extra)
        return p if v.status == "infeasible" else p.with_(status="timeout")
    plan = run.inc
    budget.say(f"ilp: {v.status}, period {plan.period:.6g} s" + (f", gap {v.gap:.1%}" if v.gap else "")
               + f" ({budget.elapsed():.1f} s)")
    return plan.with_(method="ilp", allocation=run.allocation, status=v.status, gap=v.gap,
                      solve_seconds=budget.elapsed(), memory_limit=run.platform.memory,
                      notes=tuple(plan.notes) + tuple(notes), extra={**plan.extra, **extra})
