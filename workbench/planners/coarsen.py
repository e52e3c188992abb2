"""Coarsening: solve the plan ILP on blocks of layers, map the plan back to the layers.

Real networks have 40 to 1,000 layers; the ILP is exact but grows with the
chain. :func:`block_groups` cuts the chain into B blocks of balanced compute,
preferring cuts that send few bytes and refusing blocks that alone exceed the
memory limit; :func:`plan_coarse` solves the ILP on ``chain.coarsen(groups)``
and expands the plan: a block plan's stages are runs of whole blocks, with the
same sums (F, B, saved, weights) and the same cut after them, so its period
and start times are valid for the fine chain as they are (re-checked).

What coarsening can cost: the block plan is the best plan among those that cut
only at block boundaries. Reported in ``plan.extra``:

* ``fine_lower_bound``: a bound for the fine problem (the chain's lower bound,
  the memory bounds :func:`workbench.planners.ilp_model.memory_period_bound` and
  :func:`workbench.planners.stage_bound.stage_path_bound`, and for contiguous the
  exact fine DP);
* ``largest_block``: the compute of the heaviest block (a block cannot be split);
* the returned ``gap`` is measured against the fine bound, so it includes
  what coarsening may have cost.

For contiguous allocations the DP on the fine chain is exact and fast; it is
always run and the better plan kept. For general allocations on 16 blocks or
more, the block ILP gets 20 % of the time limit, the same solve on half as many
blocks (where the cover search of :mod:`workbench.planners.ilp_cover` is often
exact, while the full block count has too many device sets) gets the next 25 %,
and a search on the fine chain (:func:`workbench.planners.ilp_search.guided_search`,
a descent on the cheap path period whose steps are checked exactly) improves the best
plan with the rest but the last 2 %, which are for the fine lower bound;
``extra["half_blocks"]`` records the half solve and ``extra["phase_seconds"]`` the
time of each phase. On resnet50 x 8 at 35.8 GiB (120 s) the old split (45 %, 35 %, local
search with kicks) ended at 0.06144 s, this one at 0.0582 s.

>>> from workbench.chain import Chain, Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 1) for i in range(8)))
>>> block_groups(ch, 4)
[(0, 1), (2, 3), (4, 5), (6, 7)]
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from ..chain import Chain, Platform
from ..memory import layer_terms, linear_terms
from ..plan import Plan, infeasible_plan, lower_bound, make_plan, stages_of
from .budget import Budget

__all__ = ["block_groups", "expand_assignment", "expand_plan", "plan_coarse"]

# general allocations on 16 blocks or more: the block ILP runs until BLOCK_SHARE of the time limit,
# (BLOCK_ALONE on fewer blocks), the half-block solve until HALF_SHARE, the search on the fine chain
# until REFINE_END (the rest is
# for the fine lower bound); without a time limit the search stops after STALE_KICKS kicks in a row
# find nothing better
BLOCK_SHARE, BLOCK_ALONE, HALF_SHARE, REFINE_END, STALE_KICKS = 0.2, 0.8, 0.45, 0.98, 25


def block_groups(chain: Chain, blocks: int, platform: Platform | None = None, *,
                 comm_weight: float = 1.0, required: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Cut ``chain`` into ``blocks`` consecutive groups (fewer only if the chain is shorter), as
    ``(first, last)`` pairs. ``required``: layers after which a cut is forced (e.g. the cuts of
    the fine DP's plan, so that plan stays expressible on the blocks).

    A DP over cut positions minimises ``sum over blocks (compute / target - 1)^2
    + comm_weight * sum over cuts (comm time / target)`` with ``target`` =
    total compute / blocks: balanced blocks, cheap cuts. With a finite memory
    limit a block whose minimal footprint (one mini-batch in flight) exceeds
    it is not allowed when avoidable.
    """
    L = len(chain)
    B = max(1, min(int(blocks), L))
    if B >= L:
        return [(i, i) for i in range(L)]
    comp = chain.forward + chain.backward
    pre = np.concatenate([[0.0], np.cumsum(comp)])
    total = pre[-1]
    target = total / B if total > 0 else 1.0
    if platform is not None:
        comm = np.array([platform.comm_time(chain.cut(l)) for l in range(L)])
        lin = linear_terms(layer_terms(chain, platform))
        foot = lin.a + lin.w0             # each layer's memory with one mini-batch in flight
        M = platform.memory
    else:
        cb = chain.cuts
        comm = cb / cb.max() * target * 0.1 if cb.max() > 0 else np.zeros(L)
        foot = np.zeros(L)
        M = math.inf
    fpre = np.concatenate([[0.0], np.cumsum(foot)])
    INF = math.inf
    # D[q][j] = best cost of covering layers 0..j-1 with q blocks
    D = np.full((B + 1, L + 1), INF)
    arg = np.zeros((B + 1, L + 1), dtype=int)
    D[0][0] = 0.0
    i = np.arange(L)
    req = sorted(set(int(r) for r in required if 0 <= r < L - 1))
    B = max(B, len(req) + 1)
    # earliest start of a block ending at j-1: just after the last required cut before j-1
    first_start = np.zeros(L + 1, dtype=int)
    for j in range(1, L + 1):
        r = [x for x in req if x < j - 1]
        first_start[j] = r[-1] + 1 if r else 0
    for q in range(1, B + 1):
        for j in range(q, L + 1):
            starts = i[first_start[j]:j]  # block starts at s, covers s..j-1
            if len(starts) == 0:
                continue
            bc = pre[j] - pre[starts]
            cost = (bc / target - 1.0) ** 2
            if math.isfinite(M):
                cost = cost + np.where(fpre[j] - fpre[starts] > M, 1e6, 0.0)
            cut_pen = comm_weight * comm[j - 1] / target if j < L else 0.0
            tot = D[q - 1][starts] + cost + cut_pen
            s = int(np.argmin(tot))
            D[q][j], arg[q][j] = tot[s], int(starts[s])
    q = B if math.isfinite(D[B][L]) else int(np.argmin(D[1:, L])) + 1
    groups = []
    j = L
    while q > 0:
        s = arg[q][j]
        groups.append((int(s), int(j - 1)))
        j, q = s, q - 1
    return groups[::-1]


