"""The ILP on one chain (activations kept), as a list of phases for :mod:`workbench.planners.ilp.runner`.

:func:`solve_chain` runs, in this order (docs/model.md, "Planners"):

1. ``feasibility``: a layer that alone does not fit, or all layers together
   above P M (:func:`workbench.planners.ilp.bounds.least_memory_bound`): no
   model is built;
2. ``incumbent``: the exact contiguous DP's plan
   (:func:`workbench.planners.dp.contiguous.plan_dp`), or a warm start; its period
   bounds the MILP (``T <= T_inc``) and it is the fallback;
3. ``stage_bound``: the stage-path lower bound
   (:func:`workbench.planners.ilp.stage_bound.stage_path_bound`);
4. general allocations: ``packing``, the bound's stages packed onto the devices
   (:func:`workbench.planners.ilp.packing.packed_plan`), and under a time limit
   ``background``, the searches on a second core; ``local_search`` from the incumbent
   (:func:`workbench.planners.ilp.search.local_search`); if the incumbent
   then meets the bound it is optimal (:func:`settled_by_bound`);
5. general allocations: ``cover``, the exact cover search
   (:func:`workbench.planners.ilp.cover.cover_search`), which raises the bound,
   may improve the incumbent and often proves it optimal;
6. ``milp``: the MILP (:mod:`workbench.planners.ilp.model`), its solution
   polished (integers fixed, the LP re-solved) and re-checked, or skipped
   when too little time is left.

Each phase returns a :class:`~workbench.planners.ilp.runner.PhaseResult`: the incumbent and the
proven bound after it, a :class:`~workbench.model.plan_extra.PhaseRecord`, and, when it settles
the answer, a :class:`~workbench.planners.ilp.runner.Verdict`; a phase that does not apply returns
None. The plan records every phase, the phase whose plan it is (``found_by``) and the one that
proved its bound (``bound_by``) in ``extra["solve"]`` (:class:`~workbench.model.plan_extra.SolveRecord`).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.budget import Budget
>>> from workbench.planners.ilp.options import IlpOptions
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> p = solve_chain(ch, Target.of(2, memory=10_000, memory_model="paper"), "contiguous", IlpOptions(), Budget())
>>> p.status, [r["phase"] for r in p.extra["solve"]["phases"]], p.extra["solve"]["found_by"]
('optimal', ['feasibility', 'incumbent', 'stage_bound'], 'incumbent')
"""

from __future__ import annotations

import math
import time
from functools import partial

import pyomo.environ as pyo

from workbench.model.chain import Chain
from workbench.model.plan import Plan, make_plan
from workbench.model.plan_extra import phase_record
from workbench.model.target import Target
from workbench.model.tolerances import BETTER, INCUMBENT_CAP, REL_TOL
from workbench.planners.budget import Budget, milp_ready_seconds, milp_root_seconds
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.background import start_search
from workbench.planners.ilp.bounds import least_memory_bound
from workbench.planners.ilp.cover import TooManySets, cover_search
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.packing import packed_plan
from workbench.planners.ilp.runner import PhaseResult, Run, Verdict, run_phases
from workbench.planners.ilp.search import local_search
from workbench.planners.ilp.solve import MilpProgress, plan_from_model, polish, solve_model
from workbench.planners.ilp.stage_bound import stage_path_bound
from workbench.verify.check import check

__all__ = ["solve_chain"]


# ----------------------------------------------------------------------------
# the phases
# ----------------------------------------------------------------------------
def feasibility_phase(run: Run) -> PhaseResult:
    """A bound on the memory any plan needs (every k = 1): above the limit, nothing fits."""
    run.need, run.why = need, why = least_memory_bound(run.chain, run.platform)
    if need > run.platform.memory_limit * (1 + REL_TOL):
        why = f"no plan fits in memory: {why}, above the limit"
        return run.result("feasibility", None, 0.0, "no plan fits: " + why,
                          Verdict("infeasible", notes=(why,), extra={"least_memory_bound": need}))
    return run.result("feasibility", None, 0.0, "memory allows a plan")


