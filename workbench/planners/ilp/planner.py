"""``ilp``: the throughput-under-memory plan ILP, solved with HiGHS through Pyomo.

:func:`plan_ilp` takes the allocation, the time limit and the options of
:class:`~workbench.planners.ilp.options.IlpOptions` (an unknown option is an
error) and dispatches:

* ``activations="auto"``: :mod:`workbench.planners.ilp.auto` (with a memory
  limit; without one keeping every layer's activations is best: the keep ILP);
* a chain linearised from a DAG: the layer order dp's graph mode chose
  (:func:`workbench.planners.dp.contiguous.plan_dp`), recorded as ``chain_order``;
* chains longer than ``coarsen`` blocks: :func:`workbench.planners.ilp.coarse.plan_coarse`;
* otherwise the phases of :func:`workbench.planners.ilp.phases.solve_chain`
  (feasibility, incumbent, stage bound, local search, cover search, MILP).

Every phase records itself in the plan (``extra["solve"]``). On a time-out
the best plan known is returned with ``status="timeout"`` and its proven
``gap`` = (T - T_bound) / T. The model is :mod:`workbench.planners.ilp.model`;
solving and reading it back, :mod:`workbench.planners.ilp.solve`.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> p = plan_ilp(ch, Target.of(2, memory=10_000, memory_model="paper"))
>>> p.period, p.status
(6.0, 'optimal')
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from workbench.model.chain import Chain
from workbench.model.plan import Plan, chain_for_plan
from workbench.model.target import Target
from workbench.planners.budget import Budget
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.auto import plan_ilp_auto
from workbench.planners.ilp.coarse import plan_coarse
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.phases import solve_chain

__all__ = ["plan_ilp"]


def plan_ilp(chain: Chain, platform: Target, *, allocation: str = "contiguous", time_limit: float | None = None,
             options: IlpOptions | None = None, **kwargs: Any) -> Plan:
    """Best periodic plan under the memory limit by the ILP (contiguous or general allocations).

    ``options`` (an :class:`~workbench.planners.ilp.options.IlpOptions`) and ``kwargs`` (its fields
    by name, e.g. ``cover=False``; a name it does not have is a :class:`ValueError`) say everything
    else. ``time_limit`` covers the whole call, every phase included: it returns by about
    ``time_limit`` (HiGHS and the DP phases overrun by a fraction of a second); with
    ``deterministic`` the time limit is a guide and the wall clock a safety net at 3 times it.
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    if platform.multi_node:
        raise ValueError(f"ilp does not model a platform of several nodes yet ({platform.devices} devices, "
                         f"{platform.devices_per_node} per node: its links are not all alike); plan it with dp")
    opts = _options(options, kwargs)
    if opts.activations == "auto":   # per-layer activation policies
        if not math.isfinite(platform.memory_limit):   # recompute and offload only add time or constraints
            keep = IlpOptions(rel_gap=opts.rel_gap, threads=opts.threads, log=opts.log,
                              solver_options=opts.solver_options)
            p = plan_ilp(chain, platform, allocation=allocation, time_limit=time_limit, options=keep)
            return p.with_(notes=p.notes + ("no memory limit: every layer keeps its activations (the best policy)",))
        return plan_ilp_auto(chain, platform, allocation=allocation, time_limit=time_limit, rel_gap=opts.rel_gap,
                             threads=opts.threads, log=opts.log, solver_options=opts.solver_options)
    budget = Budget(time_limit, deterministic=opts.deterministic, progress=opts.progress)
    if chain.graph is not None and opts.graph:
        return _in_graph_order(chain, platform, allocation, opts, budget)
    return _plan(chain, platform, allocation, opts, budget, None)


def _options(options: IlpOptions | None, kwargs: dict[str, Any]) -> IlpOptions:
    """``options`` with ``kwargs`` (IlpOptions fields by name) on top."""
    given = IlpOptions.of(**kwargs)                       # refuses unknown names
    if options is None:
        return given
    return replace(options, **kwargs)


def _plan(chain: Chain, platform: Target, allocation: str, opts: IlpOptions, budget: Budget,
          fine_dp: Plan | None) -> Plan:
    """The ILP's plan of ``chain`` in its own layer order: on blocks if it is long, else its phases."""
    blocks = opts.blocks(len(chain))
    if blocks:
        return plan_coarse(chain, platform, blocks=blocks, allocation=allocation, options=opts, budget=budget,
                           fine_dp=fine_dp)
    return solve_chain(chain, platform, allocation, opts, budget, fine_dp)


def _in_graph_order(chain: Chain, platform: Target, allocation: str, opts: IlpOptions, budget: Budget) -> Plan:
    """A chain linearised from a DAG: plan in the layer order dp's graph mode chose (its cut sets are
    the best found), so dp on another order never beats the ILP."""
    t_start = time.perf_counter()
    ref, skipped = _graph_order(chain, platform, budget, opts.shares.graph_after_dp)
    if ref.chain_order is None:
        res = _plan(chain, platform, allocation, opts, budget, ref)
        return res.with_(notes=res.notes + ((skipped,) if skipped else ()))
    res = _plan(chain_for_plan(ref, chain), platform, allocation, opts, budget, ref.with_(chain_order=None))
    notes = res.notes + ("layer order from dp's graph mode (best_order)",)
    return res.with_(chain_order=ref.chain_order, notes=notes, solve_seconds=time.perf_counter() - t_start)


def _graph_order(chain: Chain, platform: Target, budget: Budget, after_dp: float) -> tuple[Plan, str]:
    """dp's plan in the best layer order of ``chain.graph`` (graph mode), and a note if the order
    search was skipped: with a time limit (not deterministic), when after the DP in the default
    order less than ``after_dp`` times its time (plus a second) is left."""
    if budget.limited and not budget.deterministic:
        budget.say(f"ilp: the exact contiguous DP on the {len(chain)} layers in their default order")
        t0 = time.perf_counter()
        base = plan_dp(chain, platform, graph=False)
        took = time.perf_counter() - t0
        if budget.left() < after_dp * took + 1.0:
            why = (f"layer order search (dp graph mode) skipped: {budget.left():.1f} s left after "
                   f"{took:.1f} s of DP")
            budget.say(f"ilp: {why}")
            return base, why
    budget.say(f"ilp: choosing the layer order of the {len(chain)}-node graph (dp, graph mode)")
    return plan_dp(chain, platform, graph=True), ""
