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
import time
from typing import Any, Sequence

import numpy as np
import pyomo.environ as pyo

from ..chain import Chain, Platform
from ..memory import layer_terms, linear_terms
from ..plan import REL_TOL, Plan, infeasible_plan, make_plan, stages_of
from .ilp_model import build_model, k_bounds

__all__ = ["build_model", "plan_ilp", "solve_model", "plan_from_model", "least_memory_bound",
           "sweep_memory", "DEFAULT_SOLVER_OPTIONS"]

#: HiGHS options every solve uses (see /work/shared/ILP-NOTES.md): presolve rule 8192 off
#: (HiGHS presolve otherwise sometimes misjudges models of this kind), tight integrality.
DEFAULT_SOLVER_OPTIONS: dict[str, Any] = {
    "presolve_rule_off": 8192,
    "mip_feasibility_tolerance": 1e-9,
}

COARSEN_ABOVE = 32  # layers; coarsen=None coarsens longer chains to this many blocks


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


def polish(model: pyo.ConcreteModel, *, threads: int | None = 1) -> bool:
    """Fix every integer variable at its (rounded) value and re-solve the LP: the best period
    of that integer structure. Returns whether the LP solved (values loaded); unfixes afterwards."""
    ints = _integer_vars(model)
    saved = [(v, v.value) for v in model.component_data_objects(pyo.Var) if v.value is not None]
    for v in ints:
        v.fix(round(v.value if v.value is not None else 0))
    ok = False
    try:
        res = solve_model(model, threads=threads, time_limit=30)
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


def _incumbent(chain: Chain, platform: Platform) -> Plan | None:
    try:
        from .dp import plan_dp
    except ImportError:  # pragma: no cover
        return None
    p = plan_dp(chain, platform, graph=False)
    if p.feasible and not _check(p, chain, platform):
        return p
    return None


