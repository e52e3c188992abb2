"""The ILP on a long chain: solve on blocks of layers, expand, refine on the layers, bound the gap.

Real networks have 40 to 1,000 layers; :func:`plan_coarse` cuts the chain
into blocks (:func:`workbench.planners.ilp.coarsen.block_groups`), solves the ILP
on the blocks (:func:`workbench.planners.ilp.phases.solve_chain`) and expands
the plan to the layers. Its phases, recorded in ``extra["solve"]``:

1. ``incumbent``: the exact contiguous DP on the layers (always run; its plan
   is a candidate, and its cuts are kept as block boundaries so it stays
   expressible on the blocks);
2. ``block_ilp``: the ILP on the blocks;
3. general allocations on 16 blocks or more, ``half_blocks``: the same solve on
   half as many blocks (where the cover search is often exact, while the full
   block count has too many device sets);
4. general allocations, ``guided_search`` on the layers from the best plan so far
   (:func:`workbench.planners.ilp.search.guided_search`, a descent on the cheap
   path period whose steps are checked exactly);
5. ``fine_bound``: a lower bound on the layers (the chain's, the per-layer
   memory bound :func:`workbench.planners.ilp.bounds.memory_period_bound` and
   the stage-path bound :func:`workbench.planners.ilp.stage_bound.stage_path_bound`;
   for contiguous allocations the exact DP's period).

Their shares of a time limit are :class:`workbench.planners.budget.PhaseShares`
(general on 16 blocks or more: the block ILP until 20 % of the limit, the
half-block solve until 45 %, the guided search until 98 %, the rest for the
bound). What coarsening can cost: the block plan is the best plan among those
that cut only at block boundaries. ``plan.extra`` reports ``fine_lower_bound``,
``largest_block`` (the compute of the heaviest block: a block cannot be split),
``half_blocks``, and the returned ``gap`` is measured against the fine bound, so
it includes what coarsening may have cost.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(12)))
>>> p = plan_coarse(ch, Platform(3, memory_model="paper"), blocks=4)
>>> p.status, p.period, p.extra["blocks"], p.extra["solve"]["found_by"]
('optimal', 12.0, 4, 'block_ilp')
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from workbench.model.chain import Chain, Platform
from workbench.model.plan import Plan, infeasible_plan, lower_bound, stages_of
from workbench.model.plan_extra import PhaseRecord, SolveRecord, phase_record
from workbench.model.tolerances import MILP_GAP
from workbench.planners.budget import Budget
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.bounds import memory_period_bound
from workbench.planners.ilp.coarsen import block_groups, expand_plan
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.phases import solve_chain
from workbench.planners.ilp.search import guided_search
from workbench.planners.ilp.stage_bound import stage_path_bound
from workbench.verify.check import check

__all__ = ["plan_coarse"]


class _Phases:
    """The phases' records: each timed from the end of the previous one."""

    def __init__(self, budget: Budget) -> None:
        self.budget, self.records, self._t = budget, [], budget.elapsed()

    def done(self, phase: str, period: float | None, bound: float | None, outcome: str) -> None:
        now = self.budget.elapsed()
        self.records.append(phase_record(phase, now - self._t, period, bound, outcome))
        self._t = now