def incumbent_phase(run: Run, fine_dp: Plan | None) -> PhaseResult:
    """The exact contiguous DP's plan (``fine_dp``: already computed), or a valid warm start if better."""
    ws = run.opts.warm_start
    dp = None
    if ws:
        p = fine_dp if fine_dp is not None else plan_dp(run.chain, run.platform, graph=False)
        dp = p if run.valid(p) else None
    inc = dp
    if isinstance(ws, Plan):
        given = ws.with_(memory_limit=run.platform.memory_limit)
        if given.feasible and len(given.assignment) == len(run.chain) and not check(given, run.chain, run.platform):
            inc = given if dp is None or not dp.period < given.period else dp
    if inc is None:
        return run.result("incumbent", None, 0.0, "no incumbent" if ws else "cold start")
    what = "the exact contiguous DP" if inc is dp else "the warm start"
    return run.result("incumbent", inc, 0.0, f"{what}: period {inc.period:.6g} s")


def settled_by_bound(run: Run) -> Verdict | None:
    """No phase of its own: when the incumbent meets the bound it is optimal."""
    if not run.meets_bound():
        return None
    run.notes.append(run.incumbent_note())
    return Verdict("optimal", 0.0, ("incumbent meets the lower bound",))


def stage_bound_phase(run: Run) -> PhaseResult:
    """The stage-path lower bound (capped by the incumbent's period)."""
    lb = stage_path_bound(run.chain, run.platform, run.inc.period if run.inc is not None else None)
    if run.inc is not None:
        run.budget.say(f"ilp: incumbent {run.inc.method} ({run.inc.allocation}) period {run.inc.period:.6g} s; "
                       f"bound {lb:.6g} s")
    return run.result("stage_bound", run.inc, lb, f"bound {lb:.6g} s")


def packing_phase(run: Run) -> PhaseResult | None:
    """General mode: the stage-path bound's stages packed onto the devices and timed exactly
    (:mod:`workbench.planners.ilp.packing`; ``shares.packing`` of what is left, 10 s without a limit)."""
    if not (run.general and run.inc is not None) or run.meets_bound():
        return None
    budget = run.budget
    deadline = budget.deadline(run.opts.shares.packing, "guided_search", default=10.0)
    found = packed_plan(run.chain, run.platform, run.bound, run.inc, deadline)
    if found is None or check(found, run.chain, run.platform):
        return run.result("packing", run.inc, run.bound, "nothing better")
    budget.say(f"ilp: the bound's stages packed onto the devices: period {found.period:.6g} s")
    return run.result("packing", found, run.bound, "a better plan")


def background_phase(run: Run) -> PhaseResult | None:
    """General mode under a time limit: the searches start on a second core (the guided search, then the local
    search with kicks: :mod:`workbench.planners.ilp.background`) until the MILP's end; the MILP phase takes in
    their best plan. Not with ``deterministic`` or ``parallel=False``, nor where no process can be forked."""
    budget, opts = run.budget, run.opts
    if not (run.general and run.inc is not None and opts.parallel and budget.limited and not budget.deterministic):
        return None
    reserve = min(opts.shares.polish_reserve, opts.shares.polish_reserve_share * (budget.seconds or 0.0))
    deadline = time.perf_counter() + max(0.0, budget.left() - reserve)
    run.background = start_search(run.chain, run.platform, run.inc, deadline, target=run.bound * (1 + opts.rel_gap))
    if run.background is None:
        return None
    budget.say(f"ilp: searching general plans on a second core, {budget.describe(budget.left() - reserve)}")
    return run.result("background", run.inc, run.bound, "started on a second core")