def plan_ilp(chain: Chain, platform: Platform, *, allocation: str = "contiguous",
             time_limit: float | None = None, rel_gap: float = 1e-6, threads: int | None = 1,
             warm_start: bool | Plan = True, log: Any = None, coarsen: int | bool | None = None,
             pairwise: bool = True, tighten: bool = True, search_seconds: float = 10.0, solver_options: dict | None = None,
             cover: bool = True, cover_share: float = 0.85, **options: Any) -> Plan:
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
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    if options.get("activations") == "auto":   # per-layer activation policies: workbench.planners.ilp_auto
        from .ilp_auto import plan_ilp_auto

        return plan_ilp_auto(chain, platform, allocation=allocation, time_limit=time_limit, rel_gap=rel_gap,
                             threads=threads, log=log, solver_options=solver_options)
    t_start = time.perf_counter()
    if chain.graph is not None and options.pop("graph", True):
        # A chain linearised from a DAG: plan in the layer order dp's graph mode chose (its cut
        # sets are the best found), so dp on another order never beats the ILP.
        from ..plan import chain_for_plan
        from .dp import plan_dp

        ref = plan_dp(chain, platform, graph=True)
        if ref.chain_order is not None:
            res = plan_ilp(chain_for_plan(ref, chain), platform, allocation=allocation, time_limit=time_limit,
                           rel_gap=rel_gap, threads=threads, warm_start=warm_start, log=log, coarsen=coarsen,
                           pairwise=pairwise, tighten=tighten, search_seconds=search_seconds,
                           solver_options=solver_options, cover=cover,
                           cover_share=cover_share, graph=False, **options)
            notes = res.notes + ("layer order from dp's graph mode (best_order)",)
            return res.with_(chain_order=ref.chain_order, notes=notes, solve_seconds=time.perf_counter() - t_start)
    L = len(chain)
    if coarsen is None:
        coarsen = COARSEN_ABOVE if L > COARSEN_ABOVE else 0
    if coarsen and int(coarsen) < L:
        from .coarsen import plan_coarse

        return plan_coarse(chain, platform, blocks=int(coarsen), allocation=allocation, time_limit=time_limit,
                           rel_gap=rel_gap, threads=threads, log=log, warm_start=bool(warm_start),
                           pairwise=pairwise, solver_options=solver_options)

    def elapsed() -> float:
        return time.perf_counter() - t_start

    need, why = least_memory_bound(chain, platform)
    if need > platform.memory * (1 + REL_TOL):
        return infeasible_plan(chain, platform, "ilp", f"no plan fits in memory: {why}, above the limit",
                               allocation=allocation, solve_seconds=elapsed(),
                               extra={"least_memory_bound": need})

    inc: Plan | None = None
    if isinstance(warm_start, Plan):
        given = warm_start.with_(memory_limit=platform.memory)
        inc = given if (given.feasible and len(given.assignment) == L and not _check(given, chain, platform)) else None
        dp = _incumbent(chain, platform)
        if dp is not None and (inc is None or dp.period < inc.period):
            inc = dp
    elif warm_start:
        inc = _incumbent(chain, platform)
    from .stage_bound import stage_path_bound

    lb = stage_path_bound(chain, platform, inc.period if inc is not None else None)
    notes: list[str] = []
    if allocation == "general" and inc is not None and search_seconds and platform.devices > 1:
        from .ilp_search import local_search

        budget = search_seconds if time_limit is None else min(search_seconds, 0.25 * time_limit)
        better = local_search(chain, platform, inc, seconds=budget)
        if better is not inc and better.period < inc.period and not _check(better, chain, platform):
            notes.append(f"local search improved the incumbent from {inc.period:.6g} s to {better.period:.6g} s")
            inc = better
    if inc is not None and inc.period <= lb * (1 + rel_gap):
        notes.append(f"incumbent {inc.method} ({inc.allocation}) period {inc.period:.6g} s")
        return _finish(inc, chain, platform, "optimal", 0.0, elapsed(), allocation, notes + ["incumbent meets the lower bound"])
    if allocation == "general" and cover and inc is not None and platform.devices > 1:
        from .ilp_cover import TooManySets, cover_search

        budget = None if time_limit is None else cover_share * max(time_limit - elapsed(), 0.0)
        try:
            cr = cover_search(chain, platform, inc.period,
                              deadline=None if budget is None else time.perf_counter() + budget)
        except TooManySets as e:
            notes.append(f"cover search skipped: {e}")
        else:
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
                return _finish(inc, chain, platform, "optimal", 0.0, elapsed(), allocation,
                               notes + [f"{why} the incumbent optimal"])
    if inc is not None:
        notes.append(f"incumbent {inc.method} ({inc.allocation}) period {inc.period:.6g} s")

    hi = inc.period * (1 + 1e-7) if inc is not None else None
    model = build_model(chain, platform, allocation=allocation, period_bounds=(lb, hi) if hi else None,
                        pairwise=pairwise, tighten=tighten)
    build_s = elapsed()
    left = None if time_limit is None else max(time_limit - build_s, 0.5)
    res = solve_model(model, time_limit=left, rel_gap=rel_gap, threads=threads, log=log,
                      solver_options=solver_options)
    tc = str(res.termination_condition).split(".")[-1]
    d = model._ilp
    bound_T = lb
    if res.objective_bound is not None and math.isfinite(res.objective_bound) and res.objective_bound > 0:
        bound_T = max(lb, d.t_ref / res.objective_bound)
    found: Plan | None = None
    if res.incumbent_objective is not None:
        polish(model, threads=threads)
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
                                   allocation=allocation, solve_seconds=elapsed(),
                                   extra={"least_memory_bound": need, "termination": tc})
        p = infeasible_plan(chain, platform, "ilp", f"no plan found within the time limit ({tc})",
                            allocation=allocation, solve_seconds=elapsed(), extra={"termination": tc})
        return p.with_(status="timeout")
    if proven:
        # infeasible with the incumbent bound => the incumbent is optimal
        status, gap = "optimal", max(0.0, (best.period - bound_T) / best.period) if tc == "convergenceCriteriaSatisfied" else 0.0
    else:
        status, gap = "timeout", max(0.0, (best.period - bound_T) / best.period)
        if gap <= rel_gap:  # the bound met the plan before the time ran out: proven all the same
            status = "optimal"
    if status == "optimal" and getattr(model, "_ilp_excess_bounded", False) and math.isfinite(platform.memory) \
            and best.period > lb * (1 + rel_gap):
        # the MILP bounds each device's transient from above: its proof holds for that bound only
        status = "feasible"
        notes.append("optimal for the MILP's bound on each device's transient memory (workbench.memory."
                     "linear_terms), not proven for the exact memory model")
    notes.append(f"HiGHS: {tc}; period bound {bound_T:.6g} s; model ready {build_s:.2f} s into the solve")
    return _finish(best, chain, platform, status, gap, elapsed(), allocation, notes, termination=tc)


def _finish(plan: Plan, chain: Chain, platform: Platform, status: str, gap: float, seconds: float,
            allocation: str, notes: Sequence[str], **extra: Any) -> Plan:
    return plan.with_(method="ilp", allocation=allocation, status=status, gap=gap, solve_seconds=seconds,
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

    from . import plan as run_planner

    levels = sorted(Platform(1, memory=m).memory for m in memories)
    rows = []
    prev: dict[str, Plan | None] = {m: None for m in methods}
    for M in levels:
        plat = platform.with_(memory=M)
        for method in methods:
            t0 = time.perf_counter()
            if method == "ilp":
                ws = prev[method] if prev[method] is not None else True
                p = plan_ilp(chain, plat, allocation=allocation, time_limit=time_limit, warm_start=ws, **options)
            else:
                p = run_planner(chain, plat, method, allocation=allocation, time_limit=time_limit)
            sec = p.solve_seconds or (time.perf_counter() - t0)
            if p.feasible:
                prev[method] = p
            rows.append({"memory": M, "method": method, "allocation": allocation, "status": p.status,
                         "period": p.period, "throughput": p.throughput, "gap": p.gap,
                         "solve_seconds": sec, "peak_memory": p.peak_memory if p.feasible else float("nan")})
    return pd.DataFrame(rows)