def plan_coarse(chain: Chain, platform: Platform, *, blocks: int = 32, allocation: str = "contiguous",
                time_limit: float | None = None, groups: Sequence[tuple[int, int]] | None = None,
                options: IlpOptions | None = None, budget: Budget | None = None, fine_dp: Plan | None = None,
                **ilp_options: Any) -> Plan:
    """The ILP on ``blocks`` blocks of ``chain``, expanded and compared with the fine DP (module docstring).

    ``time_limit`` covers every phase, the fine lower bound included; ``options`` (or ``ilp_options``,
    as for :func:`workbench.planners.ilp.planner.plan_ilp`): the ILP's options. ``fine_dp``: the exact contiguous
    DP's plan of ``chain`` if already known."""
    opts = replace(options, **ilp_options) if options is not None else IlpOptions.of(**ilp_options)
    budget = budget or Budget(time_limit, deterministic=opts.deterministic, progress=opts.progress)
    shares = opts.shares
    if fine_dp is None:
        budget.say(f"ilp: {len(chain)} layers: the exact contiguous DP on them")
        fine_dp = plan_dp(chain, platform, graph=False)
    if not fine_dp.feasible or check(fine_dp, chain, platform):
        fine_dp = None
    req = [b for _, b in stages_of(fine_dp.assignment)][:-1] if fine_dp is not None else []
    budget = budget.child(prefix="")  # the phases' shares are of what the fine DP left
    rec = _Phases(budget)
    rec.done("incumbent", fine_dp.period if fine_dp else None, None,
             "the exact contiguous DP on the layers" if fine_dp else "no contiguous plan fits")
    groups = list(groups) if groups is not None else block_groups(chain, blocks, platform, required=req)
    # the block solves: every option as given but the warm start (the DP's, on the blocks) and the
    # search options (their defaults)
    block_opts = IlpOptions(rel_gap=opts.rel_gap, threads=opts.threads, log=opts.log, warm_start=bool(opts.warm_start),
                            pairwise=opts.pairwise, solver_options=opts.solver_options, shares=shares)
    refine = allocation == "general" and platform.devices > 1
    halve = refine and len(groups) >= 16
    block_end = (shares.block_until if halve else shares.block_alone_until) if refine else shares.refine_until
    cplan = _block_ilp(chain, platform, groups, budget.child(until=block_end, prefix=f"{len(groups)} blocks: "),
                       allocation, block_opts)
    coarse = chain.coarsen(groups)
    comp = coarse.forward + coarse.backward
    extra: dict[str, Any] = {
        "blocks": len(groups), "groups": [list(g) for g in groups],
        "coarse_period": cplan.period if cplan.feasible else None, "coarse_status": cplan.status,
        "coarse_gap": cplan.gap, "largest_block": float(comp.max()),
    }
    cand: list[tuple[Plan, str, str]] = []      # (plan, where it comes from, the phase that found it)
    if cplan.feasible:
        fp = expand_plan(cplan, chain, platform, groups)
        bad = check(fp, chain, platform)
        if not bad:
            cand.append((fp, f"ILP on {len(groups)} blocks, expanded", "block_ilp"))
        else:
            extra["expanded_rejected"] = str(bad[0])
    rec.done("block_ilp", cplan.period if cplan.feasible else None, None, f"{cplan.status} on {len(groups)} blocks")
    if fine_dp is not None:
        cand.append((fine_dp, "fine DP (exact contiguous)", "incumbent"))
    if halve:
        _half_blocks(chain, platform, groups, req, budget, allocation, block_opts, cand, extra)
        rec.done("half_blocks", extra["half_blocks"]["period"], None,
                 f"{extra['half_blocks']['status']} on {extra['half_blocks']['blocks']} blocks")
    if refine and cand:
        improved = _guided(chain, platform, budget, shares, cand)
        rec.done("guided_search", min(p.period for p, _, _ in cand), None,
                 "improved the best plan" if improved else "nothing better")
    best_known = min((p.period for p, _, _ in cand), default=None)
    fine_bound = _fine_bound(chain, platform, best_known, budget)
    rec.done("fine_bound", best_known, fine_bound, f"bound {fine_bound:.6g} s on the {len(chain)} layers")
    if allocation == "contiguous" and fine_dp is not None:
        fine_bound = fine_dp.period
    extra["fine_lower_bound"] = fine_bound
    return _coarse_result(chain, platform, cand, cplan, groups, fine_dp, fine_bound, allocation, extra, budget,
                          rec.records)


def _block_ilp(chain: Chain, platform: Platform, groups: list[tuple[int, int]], budget: Budget, allocation: str,
               opts: IlpOptions) -> Plan:
    """The ILP on the chain coarsened to ``groups``."""
    budget.say(f"ilp: the ILP on {len(groups)} blocks, {budget.describe(budget.seconds)}")
    return solve_chain(chain.coarsen(groups), platform, allocation, opts, budget)