def _take_background(run: Run, best: Plan | None) -> Plan | None:
    """The better of ``best`` and the background search's plan (re-checked); notes what it found."""
    if run.background is None:
        return best
    bg = run.background.result()
    if bg is None or check(bg, run.chain, run.platform) or not bg.feasible:
        return best
    if best is None or bg.period < best.period * (1 - BETTER):
        run.notes.append(f"the search on a second core found period {bg.period:.6g} s")
        run.records.append(phase_record("background", 0.0, bg.period, None, "a better plan"))
        return bg
    return best


def local_search_phase(run: Run) -> PhaseResult | None:
    """General mode: improve the incumbent by local search (``shares.local_search`` of what is left at most): the
    cover search and the MILP start from its plan (the background search's comes only at the end)."""
    if not (run.general and run.inc is not None and run.opts.search_seconds):
        return None
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


def cover_phase(run: Run) -> PhaseResult | None:
    """General mode: the exact cover search; it may prove the incumbent optimal."""
    if not (run.general and run.opts.cover and run.inc is not None):
        return None
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


def milp_phase(run: Run) -> PhaseResult:
    """Build and solve the MILP (bounded by the incumbent), polish and re-check its solution; with too
    little time left, the incumbent and its gap to the bound."""
    budget, opts, inc, lb = run.budget, run.opts, run.inc, run.bound
    if inc is not None:
        run.notes.append(run.incumbent_note())
    shares = opts.shares   # the time shares: workbench.planners.budget.PhaseShares
    if budget.limited and not budget.deterministic:
        ready = milp_ready_seconds(len(run.chain), run.platform.devices) if run.general else 0.0
        if budget.left() < shares.milp_min_seconds + ready:
            return _skip_milp(run, f"MILP skipped: {budget.left():.2f} s of the time limit left (building it and its "
                                   f"root node take about {ready:.1f} s)")
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
    ours = found
    if run.background is not None:
        inc_or_found = found if found is not None and (run.inc is None or found.period < run.inc.period) else run.inc
        taken = _take_background(run, inc_or_found)
        if taken is not inc_or_found:
            found = taken
    res = _milp_verdict(run, found, bound_T, tc, build_s, getattr(model, "_ilp_excess_bounded", False))
    if res.plan is not None and res.plan is found and found is not ours:
        res.record["outcome"] = f"HiGHS: {tc}; the second core's search found the plan"
    return res


def _milp_verdict(run: Run, found: Plan | None, bound_T: float, tc: str, build_s: float,
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
    if (status == "optimal" and excess_bounded and math.isfinite(run.platform.memory_limit)
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


def _skip_milp(run: Run, why: str) -> PhaseResult:
    """The result without the MILP: the incumbent and its gap to the bound (a time-out without one)."""
    run.budget.say(f"ilp: {why}")
    run.inc = _take_background(run, run.inc)
    inc, lb = run.inc, run.bound
    if inc is None:
        return run.result("milp", None, lb, why, Verdict("timeout", notes=(f"no plan found ({why})",)))
    gap = max(0.0, (inc.period - lb) / inc.period)
    v = Verdict("optimal" if gap <= run.opts.rel_gap else "timeout", gap, (f"{why}; gap against the bound {lb:.6g} s",))
    return run.result("milp", inc, lb, why, v)


# ----------------------------------------------------------------------------
# the sequence
# ----------------------------------------------------------------------------
def solve_chain(chain: Chain, platform: Target, allocation: str, opts: IlpOptions, budget: Budget,
                fine_dp: Plan | None = None) -> Plan:
    """The ILP's plan for ``chain`` as it is (no coarsening, no re-ordering): the phases of the module
    docstring, in order, until one settles the answer. ``fine_dp``: the DP's plan if already known."""
    return run_phases(Run(chain, platform, allocation, opts, budget),
                      [feasibility_phase, partial(incumbent_phase, fine_dp=fine_dp), stage_bound_phase,
                       packing_phase, background_phase, local_search_phase, settled_by_bound, cover_phase,
                       milp_phase])