def expand_assignment(groups: Sequence[tuple[int, int]], block_assignment: Sequence[int]) -> list[int]:
    """Layer assignment from a block assignment."""
    out: list[int] = []
    for (a, b), d in zip(groups, block_assignment):
        out.extend([int(d)] * (b - a + 1))
    return out


def expand_plan(plan: Plan, chain: Chain, platform: Platform, groups: Sequence[tuple[int, int]]) -> Plan:
    """The fine-chain plan of a block plan: same period, same stage start times."""
    asg = expand_assignment(groups, plan.assignment)
    runs = stages_of(asg)
    assert len(runs) == len(plan.stages)
    return make_plan(chain, platform, plan.period, asg, [s.fwd_start for s in plan.stages],
                     [s.bwd_start for s in plan.stages], method=plan.method, allocation=plan.allocation,
                     status=plan.status, gap=plan.gap, notes=plan.notes)


def plan_coarse(chain: Chain, platform: Platform, *, blocks: int = 32, allocation: str = "contiguous",
                time_limit: float | None = None, groups: Sequence[tuple[int, int]] | None = None,
                progress: Any = None, deterministic: bool = False, budget: Budget | None = None,
                fine_dp: Plan | None = None, **ilp_options: Any) -> Plan:
    """Solve the ILP on ``blocks`` blocks, expand, re-check, compare with the fine DP (see module doc).

    ``time_limit`` covers every phase, the fine lower bound included; ``progress``,
    ``deterministic`` and ``budget`` as for :func:`workbench.planners.ilp.plan_ilp`.
    ``fine_dp``: the exact contiguous DP's plan of ``chain`` if already known."""
    from ..check import check
    from .dp import plan_dp

    budget = budget or Budget(time_limit, deterministic=deterministic, progress=progress)
    if fine_dp is None:
        budget.say(f"ilp: {len(chain)} layers: the exact contiguous DP on them")
        fine_dp = plan_dp(chain, platform, graph=False)
    if not fine_dp.feasible or check(fine_dp, chain, platform):
        fine_dp = None
    req = [b for _, b in stages_of(fine_dp.assignment)][:-1] if fine_dp is not None else []
    budget = budget.child(prefix="")  # the phases' shares are of what the fine DP left
    if groups is None:
        groups = block_groups(chain, blocks, platform, required=req)
    groups = list(groups)
    # general: the block ILP, the cover search on half as many blocks (often exact: the full block
    # count has too many device sets), then a search on the fine chain from the best plan (shares
    # at the top of the module)
    refine = allocation == "general" and platform.devices > 1
    halve = refine and len(groups) >= 16
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        """Record the seconds since the previous phase ended as phase ``name``."""
        phases[name] = budget.elapsed() - sum(phases.values())

    lap("fine_dp")
    block_end = (BLOCK_SHARE if halve else BLOCK_ALONE) if refine else REFINE_END
    cplan = _block_ilp(chain, platform, groups, budget.child(until=block_end, prefix=f"{len(groups)} blocks: "),
                       allocation, ilp_options)
    lap("block_ilp")
    coarse = chain.coarsen(groups)
    comp = coarse.forward + coarse.backward
    extra: dict[str, Any] = {
        "blocks": len(groups), "groups": [list(g) for g in groups],
        "coarse_period": cplan.period if cplan.feasible else None, "coarse_status": cplan.status,
        "coarse_gap": cplan.gap, "largest_block": float(comp.max()), "phase_seconds": phases,
    }
    cand: list[tuple[Plan, str]] = []
    if cplan.feasible:
        fp = expand_plan(cplan, chain, platform, groups)
        bad = check(fp, chain, platform)
        if not bad:
            cand.append((fp, f"ILP on {len(groups)} blocks, expanded"))
        else:
            extra["expanded_rejected"] = str(bad[0])
    if fine_dp is not None:
        cand.append((fine_dp, "fine DP (exact contiguous)"))
    if halve:
        hg = block_groups(chain, len(groups) // 2, platform, required=req)
        hplan = _block_ilp(chain, platform, hg, budget.child(until=HALF_SHARE, default=30.0, prefix=f"{len(hg)} blocks: "),
                           allocation, ilp_options)
        extra["half_blocks"] = {"blocks": len(hg), "status": hplan.status,
                                "period": hplan.period if hplan.feasible else None}
        if hplan.feasible:
            hp = expand_plan(hplan, chain, platform, hg)
            if not check(hp, chain, platform):
                cand.append((hp, f"ILP on {len(hg)} blocks ({hplan.status}), expanded"))
    lap("half_blocks")
    if refine and cand:
        from .ilp_search import guided_search

        start, how = min(cand, key=lambda c: c[0].period)
        secs = budget.phase_seconds(until=REFINE_END, default=20.0)
        budget.say(f"ilp: guided search on the {len(chain)} layers from {start.period:.6g} s, {budget.describe(secs)}")
        better = guided_search(chain, platform, start, deadline=budget.deadline(search="guided_search",
                                                                               until=REFINE_END, default=20.0),
                               max_stages=2 * platform.devices,
                               kicks=None if budget.limited else STALE_KICKS)
        if better is not start and better.period < start.period and not check(better, chain, platform):
            cand.append((better, f"{how}, then a local search on the {len(chain)} layers"))
    lap("refine")
    best_known = min((p.period for p, _ in cand), default=None)
    fine_bound = _fine_bound(chain, platform, best_known, budget)
    lap("bound")
    if allocation == "contiguous" and fine_dp is not None:
        fine_bound = fine_dp.period
    extra["fine_lower_bound"] = fine_bound
    return _coarse_result(chain, platform, cand, cplan, groups, fine_dp, fine_bound, allocation, extra, budget)


def _block_ilp(chain: Chain, platform: Platform, groups: list[tuple[int, int]], budget: Budget, allocation: str,
               ilp_options: dict[str, Any]) -> Plan:
    """The ILP on the chain coarsened to ``groups``."""
    from .ilp import plan_ilp

    budget.say(f"ilp: the ILP on {len(groups)} blocks, {budget.describe(budget.seconds)}")
    opts = {k: v for k, v in ilp_options.items() if k not in ("coarsen", "time_limit", "budget")}
    return plan_ilp(chain.coarsen(groups), platform, allocation=allocation, coarsen=False, budget=budget, **opts)


def _fine_bound(chain: Chain, platform: Platform, best_known: float | None, budget: Budget) -> float:
    """A lower bound for the fine chain: the best of the chain's, the per-layer memory one and the
    stage-path one (cut short, and weaker, when the time is up)."""
    from .ilp_model import memory_period_bound
    from .stage_bound import stage_path_bound

    budget.say(f"ilp: lower bound on the {len(chain)} layers, {budget.describe(budget.phase_seconds())}")
    deadline = budget.deadline(search="bound")
    return max(lower_bound(chain, platform), memory_period_bound(chain, platform),
               stage_path_bound(chain, platform, best_known, deadline=deadline))


def _coarse_result(chain: Chain, platform: Platform, cand: list[tuple[Plan, str]], cplan: Plan,
                   groups: list[tuple[int, int]], fine_dp: Plan | None, fine_bound: float, allocation: str,
                   extra: dict[str, Any], budget: Budget) -> Plan:
    """The best candidate as the ILP's plan, its gap against the fine bound."""
    seconds = budget.elapsed()
    if budget.deterministic:
        extra["deterministic"] = not budget.cut_short
    if not cand:
        why = cplan.notes[0] if cplan.notes else "no plan found"
        p = infeasible_plan(chain, platform, "ilp", f"on {len(groups)} blocks: {why}", allocation=allocation,
                            solve_seconds=seconds, extra=extra)
        return p.with_(status=cplan.status if cplan.status == "timeout" else "infeasible")
    best, src = min(cand, key=lambda c: c[0].period)
    gap = max(0.0, (best.period - fine_bound) / best.period)
    if allocation == "contiguous" and best is fine_dp:
        status, gap = "optimal", 0.0
    elif gap <= 1e-6:
        status = "optimal"
    else:
        status = "timeout" if cplan.status == "timeout" else "feasible"
    notes = (f"coarsened to {len(groups)} blocks; plan from the {src}; gap against the fine lower bound "
             f"{fine_bound:.6g} s (coarse ILP: {cplan.status}, period {cplan.period:.6g} s)",)
    if budget.deterministic and budget.cut_short:
        notes += ("deterministic budgets: the wall-clock safety net stopped a phase; this result may vary",)
    budget.say(f"ilp: {status}, period {best.period:.6g} s, gap {gap:.1%} to the fine bound ({seconds:.1f} s)")
    return best.with_(method="ilp", allocation=allocation, status=status, gap=gap, solve_seconds=seconds,
                      notes=tuple(best.notes) + notes, extra={**best.extra, **extra})
