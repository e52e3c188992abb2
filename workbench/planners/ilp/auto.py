"""``ilp`` with ``activations="auto"``: the plan ILP that also chooses every layer's activation policy.

The model is :func:`workbench.planners.ilp.model.build_model` with ``policies=True`` (its
policy part: :mod:`workbench.planners.ilp.policies`). Its phases, run by
:func:`workbench.planners.ilp.runner.run_phases` as the keep variant's
(:func:`workbench.planners.ilp.phases.solve_chain`) are, in a shorter form:

1. ``incumbent``: the exact contiguous DP with policies
   (:mod:`workbench.planners.dp.auto`); it bounds the period (``T <= T_dp``) and is returned when
   the solver finds nothing better (or, on chains longer than ``ilp_options.COARSEN_ABOVE`` layers,
   instead of a MILP: coarsening would merge layers that need different policies);
2. ``bound``: the chain's own lower bound (``plan.lower_bound``: policies only add time); the
   local search, the cover search and the stage-path bound of the keep-only solver are left
   out (they know no policies);
3. ``milp``: the MILP with a time limit; its solution is polished (integers fixed, the LP re-solved),
   rebuilt on its effective chain and re-checked by :func:`workbench.verify.check.check`.

A proof of optimality holds for the MILP's bound on each device's transient memory (as
without policies) and, for general allocations, for the host link modelled by its load only;
the plan says so.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
>>> p = plan_ilp_auto(ch, Target.of(2, memory=300, memory_model="paper", host_bandwidth=100))
>>> p.period, p.activations        # keep alone needs a period of 9 s under 300 bytes; recomputing layer 0 or 1: a tie
(7.0, ('recompute', 'keep', 'keep', 'keep'))
"""

from __future__ import annotations

import math
from typing import Any

import pyomo.environ as pyo

from workbench.model.activations import apply_policies, describe, is_keep, policy_terms
from workbench.model.chain import Chain
from workbench.model.plan import Plan, lower_bound
from workbench.model.target import Target
from workbench.model.tolerances import BETTER, INCUMBENT_CAP, MILP_GAP
from workbench.planners.budget import Budget
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.bounds import memory_period_bound
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.options import COARSEN_ABOVE, IlpOptions
from workbench.planners.ilp.policies import minimal_terms, read_policies
from workbench.planners.ilp.runner import PhaseResult, Run, Verdict, run_phases
from workbench.planners.ilp.solve import plan_from_model, polish, solve_model
from workbench.verify.check import check

__all__ = ["plan_ilp_auto"]


def _from_model(model: pyo.ConcreteModel, chain: Chain, platform: Target, allocation: str) -> Plan:
    """The loaded solution as a plan of its effective chain (the policies it chose applied), its bound
    the chain's own."""
    pol = read_policies(model)
    plan = plan_from_model(model, apply_policies(chain, pol), platform, allocation=allocation)
    return plan.with_(activations=() if is_keep(pol) else pol, lower_bound=lower_bound(chain, platform))


def plan_ilp_auto(chain: Chain, platform: Target, *, allocation: str = "contiguous",
                  time_limit: float | None = None, rel_gap: float = MILP_GAP, threads: int | None = 1,
                  log: Any = None, solver_options: dict | None = None) -> Plan:
    """Best periodic plan with per-layer activation policies by the ILP (see the module docstring), under a
    memory limit (without one, :func:`workbench.planners.ilp.planner.plan_ilp` plans the keep ILP: recompute and
    offload only add time or constraints)."""
    if not math.isfinite(platform.memory_limit):
        raise ValueError("plan_ilp_auto needs a memory limit (without one every layer keeps its activations)")
    opts = IlpOptions(rel_gap=rel_gap, threads=threads, log=log, solver_options=solver_options, activations="auto")
    run = Run(chain, platform, allocation, opts, Budget(time_limit))
    return run_phases(run, [auto_incumbent_phase, chain_bound_phase, settled_by_bound, long_chain_verdict,
                            hopeless_verdict, auto_milp_phase])


def auto_incumbent_phase(run: Run) -> PhaseResult:
    """The exact contiguous DP with policies (:mod:`workbench.planners.dp.auto`): the incumbent and fallback."""
    left = max(run.budget.left(), 1e-3) if run.budget.limited else None
    inc = plan_dp(run.chain, run.platform, activations="auto", graph=False, time_limit=left,
                  progress=run.budget.progress)
    if not run.valid(inc):
        return run.result("incumbent", None, None, "no contiguous plan fits with policies chosen per layer")
    run.notes.append(f"incumbent dp with activations chosen per layer, period {inc.period:.6g} s")
    return run.result("incumbent", inc, None, f"dp with policies: period {inc.period:.6g} s")


