"""``ilp`` with ``activations="auto"``: the plan ILP that also chooses every layer's activation policy.

The model is :func:`workbench.planners.ilp.model.build_model` with ``policies=True`` (its
policy part: :mod:`workbench.planners.ilp.policies`). The solve follows
:func:`workbench.planners.ilp.phases.solve_chain` in a shorter form:

1. the incumbent is the exact contiguous DP with policies
   (:mod:`workbench.planners.dp.auto`); it bounds the period (``T <= T_dp``) and is returned when
   the solver finds nothing better (or, on chains longer than ``ilp_options.COARSEN_ABOVE`` layers,
   instead of a MILP: coarsening would merge layers that need different policies);
2. the lower bound is the chain's own (``plan.lower_bound``: policies only add time); the
   local search, the cover search and the stage-path bound of the keep-only solver are left
   out (they know no policies);
3. the MILP with a time limit; its solution is polished (integers fixed, the LP re-solved),
   rebuilt on its effective chain and re-checked by :func:`workbench.verify.check.check`.

A proof of optimality holds for the MILP's bound on each device's transient memory (as
without policies) and, for general allocations, for the host link modelled by its load only;
the plan says so.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
>>> p = plan_ilp_auto(ch, Platform(2, memory=300, memory_model="paper", host_bandwidth=100))
>>> p.period, p.activations        # keep alone needs a period of 9 s under 300 bytes
(7.0, ('keep', 'recompute', 'keep', 'keep'))
"""

from __future__ import annotations

import math
import time
from typing import Any

import pyomo.environ as pyo

from workbench.model.activations import apply_policies, describe, is_keep, policy_terms
from workbench.model.chain import Chain, Platform
from workbench.model.plan import Plan, infeasible_plan, lower_bound, make_plan, stages_of
from workbench.model.tolerances import BETTER, INCUMBENT_CAP, MILP_GAP
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.bounds import memory_period_bound
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.options import COARSEN_ABOVE
from workbench.planners.ilp.policies import minimal_terms, read_policies
from workbench.planners.ilp.solve import polish, solve_model
from workbench.verify.check import check

__all__ = ["plan_ilp_auto"]


def _from_model(model: pyo.ConcreteModel, chain: Chain, platform: Platform, allocation: str) -> Plan:
    d = model._ilp
    T = d.t_ref / pyo.value(model.u)
    pol = read_policies(model)
    assignment = [max(range(d.P), key=lambda p: pyo.value(model.x[l, p])) for l in range(d.L)]
    runs = stages_of(assignment)
    fwd = [pyo.value(model.tf[a]) * T for a, _ in runs]
    bwd = [pyo.value(model.tb[b]) * T for _, b in runs]
    plan = make_plan(apply_policies(chain, pol), platform, T, assignment, fwd, bwd, method="ilp", allocation=allocation)
    return plan.with_(activations=() if is_keep(pol) else pol, lower_bound=lower_bound(chain, platform))


def plan_ilp_auto(chain: Chain, platform: Platform, *, allocation: str = "contiguous",
                  time_limit: float | None = None, rel_gap: float = MILP_GAP, threads: int | None = 1,
                  log: Any = None, solver_options: dict | None = None) -> Plan:
    """Best periodic plan with per-layer activation policies by the ILP (see the module docstring), under a
    memory limit (without one, :func:`workbench.planners.ilp.planner.plan_ilp` plans the keep ILP: recompute and
    offload only add time or constraints)."""
    if not math.isfinite(platform.memory):
        raise ValueError("plan_ilp_auto needs a memory limit (without one every layer keeps its activations)")
    t0 = time.perf_counter()
    notes: list[str] = []
    inc = plan_dp(chain, platform, activations="auto", graph=False)
    inc = inc if inc.feasible and not check(inc, chain, platform) else None
    lb = lower_bound(chain, platform)

    def finish(plan: Plan, status: str, gap: float, more: list[str]) -> Plan:
        return plan.with_(method="ilp", allocation=allocation, status=status, gap=gap, memory_limit=platform.memory,
                          solve_seconds=time.perf_counter() - t0, notes=tuple(plan.notes) + tuple(notes + more))

    if inc is not None:
        notes.append(f"incumbent dp with activations chosen per layer, period {inc.period:.6g} s")
        if inc.period <= lb * (1 + rel_gap):
            return finish(inc, "optimal", 0.0, ["incumbent meets the lower bound"])
    if len(chain) > COARSEN_ABOVE:
        if inc is None:
            return infeasible_plan(chain, platform, "ilp",
                                   "no contiguous plan fits with policies chosen per layer, and "
                                   f"the ILP with policies does not coarsen chains over {COARSEN_ABOVE} layers",
                                   allocation=allocation, solve_seconds=time.perf_counter() - t0)
        return finish(inc, "feasible", max(0.0, (inc.period - lb) / inc.period),
                      [f"chain over {COARSEN_ABOVE} layers: no MILP with policies (coarsening would merge layers "
                       "that need different policies); the contiguous DP's plan"])
    if inc is None:
        if not math.isfinite(memory_period_bound(chain, platform, minimal_terms(policy_terms(chain, platform)))):
            return infeasible_plan(chain, platform, "ilp", "no plan fits in memory even with the least memory any "
                                   "activation policy gives each layer (every layer counted once, one mini-batch "
                                   "in flight)", allocation=allocation, solve_seconds=time.perf_counter() - t0)
    hi = inc.period * (1 + INCUMBENT_CAP) if inc is not None else None
    model = build_model(chain, platform, allocation=allocation, period_bounds=(lb, hi) if hi else None, policies=True)
    left = None if time_limit is None else max(time_limit - (time.perf_counter() - t0), 0.5)
    res = solve_model(model, time_limit=left, rel_gap=rel_gap, threads=threads, log=log, solver_options=solver_options)
    tc = str(res.termination_condition).split(".")[-1]
    bound_T = lb
    if res.objective_bound is not None and math.isfinite(res.objective_bound) and res.objective_bound > 0:
        bound_T = max(lb, model._ilp.t_ref / res.objective_bound)
    best = inc
    if res.incumbent_objective is not None:
        polish(model, threads=threads)
        cand = _from_model(model, chain, platform, allocation)
        bad = check(cand, chain, platform)
        if bad:
            notes.append(f"ILP solution rejected by the checker: {bad[0]}")
        elif best is None or cand.period < best.period * (1 - BETTER):
            best = cand
    proven = tc in ("convergenceCriteriaSatisfied", "provenInfeasible", "infeasibleOrUnbounded")
    if best is None:
        why = ("the ILP proves no plan fits in memory with policies chosen per layer" if proven
               else f"no plan found within the time limit ({tc})")
        p = infeasible_plan(chain, platform, "ilp", why, allocation=allocation,
                            solve_seconds=time.perf_counter() - t0, extra={"termination": tc})
        return p if proven else p.with_(status="timeout")
    gap = max(0.0, (best.period - bound_T) / best.period) if tc == "convergenceCriteriaSatisfied" or not proven else 0.0
    status = "optimal" if proven or gap <= rel_gap else "timeout"
    more = [f"activations: {describe(best.activations or ('keep',))}", f"HiGHS: {tc}; period bound {bound_T:.6g} s"]
    if status == "optimal" and best.period > lb * (1 + rel_gap):
        status = "feasible"
        link = " and its host-link load" if allocation == "general" else ""
        more.append(f"optimal for the MILP's bound on each device's transient memory{link}, "
                    "not proven for the exact model")
    return finish(best, status, gap, more)