def _half_blocks(chain: Chain, platform: Platform, groups: list[tuple[int, int]], req: list[int], budget: Budget,
                 allocation: str, opts: IlpOptions, cand: list, extra: dict) -> None:
    """The solve on half as many blocks; its expanded plan joins the candidates."""
    shares = opts.shares
    hg = block_groups(chain, len(groups) // 2, platform, required=req)
    hplan = _block_ilp(chain, platform, hg, budget.child(until=shares.half_blocks_until,
                                                         default=shares.half_blocks_seconds,
                                                         prefix=f"{len(hg)} blocks: "), allocation, opts)
    extra["half_blocks"] = {"blocks": len(hg), "status": hplan.status,
                            "period": hplan.period if hplan.feasible else None}
    if hplan.feasible:
        hp = expand_plan(hplan, chain, platform, hg)
        if not check(hp, chain, platform):
            cand.append((hp, f"ILP on {len(hg)} blocks ({hplan.status}), expanded", "half_blocks"))


def _guided(chain: Chain, platform: Platform, budget: Budget, shares, cand: list) -> bool:
    """The guided search on the layers from the best candidate; whether it found a better plan."""
    start, how, _ = min(cand, key=lambda c: c[0].period)
    secs = budget.phase_seconds(until=shares.refine_until, default=shares.refine_seconds)
    budget.say(f"ilp: guided search on the {len(chain)} layers from {start.period:.6g} s, {budget.describe(secs)}")
    better = guided_search(chain, platform, start,
                           deadline=budget.deadline(search="guided_search", until=shares.refine_until,
                                                    default=shares.refine_seconds),
                           max_stages=2 * platform.devices, kicks=None if budget.limited else shares.stale_kicks)
    if better is not start and better.period < start.period and not check(better, chain, platform):
        cand.append((better, f"{how}, then a local search on the {len(chain)} layers", "guided_search"))
        return True
    return False


def _fine_bound(chain: Chain, platform: Platform, best_known: float | None, budget: Budget) -> float:
    """A lower bound for the fine chain: the best of the chain's, the per-layer memory one and the
    stage-path one (cut short, and weaker, when the time is up)."""
    budget.say(f"ilp: lower bound on the {len(chain)} layers, {budget.describe(budget.phase_seconds())}")
    deadline = budget.deadline(search="bound")
    return max(lower_bound(chain, platform), memory_period_bound(chain, platform),
               stage_path_bound(chain, platform, best_known, deadline=deadline))


def _coarse_result(chain: Chain, platform: Platform, cand: list[tuple[Plan, str, str]], cplan: Plan,
                   groups: list[tuple[int, int]], fine_dp: Plan | None, fine_bound: float, allocation: str,
                   extra: dict[str, Any], budget: Budget, records: list[PhaseRecord]) -> Plan:
    """The best candidate as the ILP's plan, its gap against the fine bound."""
    seconds = budget.elapsed()
    if budget.deterministic:
        extra["deterministic"] = not budget.cut_short
    if not cand:
        extra["solve"] = SolveRecord(phases=records, found_by=None, bound_by=None)
        why = cplan.notes[0] if cplan.notes else "no plan found"
        p = infeasible_plan(chain, platform, "ilp", f"on {len(groups)} blocks: {why}", allocation=allocation,
                            solve_seconds=seconds, extra=extra)
        return p.with_(status=cplan.status if cplan.status == "timeout" else "infeasible")
    best, src, phase = min(cand, key=lambda c: c[0].period)
    gap = max(0.0, (best.period - fine_bound) / best.period)
    bound_by = "fine_bound"
    if allocation == "contiguous" and best is fine_dp:
        status, gap, bound_by = "optimal", 0.0, "incumbent"
    elif gap <= MILP_GAP:
        status = "optimal"
    else:
        status = "timeout" if cplan.status == "timeout" else "feasible"
    extra["solve"] = SolveRecord(phases=records, found_by=phase, bound_by=bound_by)
    notes = (f"coarsened to {len(groups)} blocks; plan from the {src}; gap against the fine lower bound "
             f"{fine_bound:.6g} s (coarse ILP: {cplan.status}, period {cplan.period:.6g} s)",)
    if budget.deterministic and budget.cut_short:
        notes += ("deterministic budgets: the wall-clock safety net stopped a phase; this result may vary",)
    budget.say(f"ilp: {status}, period {best.period:.6g} s, gap {gap:.1%} to the fine bound ({seconds:.1f} s)")
    return best.with_(method="ilp", allocation=allocation, status=status, gap=gap, solve_seconds=seconds,
                      notes=tuple(best.notes) + notes, extra={**best.extra, **extra})