def chain_bound_phase(run: Run) -> PhaseResult:
    """The chain's own lower bound (policies only add time)."""
    lb = lower_bound(run.chain, run.platform)
    return run.result("bound", run.inc, lb, f"bound {lb:.6g} s")


def settled_by_bound(run: Run) -> Verdict | None:
    """No phase of its own: an incumbent that meets the bound is optimal."""
    return Verdict("optimal", 0.0, ("incumbent meets the lower bound",)) if run.meets_bound() else None


def long_chain_verdict(run: Run) -> Verdict | None:
    """Chains over ``COARSEN_ABOVE`` layers get no MILP with policies (coarsening would merge layers that
    need different policies): the incumbent, or no plan."""
    if len(run.chain) <= COARSEN_ABOVE:
        return None
    if run.inc is None:
        return Verdict("infeasible", notes=("no contiguous plan fits with policies chosen per layer, and the ILP "
                                            f"with policies does not coarsen chains over {COARSEN_ABOVE} layers",))
    inc = run.inc
    return Verdict("feasible", max(0.0, (inc.period - run.bound) / inc.period),
                   (f"chain over {COARSEN_ABOVE} layers: no MILP with policies (coarsening would merge layers "
                    "that need different policies); the contiguous DP's plan",))


def hopeless_verdict(run: Run) -> Verdict | None:
    """Without an incumbent: no plan when even the least memory any policy gives each layer does not fit."""
    if run.inc is not None or math.isfinite(memory_period_bound(run.chain, run.platform,
                                                                minimal_terms(policy_terms(run.chain, run.platform)))):
        return None
    return Verdict("infeasible", notes=("no plan fits in memory even with the least memory any activation policy "
                                        "gives each layer (every layer counted once, one mini-batch in flight)",))


def auto_milp_phase(run: Run) -> PhaseResult:
    """The MILP with policies (bounded by the incumbent), its solution polished and re-checked."""
    chain, platform, allocation, opts, inc, lb = run.chain, run.platform, run.allocation, run.opts, run.inc, run.bound
    hi = inc.period * (1 + INCUMBENT_CAP) if inc is not None else None
    model = build_model(chain, platform, allocation=allocation, period_bounds=(lb, hi) if hi else None, policies=True)
    left = max(run.budget.left(), 0.5) if run.budget.limited else None
    res = solve_model(model, time_limit=left, rel_gap=opts.rel_gap, threads=opts.threads, log=opts.log,
                      solver_options=opts.solver_options)
    tc = str(res.termination_condition).split(".")[-1]
    bound_T = lb
    if res.objective_bound is not None and math.isfinite(res.objective_bound) and res.objective_bound > 0:
        bound_T = max(lb, model._ilp.t_ref / res.objective_bound)
    best = inc
    if res.incumbent_objective is not None:
        polish(model, threads=opts.threads)
        cand = _from_model(model, chain, platform, allocation)
        bad = check(cand, chain, platform)
        if bad:
            run.notes.append(f"ILP solution rejected by the checker: {bad[0]}")
        elif best is None or cand.period < best.period * (1 - BETTER):
            best = cand
    return run.result("milp", best, bound_T, f"HiGHS: {tc}" + ("; its plan" if best is not inc else ""),
                      _auto_verdict(run, best, bound_T, tc))


def _auto_verdict(run: Run, best: Plan | None, bound_T: float, tc: str) -> Verdict:
    """The MILP's verdict: a proof holds for the MILP's bound on each device's transient memory and, for
    general allocations, for the host link modelled by its load only."""
    proven = tc in ("convergenceCriteriaSatisfied", "provenInfeasible", "infeasibleOrUnbounded")
    if best is None:
        why = ("the ILP proves no plan fits in memory with policies chosen per layer" if proven
               else f"no plan found within the time limit ({tc})")
        return Verdict("infeasible" if proven else "timeout", notes=(why,), extra={"termination": tc},
                       bound_by="milp" if proven else None)
    rel_gap, lb = run.opts.rel_gap, lower_bound(run.chain, run.platform)
    gap = max(0.0, (best.period - bound_T) / best.period) if tc == "convergenceCriteriaSatisfied" or not proven else 0.0
    status = "optimal" if proven or gap <= rel_gap else "timeout"
    more = (f"activations: {describe(best.activations or ('keep',))}", f"HiGHS: {tc}; period bound {bound_T:.6g} s")
    if status == "optimal" and best.period > lb * (1 + rel_gap):
        status = "feasible"
        link = " and its host-link load" if run.allocation == "general" else ""
        more += (f"optimal for the MILP's bound on each device's transient memory{link}, "
                 "not proven for the exact model",)
    return Verdict(status, gap, more, bound_by="milp" if proven or bound_T > lb else None)
