"""``dp`` with ``activations="auto"``: the best contiguous plan that also chooses every layer's
activation policy (keep, recompute or offload; docs/model.md, "Activation policies").

The memory DP of :mod:`workbench.planners.dp.contiguous` keeps, per suffix of the chain, the least window
of its first stage, because every stage upstream only gains from a smaller downstream window.
With policies a stage ``i..j`` has many versions, one per policy vector
(:mod:`workbench.planners.dp.versions`), and three things couple it to its neighbours: its first
layer's activations and peak depend on the policy of layer i-1 (storage shared across the boundary
while layer i-1 keeps its saved output), and the stage downstream depends in the same way on the
policy of layer j. So the state becomes ``D[q][i][p]``: the least window of a q-stage suffix
starting at layer i when layer i-1 has policy p; the recurrence tries every first stage ``i..j``
and every version of it, and reads ``D[q-1][j+1][policy of j]``. It is exact for the same reason
as without policies: a version's window, in-flight count and memory are non-decreasing in the
downstream window.

At a period T a version of a non-last stage with downstream window ``w`` has
``raw = F + B + R + 2c + w``, ``k = ceil(raw / T)`` and window ``raw``, or
``(k-1) T + F + B + R + 2X/h`` when the gap must grow (modulo T it must hold the round trip
and leave the forward and backward apart); the last stage has window ``F + B + R + 2X/h``.
Versions with ``F + B + R + 2X/h > T`` or memory above M at their k are out. The least
period is searched as in ``dp`` (:func:`workbench.bisection.least_feasible`), each
probe's answer re-timed exactly on its effective chain.

**What it proves.** With every stage's versions exact (no group thinned) the plan is optimal
among contiguous plans in this layer order. Otherwise (the row budget of
:mod:`workbench.planners.dp.versions` thinned some groups) the plan is a real plan, and the same
DP with the relaxation rows is a *lower bound* (bisected to :data:`BOUND_PRECISION`): the answer
says "not proven optimal" and its gap. Long chains whose stages are too many for the budget
(:data:`STEP_BUDGET`) plan on stage boundaries at :data:`BLOCKS` blocks
(:func:`workbench.planners.blocks.block_groups`, the keep plan's cuts among them); their bound is
then the one every contiguous plan meets: the unconstrained keep period and the least memory
each layer needs under any policy (:func:`workbench.planners.ilp.bounds.memory_period_bound` does
this for the ILP; here :func:`_memory_bound`). A ``deadline`` stops the search with the best plan
found (``complete=False``).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
>>> a = auto_on_chain(ch, Target.of(2, memory=300, memory_model="paper", host_bandwidth=100))
>>> a.period, a.bounds, a.policies, a.why   # keep alone: 9 s under 300 bytes; recompute layer 0 or 1: a tie
(7.0, [(0, 1), (2, 3)], ('recompute', 'keep', 'keep', 'keep'), '')
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from workbench.bisection import bisect, least_feasible
from workbench.model.activations import POLICIES, apply_policies, policy_terms
from workbench.model.chain import Chain
from workbench.model.target import Target
from workbench.model.tolerances import CEIL_SLACK, COUNT_SLACK, MEMORY_SLACK, TINY, ceil_counts
from workbench.model.units import format_bytes
from workbench.planners.blocks import block_groups
from workbench.planners.dp import versions as _versions
from workbench.planners.dp.versions import Versions, stage_ends, stage_versions
from workbench.planners.partition import SuffixLinks, bottleneck_partition, place, unconstrained_period
from workbench.schedules.builder import Scheduler

__all__ = ["auto_on_chain", "AutoAnswer", "least_memory_plan", "INEXACT", "STEP_BUDGET", "BLOCKS", "BOUND_PRECISION",
           "LEAST_MEMORY_ROWS"]

_N = len(POLICIES)
_OFF = POLICIES.index("offload")
#: extension steps (a stage grown by one layer, for one start and incoming policy) at most before the stage
#: boundaries are restricted to blocks; about 1 ms each
STEP_BUDGET = 12_000
#: blocks a long chain's stage boundaries are restricted to
BLOCKS = 48
#: relative precision of the lower bound from the relaxation rows
BOUND_PRECISION = 1e-3
#: the exact versions of the least memory (:func:`least_memory_plan`) at most this many rows
LEAST_MEMORY_ROWS = 500_000



def step_budget() -> int:
    """:data:`STEP_BUDGET` as it is now (tests lower it)."""
    return STEP_BUDGET


INEXACT = "not proven optimal: activation-policy versions thinned to fit the row budget"


@dataclass(frozen=True)
class AutoAnswer:
    """What :func:`auto_on_chain` found: the period and the partition and policies reaching it (None: no
    plan), ``why`` it is not a proven optimum or why there is none ("" for a proven optimum), a proven
    lower bound on every contiguous plan with policies of this chain, and whether the search ended
    (False: the deadline stopped it)."""

    period: float
    bounds: list[tuple[int, int]] | None
    policies: tuple[str, ...] | None
    why: str
    lower: float
    complete: bool = True


def _windows(v: Versions, chain: Chain, platform: Target, T: float, links: SuffixLinks):
    """The memory DP at period T over the rows of ``v``: per q, (D[q][0][0], q, argrow table)."""
    L = len(chain)
    tolT = T * (1 + CEIL_SLACK)
    M = platform.memory_limit * (1 + MEMORY_SLACK)
    fits_T = v.FB + v.host <= tolT
    grp = v.i * _N + v.cls
    D_prev = None
    best: list[tuple[float, int, np.ndarray]] = []
    for q in range(1, min(platform.devices, L) + 1):
        if q == 1:
            ok = fits_T & (v.j == L - 1)
            window = v.FB + v.host
            ok &= v.memory(np.ones_like(window)) <= M
        else:
            c = links.after(q)
            down = np.where(v.j < L - 1, D_prev[np.minimum(v.j + 1, L - 1), v.end], np.inf)
            ok = fits_T & np.isfinite(down) & (c[v.j] <= tolT)
            raw = v.FB + 2 * c[v.j] + np.where(ok, down, 0.0)
            k = ceil_counts(raw / T)
            window = np.where(raw - (k - 1) * T < v.FB + v.host, (k - 1) * T + v.FB + v.host, raw)
            ok &= v.memory(k) <= M
        if not ok.any():
            break
        Dc = np.full(L * _N, np.inf)
        np.minimum.at(Dc, grp[ok], window[ok])
        arg = np.full(L * _N, -1)
        hit = np.flatnonzero(ok & (window == Dc[grp]))
        first_of, at = np.unique(grp[hit], return_index=True)
        arg[first_of] = hit[at]
        D = Dc.reshape(L, _N)[np.arange(L)[:, None], v.cls_of]        # (L, N): by incoming policy
        best.append((float(D[0, 0]), q, arg))
        D_prev = D
    return best


def _windows_fit(v: Versions, chain: Chain, platform: Target, T: float, links: SuffixLinks) -> bool:
    """Whether the DP over the rows of ``v`` finds a plan at period T."""
    best = _windows(v, chain, platform, T, links)
    return bool(best) and any(math.isfinite(b[0]) for b in best)


def _probe(v: Versions, chain: Chain, platform: Target, T: float, links: SuffixLinks, deadline: float | None):
    """The DP at T over real rows: (bounds, policies) of the least first window, or None."""
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutError("dp auto: time limit")
    best = _windows(v, chain, platform, T, links)
    if not best or not any(math.isfinite(b[0]) for b in best):
        return None
    _, q, _ = min(best, key=lambda b: (b[0], b[1]))
    bounds: list[tuple[int, int]] = []
    policies: list[int] = []
    i, pp = 0, 0
    for qq in range(q, 0, -1):
        row = int(best[qq - 1][2][i * _N + v.cls_of[i, pp]])
        bounds.append((i, int(v.j[row])))
        policies.extend(v.policies(row))
        i, pp = int(v.j[row]) + 1, int(v.end[row])
    return bounds, tuple(POLICIES[p] for p in policies)


def _least_memory(v: Versions, L: int, P: int) -> float:
    """A lower bound on the memory any contiguous plan needs with policies chosen (every k = 1)."""
    least = np.full((L, L), np.inf)
    np.minimum.at(least, (v.i, v.j), v.memory(np.ones_like(v.A)))
    return bottleneck_partition(least, P)[0]


def least_memory_plan(chain: Chain, platform: Target, links: SuffixLinks, T: float, deadline: float | None = None
                      ) -> tuple[float, tuple[list[tuple[int, int]], tuple[str, ...]] | None] | None:
    """The least memory any contiguous plan with per-layer policies needs (every stage one mini-batch in flight:
    a period ``T`` at which every k is 1), exactly, and a plan of that memory if it fits ``platform.memory_limit``
    (its partition and policies; None if it does not); None when the exact versions go over their budget (the
    stages over :func:`step_budget`'s extension steps, or the rows over :data:`LEAST_MEMORY_ROWS`) or past
    ``deadline``. The versions of :func:`~workbench.planners.dp.versions.stage_versions` with ``memory_only``
    (no time, far fewer); a bisection over their memories, each probe the DP at T with that memory as the limit."""
    if _steps(stage_ends(chain, math.inf)) > step_budget():
        return None
    try:
        v = stage_versions(chain, platform.with_(memory=math.inf), strict=True, memory_only=True,
                           row_budget=LEAST_MEMORY_ROWS, deadline=deadline)
    except (_versions.OverBudget, TimeoutError):
        return None
    values = np.unique(v.memory(np.ones_like(v.A)))
    if not len(values) or not _windows_fit(v, chain, platform.with_(memory=float(values[-1])), T, links):
        return (math.inf, None)
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _windows_fit(v, chain, platform.with_(memory=float(values[mid])), T, links):
            hi = mid
        else:
            lo = mid + 1
    need = float(values[hi])
    fits = need <= platform.memory_limit * (1 + MEMORY_SLACK)
    return need, (_probe(v, chain, platform, T, links, None) if fits else None)


def _memory_bound(chain: Chain, platform: Target) -> float:
    """The least T at which every layer, at the least memory any policy gives it and with
    ``k >= ceil(D_l / T)`` (D_l: the compute from layer l to the end and back), fits P M in all:
    a lower bound on every plan's period."""
    from workbench.planners.ilp.bounds import memory_period_bound  # the ILP's bound, one copy
    from workbench.planners.ilp.policies import minimal_terms

    return memory_period_bound(chain, platform, minimal_terms(policy_terms(chain, platform)))


def _stage_plan(chain: Chain, platform: Target, upper: float | None, cuts: Sequence[int]
                ) -> tuple[dict | None, int, str]:
    """The stage boundaries to build versions for (None: every layer), the extension steps they cost and why
    they are restricted: when the stages under ``upper`` cost more than :func:`step_budget` steps or more rows
    than the row budget holds at the least cap, block boundaries (at most :data:`BLOCKS` blocks, fewer on long
    chains so that both fit; the boundaries ``cuts`` among them)."""
    load = upper if upper is not None else math.inf
    every = stage_ends(chain, load)
    steps = _steps(every)
    if steps <= step_budget() and _fits_rows(every):
        return None, steps, ""
    free = platform.with_(memory=math.inf)
    # B starts reach about steps / L layers each, and B^2 / 2 stages at most: the largest B both budgets allow
    reach = max(steps / len(chain), 1.0)
    rows = _versions.ROW_BUDGET / (2 * _versions.MIN_CAP * _N ** 3)
    blocks = int(max(len(cuts) + 2, min(BLOCKS, step_budget() / reach, math.sqrt(2 * rows))))
    for _ in range(3):
        groups = block_groups(chain, blocks, free, required=cuts)
        stops = [b for _, b in groups]
        blocked = stage_ends(chain, load, {a: [j for j in stops if j >= a] for a, _ in groups})
        if (_steps(blocked) <= step_budget() and _fits_rows(blocked)) or blocks <= len(cuts) + 2:
            break
        blocks = max(len(cuts) + 2, blocks * 2 // 3)
    note = (f"stage boundaries restricted to {len(groups)} blocks (stages on every layer: {steps} stage extensions "
            f"and {sum(map(len, every.values()))} stages; budgets {step_budget()} and "
            f"{_versions.ROW_BUDGET} version rows)")
    return blocked, _steps(blocked), note


def _build(chain: Chain, platform: Target, allowed: Sequence[tuple[int, int]] | None, upper: float | None,
           cuts: Sequence[int], row_budget: int | None, deadline: float | None) -> tuple[Versions, str]:
    """The stage versions and why their stage boundaries are restricted ("" if not): the exact attempt
    (every stage, every undominated version) when the stages are few enough, and if it goes over its budget,
    the budgeted build of :func:`_stage_plan`'s stages."""
    budget = row_budget if row_budget is not None else _versions.ROW_BUDGET
    load = upper if upper is not None and math.isfinite(upper) else math.inf
    k_lo = None
    if math.isfinite(load):
        down = np.cumsum((chain.forward + chain.backward)[::-1])[::-1]
        k_lo = np.maximum(1, np.ceil(down / (load * (1 + CEIL_SLACK)) - COUNT_SLACK)).astype(int)
    if allowed is not None:
        ends = {a: sorted(b for aa, b in allowed if aa == a) for a, _ in allowed}
    else:
        every = stage_ends(chain, load)
        if _steps(every) <= step_budget() and sum(map(len, every.values())) <= budget:
            try:
                return stage_versions(chain, platform, None, max_load=load, k_lo=k_lo, row_budget=budget,
                                      deadline=deadline, strict=True), ""
            except _versions.OverBudget:
                pass
        ends, _, why = _stage_plan(chain, platform, upper, cuts)
        return stage_versions(chain, platform, ends, max_load=load, k_lo=k_lo, row_budget=budget,
                              deadline=deadline), why
    return stage_versions(chain, platform, ends, max_load=load, k_lo=k_lo, row_budget=budget, deadline=deadline), ""


def _fits_rows(ends: dict[int, list[int]]) -> bool:
    """Whether these stages' groups can keep :data:`~workbench.planners.dp.versions.MIN_CAP` versions each (with
    every start's three incoming classes apart) within the row budget."""
    cells = sum(len(e) for e in ends.values()) * _N ** 3
    return 2 * _versions.MIN_CAP * cells <= _versions.ROW_BUDGET


def _steps(ends: dict[int, list[int]]) -> int:
    """The extension steps building the versions of these stages costs (per start: up to its last end)."""
    return sum(e[-1] - i + 1 for i, e in ends.items() if e)


def auto_on_chain(chain: Chain, platform: Target, allowed: Sequence[tuple[int, int]] | None = None, *,
                  upper: float | None = None, deadline: float | None = None, cuts: Sequence[int] = (),
                  row_budget: int | None = None) -> AutoAnswer:
    """The best contiguous plan with per-layer policies (only the stages in ``allowed`` when given, e.g. one
    partition's), as an :class:`AutoAnswer`. ``upper``: a period some plan with policies reaches (stages with
    more compute are left out; nothing found means nothing below it); ``cuts``: layers after which a long
    chain's blocks cut (that plan's stage ends); ``deadline``: a ``perf_counter`` time that stops the search
    with the best plan found (a ``TimeoutError`` if none yet). ``row_budget``: the versions' row budget
    (default :data:`workbench.planners.dp.versions.ROW_BUDGET`)."""
    L = len(chain)
    links = SuffixLinks(chain, platform)
    t0 = max(unconstrained_period(chain, platform, links.least)[0], TINY)
    v, why_blocks = _build(chain, platform, allowed, upper, cuts, row_budget, deadline)
    real = v.subset(v.real) if not v.exact else v
    c = links.most
    host_all = 2 * sum(platform.host_time(float(np.sum(l))) for l in policy_terms(chain, platform).offloaded[_OFF:])
    hi = (t0 + 2 * float(np.sum(chain.forward)) + float(np.sum(chain.backward)) + 2 * float(c.sum()) + host_all) * 1.01
    if upper is not None and math.isfinite(upper):
        hi = min(hi, upper * (1 + 1e-6))

    def exact(found) -> float:
        bounds, pol = found
        best = Scheduler(apply_policies(chain, pol), platform, place(bounds, platform)).best()
        return best.period if best.feasible else math.inf

    stop = (lambda lo, hi_: time.perf_counter() > deadline) if deadline is not None else None
    found = least_feasible(t0, hi, lambda T: _probe(real, chain, platform, T, links, deadline), exact, stop=stop)
    why = "; ".join(w for w in (why_blocks, "" if v.exact else INEXACT) if w)
    why = f"not proven optimal: {why}" if why_blocks else why
    if found is None:
        if upper is not None and math.isfinite(upper):     # nothing below the caller's plan
            lower = upper if not why else _lower_bound(chain, platform, v, links, t0, upper, bool(why_blocks), deadline)
            return AutoAnswer(math.inf, None, None, why, lower)
        settled = (_settle_by_least_memory(chain, platform, links, hi, exact, t0, deadline)
                   if why_blocks or not v.exact else None)
        if settled is not None:
            return settled
        unproven = bool(why_blocks) or (not v.exact and _windows_fit(v, chain, platform, hi, links))
        if unproven and math.isfinite(_memory_bound(chain, platform)):
            where = "on the blocks' boundaries" if why_blocks else "among the thinned activation-policy versions"
            return AutoAnswer(math.inf, None, None, f"no plan found {where} (not proven that none fits)", t0,
                              complete=False)
        if unproven:
            return AutoAnswer(math.inf, None, None, (
                f"no plan fits in {format_bytes(platform.memory_limit)} per device even with recompute and offload "
                f"chosen per layer: even the least memory any policy gives each layer, with one mini-batch in "
                f"flight, does not fit {platform.devices} devices"), t0)
        need = _least_memory(v, L, platform.devices) if len(v.A) else math.inf
        if not math.isfinite(need):     # the stages that fit cannot cover the chain: no least memory to name
            return AutoAnswer(math.inf, None, None, (
                f"no contiguous plan fits in {format_bytes(platform.memory_limit)} per device even with recompute and "
                f"offload chosen per layer: no {platform.devices} stages that fit, with one mini-batch in flight "
                f"each, cover the {L} layers"), t0)
        return AutoAnswer(math.inf, None, None, (
            f"no contiguous plan fits in {format_bytes(platform.memory_limit)} per device even with recompute and "
            f"offload chosen per layer: the least memory one needs on {platform.devices} devices is "
            f"{'' if v.exact else 'at least '}{format_bytes(need)} (one mini-batch in flight per stage)"), t0)
    bounds, pol = found.structure
    if not why:
        return AutoAnswer(found.period, bounds, pol, "", found.lower, found.complete)
    lower = _lower_bound(chain, platform, v, links, t0, found.period, bool(why_blocks), deadline)
    return AutoAnswer(found.period, bounds, pol, why, lower, found.complete)


def _settle_by_least_memory(chain: Chain, platform: Target, links: SuffixLinks, hi: float, exact, t0: float,
                            deadline: float | None) -> AutoAnswer | None:
    """When the search over thinned versions found no plan: the exact least memory (:func:`least_memory_plan`)
    proves that none fits, or gives the plan of least memory (a plan, not a proven optimum); None when the exact
    versions are over budget or past ``deadline``."""
    least = least_memory_plan(chain, platform, links, hi, deadline)
    if least is None:
        return None
    need, plan = least
    if plan is not None and math.isfinite(period := exact(plan)):
        return AutoAnswer(period, plan[0], plan[1], "not proven optimal: the plan of least memory (the search over "
                                                    "thinned activation-policy versions found none)", t0)
    if plan is not None:    # pragma: no cover - a plan of least memory fits at a long enough period
        return None
    what = (f"the least memory one needs on {platform.devices} devices is {format_bytes(need)} (one mini-batch "
            "in flight per stage)" if math.isfinite(need) else
            f"no {platform.devices} stages that fit, with one mini-batch in flight each, cover the {len(chain)} layers")
    return AutoAnswer(math.inf, None, None, f"no contiguous plan fits in {format_bytes(platform.memory_limit)} "
                                            f"per device even with recompute and offload chosen per layer: {what}", t0)


def _lower_bound(chain: Chain, platform: Target, v: Versions, links: SuffixLinks, t0: float, period: float,
                 blocked: bool, deadline: float | None) -> float:
    """A proven lower bound when the versions were thinned: the DP with the relaxation rows, bisected between
    the search's own lower end and the plan's period (on blocks: only the bounds every plan meets)."""
    if blocked:
        return max(t0, min(_memory_bound(chain, platform), period))
    state = {"lo": t0}

    def fits(T: float) -> bool:             # a period where the relaxation does not fit is a bound
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError("dp auto: time limit while bounding")
        ok = _windows_fit(v, chain, platform, T, links)
        if not ok:
            state["lo"] = max(state["lo"], T)
        return ok

    try:
        if not fits(t0) and t0 < period:
            bisect(t0, period, fits, rel=BOUND_PRECISION)
    except TimeoutError:
        pass
    return min(state["lo"], period)
