"""The ILP on a long chain: solve on blocks of layers, expand, refine on the layers, bound the gap.

Real networks have 40 to 1,000 layers; :func:`plan_coarse` cuts the chain
into blocks (:func:`workbench.planners.blocks.block_groups`), solves the ILP
on the blocks (:func:`workbench.planners.ilp.phases.solve_chain`) and expands
the plan to the layers. Its phases (run by :func:`workbench.planners.ilp.runner.run_phases`; each
takes the incumbent when its plan is better), recorded in ``extra["solve"]``:

1. ``incumbent``: the exact contiguous DP on the layers (always run; its plan
   is a candidate, and its cuts are kept as block boundaries so it stays
   expressible on the blocks);
2. ``fine_bound``: a lower bound on the layers (the chain's, the per-layer
   memory bound :func:`workbench.planners.ilp.bounds.memory_period_bound` and
   the stage-path bound :func:`workbench.planners.ilp.stage_bound.stage_path_bound`;
   for contiguous allocations the exact DP's period); the phases after it stop
   searching once a plan meets it;
3. general allocations, ``packing``: the bound's stages packed onto the devices
   (:mod:`workbench.planners.ilp.packing`), and under a time limit ``background``: the
   guided search on the layers starts on a second core from the best plan so far;
   ``block_ilp``: the ILP on the blocks;
4. general allocations on 16 blocks or more, ``half_blocks``: the same solve on
   half as many blocks (where the cover search is often exact, while the full
   block count has too many device sets);
5. general allocations, ``guided_search`` on the layers from the best plan so far
   (:func:`workbench.planners.ilp.search.guided_search`, a descent on the cheap
   path period whose steps are checked exactly), and the second core's plan
   (``background``, :mod:`workbench.planners.ilp.background`);
6. no phase of its own (:func:`coarse_verdict`): the incumbent's status and its gap
   against the fine bound.

Their shares of a time limit are :class:`workbench.planners.budget.PhaseShares`
(general on 16 blocks or more: the bound until 20 % of the limit, the packing
until 30 %, the block ILP until 45 %, the half-block solve until 65 %, the guided
search until 98 %). What
coarsening can cost: the block plan is the best plan among those that cut only at
block boundaries. ``plan.extra`` reports ``fine_lower_bound``,
``largest_block`` (the compute of the heaviest block: a block cannot be split),
``half_blocks``, and the returned ``gap`` is measured against the fine bound, so
it includes what coarsening may have cost.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(12)))
>>> p = plan_coarse(ch, Target.of(3, memory_model="paper"), blocks=4)
>>> p.status, p.period, p.extra["solve"]["found_by"]    # the fine DP's plan meets the bound: no block solve
('optimal', 12.0, 'incumbent')
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Sequence

from workbench.model.chain import Chain
from workbench.model.plan import Plan, lower_bound, stages_of
from workbench.model.target import Target
from workbench.model.tolerances import BETTER, MILP_GAP
from workbench.planners.blocks import block_groups
from workbench.planners.budget import Budget
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.background import start_search
from workbench.planners.ilp.bounds import memory_period_bound
from workbench.planners.ilp.coarsen import expand_plan
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.packing import packed_plan
from workbench.planners.ilp.phases import solve_chain
from workbench.planners.ilp.runner import PhaseResult, Run, Verdict, run_phases
from workbench.planners.ilp.search import guided_search
from workbench.planners.ilp.stage_bound import stage_path_bound
from workbench.verify.check import check

__all__ = ["plan_coarse"]


@dataclass
class _Blocks:
    """What the phases of a coarsened solve share: the blocks, the fine DP's plan and cuts, the block
    solves' options, whether general plans are refined (and the blocks halved), and ``extra``, the
    fields the plan reports (``blocks``, ``groups``, ``coarse_period``, ...)."""

    count: int
    given: list[tuple[int, int]] | None
    required: list[int]
    fine_dp: Plan | None
    opts: IlpOptions
    refine: bool
    groups: list[tuple[int, int]] = field(default_factory=list)
    halve: bool = False
    cplan: Plan | None = None
    source: str = ""       #: where the incumbent comes from, in words
    extra: dict[str, Any] = field(default_factory=dict)


def plan_coarse(chain: Chain, platform: Target, *, blocks: int = 32, allocation: str = "contiguous",
                time_limit: float | None = None, groups: Sequence[tuple[int, int]] | None = None,
                options: IlpOptions | None = None, budget: Budget | None = None, fine_dp: Plan | None = None,
                **ilp_options: Any) -> Plan:
    """The ILP on ``blocks`` blocks of ``chain``, expanded and compared with the fine DP (module docstring).

    ``time_limit`` covers every phase, the fine lower bound included; ``options`` (or ``ilp_options``,
    as for :func:`workbench.planners.ilp.planner.plan_ilp`): the ILP's options. ``fine_dp``: the exact contiguous
    DP's plan of ``chain`` if already known."""
    opts = replace(options, **ilp_options) if options is not None else IlpOptions.of(**ilp_options)
    budget = budget or Budget(time_limit, deterministic=opts.deterministic, progress=opts.progress)
    if fine_dp is None:
        budget.say(f"ilp: {len(chain)} layers: the exact contiguous DP on them")
        fine_dp = plan_dp(chain, platform, graph=False)
    if not fine_dp.feasible or check(fine_dp, chain, platform):
        fine_dp = None
    req = [b for _, b in stages_of(fine_dp.assignment)][:-1] if fine_dp is not None else []
    budget = budget.child(prefix="")  # the phases' shares are of what the fine DP left
    # the block solves: every option as given but the warm start (the DP's, on the blocks) and the
    # search options (their defaults); the second core searches the layers (background_phase), not the blocks
    block_opts = IlpOptions(rel_gap=opts.rel_gap, threads=opts.threads, log=opts.log, warm_start=bool(opts.warm_start),
                            pairwise=opts.pairwise, solver_options=opts.solver_options, shares=opts.shares,
                            parallel=False)
    refine = allocation == "general" and platform.devices > 1
    run = Run(chain, platform, allocation, opts, budget)
    state = _Blocks(blocks, list(groups) if groups is not None else None, req, fine_dp, block_opts, refine)
    return run_phases(run, [partial(phase, blocks=state) for phase in (
        fine_dp_phase, fine_bound_phase, bound_met_verdict, packing_phase, background_phase, block_ilp_phase,
        half_blocks_phase, guided_search_phase, background_result_phase, coarse_verdict)])


# ----------------------------------------------------------------------------
# the phases
# ----------------------------------------------------------------------------
def fine_dp_phase(run: Run, blocks: _Blocks) -> PhaseResult:
    """The exact contiguous DP on the layers (computed before the phases' budget): the first incumbent."""
    dp = blocks.fine_dp
    blocks.source = "fine DP (exact contiguous)"
    return run.result("incumbent", dp, None,
                      "the exact contiguous DP on the layers" if dp else "no contiguous plan fits")


def block_ilp_phase(run: Run, blocks: _Blocks) -> PhaseResult:
    """The ILP on the blocks (the fine DP's cuts kept as block boundaries), expanded to the layers: the
    incumbent unless the fine DP's plan is better."""
    chain, platform, budget, shares = run.chain, run.platform, run.budget, run.opts.shares
    groups = blocks.given if blocks.given is not None else block_groups(chain, blocks.count, platform,
                                                                         required=blocks.required)
    blocks.groups = groups
    blocks.halve = blocks.refine and len(groups) >= 16
    block_end = (shares.block_until if blocks.halve else shares.block_alone_until) if blocks.refine \
        else shares.refine_until
    cplan = _block_ilp(chain, platform, groups, budget.child(until=block_end, prefix=f"{len(groups)} blocks: "),
                       run.allocation, blocks.opts)
    blocks.cplan = cplan
    coarse = chain.coarsen(groups)
    comp = coarse.forward + coarse.backward
    blocks.extra.update({
        "blocks": len(groups), "groups": [list(g) for g in groups],
        "coarse_period": cplan.period if cplan.feasible else None, "coarse_status": cplan.status,
        "coarse_gap": cplan.gap, "largest_block": float(comp.max()),
    })
    inc = run.inc
    if cplan.feasible:
        fp = expand_plan(cplan, chain, platform, groups)
        bad = check(fp, chain, platform)
        if not bad:
            if inc is None or fp.period <= inc.period:     # a tie goes to the block plan
                inc, blocks.source = fp, f"ILP on {len(groups)} blocks, expanded"
        else:
            blocks.extra["expanded_rejected"] = str(bad[0])
    return run.result("block_ilp", inc, None, f"{cplan.status} on {len(groups)} blocks")


def _block_ilp(chain: Chain, platform: Target, groups: list[tuple[int, int]], budget: Budget, allocation: str,
               opts: IlpOptions) -> Plan:
    """The ILP on the chain coarsened to ``groups``."""
    budget.say(f"ilp: the ILP on {len(groups)} blocks, {budget.describe(budget.seconds)}")
    return solve_chain(chain.coarsen(groups), platform, allocation, opts, budget)


def half_blocks_phase(run: Run, blocks: _Blocks) -> PhaseResult | None:
    """General plans on 16 blocks or more: the same solve on half as many blocks (where the cover
    search is often exact); its expanded plan becomes the incumbent if better."""
    if not blocks.halve or _meets_bound(run, blocks):
        return None
    chain, platform, shares = run.chain, run.platform, run.opts.shares
    hg = block_groups(chain, len(blocks.groups) // 2, platform, required=blocks.required)
    hplan = _block_ilp(chain, platform, hg, run.budget.child(until=shares.half_blocks_until,
                                                             default=shares.half_blocks_seconds,
                                                             prefix=f"{len(hg)} blocks: "), run.allocation, blocks.opts)
    blocks.extra["half_blocks"] = {"blocks": len(hg), "status": hplan.status,
                                   "period": hplan.period if hplan.feasible else None}
    inc = run.inc
    if hplan.feasible:
        hp = expand_plan(hplan, chain, platform, hg)
        if not check(hp, chain, platform) and (inc is None or hp.period < inc.period):
            inc, blocks.source = hp, f"ILP on {len(hg)} blocks ({hplan.status}), expanded"
    return run.result("half_blocks", inc, None, f"{hplan.status} on {len(hg)} blocks")


def guided_search_phase(run: Run, blocks: _Blocks) -> PhaseResult | None:
    """General plans: the guided search on the layers from the incumbent."""
    start = run.inc
    if not blocks.refine or start is None or _meets_bound(run, blocks):
        return None
    chain, platform, budget, shares = run.chain, run.platform, run.budget, run.opts.shares
    secs = budget.phase_seconds(until=shares.refine_until, default=shares.refine_seconds)
    budget.say(f"ilp: guided search on the {len(chain)} layers from {start.period:.6g} s, {budget.describe(secs)}")
    better = guided_search(chain, platform, start,
                           deadline=budget.deadline(search="guided_search", until=shares.refine_until,
                                                    default=shares.refine_seconds),
                           max_stages=2 * platform.devices, kicks=None if budget.limited else shares.stale_kicks,
                           target=blocks.extra["fine_lower_bound"] * (1 + run.opts.rel_gap))
    if better is not start and better.period < start.period and not check(better, chain, platform):
        blocks.source = f"{blocks.source}, then a local search on the {len(chain)} layers"
        return run.result("guided_search", better, None, "improved the best plan")
    return run.result("guided_search", start, None, "nothing better")


def fine_bound_phase(run: Run, blocks: _Blocks) -> PhaseResult:
    """A lower bound for the fine chain, before the searches (which stop once a plan meets it): the best of the
    chain's, the per-layer memory one and the stage-path one (cut short, and weaker, when its share of the time
    is up); for contiguous allocations the exact DP's period."""
    chain, platform, budget, shares = run.chain, run.platform, run.budget, run.opts.shares
    if run.allocation == "contiguous" and blocks.fine_dp is not None:
        bound = blocks.fine_dp.period
        what = "the exact contiguous DP's period"
    else:
        best_known = run.inc.period if run.inc is not None else None
        budget.say(f"ilp: lower bound on the {len(chain)} layers, "
                   f"{budget.describe(budget.phase_seconds(until=shares.fine_bound_until))}")
        deadline = budget.deadline(search="bound", until=shares.fine_bound_until)
        bound = max(lower_bound(chain, platform), memory_period_bound(chain, platform),
                    stage_path_bound(chain, platform, best_known, deadline=deadline))
        what = "the stage-path bound"
    blocks.extra["fine_lower_bound"] = bound
    return run.result("fine_bound", run.inc, bound, f"{what}: {bound:.6g} s on the {len(chain)} layers")


def bound_met_verdict(run: Run, blocks: _Blocks) -> Verdict | None:
    """No phase of its own: when the fine DP's plan already meets the fine bound it is optimal (no block solve)."""
    if not _meets_bound(run, blocks):
        return None
    blocks.source = "fine DP (exact contiguous)"
    return Verdict("optimal", 0.0, ("the exact contiguous DP's plan meets the lower bound on the layers",),
                   blocks.extra, bound_by="fine_bound" if run.allocation == "general" else "incumbent")


def packing_phase(run: Run, blocks: _Blocks) -> PhaseResult | None:
    """General plans: the fine bound's stages packed onto the devices and timed exactly
    (:mod:`workbench.planners.ilp.packing`), until ``shares.packing_until`` of the limit."""
    if not blocks.refine or run.inc is None or _meets_bound(run, blocks):
        return None
    budget, shares = run.budget, run.opts.shares
    budget.say(f"ilp: the bound's stages packed onto the devices, "
               f"{budget.describe(budget.phase_seconds(until=shares.packing_until, default=10.0))}")
    deadline = budget.deadline(search="guided_search", until=shares.packing_until, default=10.0)
    found = packed_plan(run.chain, run.platform, blocks.extra["fine_lower_bound"], run.inc, deadline)
    if found is None or check(found, run.chain, run.platform):
        return run.result("packing", run.inc, None, "nothing better")
    blocks.source = "the fine bound's stages packed onto the devices"
    return run.result("packing", found, None, f"period {found.period:.6g} s")


def background_phase(run: Run, blocks: _Blocks) -> PhaseResult | None:
    """General plans under a time limit: the guided search (then the local search with kicks) on the layers from
    the fine DP's plan starts on a second core (:mod:`workbench.planners.ilp.background`) and runs while the block
    solves and the guided search of this process do, until ``shares.refine_until`` of the limit."""
    budget, opts = run.budget, run.opts
    if not (blocks.refine and run.inc is not None and opts.parallel and budget.limited and not budget.deterministic
            and not _meets_bound(run, blocks)):
        return None
    secs = budget.phase_seconds(until=opts.shares.refine_until) or 0.0
    run.background = start_search(run.chain, run.platform, run.inc, time.perf_counter() + secs,
                                  target=blocks.extra["fine_lower_bound"] * (1 + opts.rel_gap))
    if run.background is None:
        return None
    budget.say(f"ilp: guided search on the {len(run.chain)} layers on a second core, {budget.describe(secs)}")
    return run.result("background", run.inc, None, "started on a second core")


def background_result_phase(run: Run, blocks: _Blocks) -> PhaseResult | None:
    """The second core's plan, if it beats the incumbent (re-checked)."""
    if run.background is None:
        return None
    bg = run.background.result()
    if bg is None or not bg.feasible or check(bg, run.chain, run.platform) or (
            run.inc is not None and bg.period >= run.inc.period * (1 - BETTER)):
        return run.result("background", run.inc, None, "nothing better")
    blocks.source = f"guided search on the {len(run.chain)} layers on a second core"
    return run.result("background", bg, None, f"period {bg.period:.6g} s")


def _meets_bound(run: Run, blocks: _Blocks) -> bool:
    """Whether the incumbent already meets the fine bound (the searches after it have nothing to find)."""
    return run.inc is not None and run.inc.period <= blocks.extra["fine_lower_bound"] * (1 + run.opts.rel_gap)


def coarse_verdict(run: Run, blocks: _Blocks) -> Verdict:
    """The incumbent's status and gap against the fine bound (the contiguous DP's plan is optimal)."""
    cplan, groups, extra = blocks.cplan, blocks.groups, blocks.extra
    if run.inc is None:
        why = cplan.notes[0] if cplan.notes else "no plan found"
        return Verdict(cplan.status if cplan.status == "timeout" else "infeasible",
                       notes=(f"on {len(groups)} blocks: {why}",), extra=extra)
    best, fine_bound = run.inc, extra["fine_lower_bound"]
    gap = max(0.0, (best.period - fine_bound) / best.period)
    bound_by = "fine_bound"
    if run.allocation == "contiguous" and best is blocks.fine_dp:
        status, gap, bound_by = "optimal", 0.0, "incumbent"
    elif gap <= MILP_GAP:
        status = "optimal"
    else:
        status = "timeout" if cplan.status == "timeout" else "feasible"
    note = (f"coarsened to {len(groups)} blocks; plan from the {blocks.source}; gap against the fine lower bound "
            f"{fine_bound:.6g} s (coarse ILP: {cplan.status}, period {cplan.period:.6g} s)")
    return Verdict(status, gap, (note,), extra, bound_by=bound_by, against=" to the fine bound")
