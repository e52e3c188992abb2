"""``dp``: exact contiguous partitioning, with and without a memory limit.

Two dynamic programmes over a chain of L layers and P devices, one stage per
device, stage s on device s:

* **No memory limit** (chains-on-chains with link costs). A stage
  ``i..j`` costs ``max(F+B, c_j)``: its device must run one forward and one
  backward per period, and the link after it carries ``c_j`` forward one
  way and ``c_j`` backward the other way, each on its own ordered pair of
  devices (rule 6). Any contiguous allocation reaches
  ``T = max over stages of that cost`` (docs/model.md, "Plan"), so the optimum
  is the bottleneck-minimising partition into at most P stages
  (:func:`workbench.planners.partition.unconstrained_period`: a greedy walk per
  probe, no L x L matrix).

* **Memory limit M** (a memory-aware DP over suffixes, MadPipe-style). For
  a fixed period T the periodic schedule of a contiguous allocation is
  fixed by stage *windows* (time from the start of a mini-batch's forward
  to the end of its backward on that stage)::

      last stage:   window_S = F_S + B_S
      stage s:      raw_s    = F_s + c_s + window_{s+1} + c_s + B_s
                    k_s      = ceil(raw_s / T)            (mini-batches in flight)
                    window_s = raw_s, or (k_s-1) T + F_s + B_s when the
                               backward would overlap the forward modulo T
                               (raw_s - (k_s-1) T < F_s + B_s): it is delayed
      memory_s = k_s A_s + static_s + (k_s - 1) stash_s + excess_s   (rule 7,
                 workbench.model.memory: each stage alone on its device)

  ``window_s`` and ``k_s`` are non-decreasing in ``window_{s+1}``, so for
  the stages upstream of a suffix, *the smallest downstream window is
  always best*: it gives them weakly smaller windows, in-flight counts and
  memory. Hence ``D[q][i]`` = the least window of a feasible suffix
  starting at layer i with exactly q stages is an exact DP state, and the
  recurrence tries every first stage ``i..j`` of the suffix:
  ``D[q][i] = min_j window(i..j | D[q-1][j+1])`` subject to
  ``F+B <= T``, ``c_j <= T`` and ``memory <= M``.

  Feasibility is monotone in T: by induction from the last stage,
  ``window_s(T) / T`` is non-increasing in T (``raw/T = X/T + window/T``;
  the delayed window over T is ``(k-1) + (F+B)/T``), so every k_s is
  non-increasing and memory with it. So the least feasible period is found
  by search (:func:`workbench.bisection.least_feasible`): start at the
  unconstrained optimum, and bisect; every feasible probe's partition is
  re-timed exactly (:func:`partition_period`, a 1-D search on a fixed
  partition) which pulls the upper end down to an achievable period, and the
  search stops when the bracket is within 1e-9 relative.

**One probe** (:func:`workbench.planners.dp.memory_dp.memory_dp`) visits only the
stages that can be one and the states a plan can reach: it costs about
``P * (states per q) * (band width)`` instead of ``P L^2``, exactly.

If no period works, the least memory any contiguous plan needs is reported:
with T large enough every k is 1, and the least peak of a stage's memory at
k = 1 over partitions is another bottleneck, searched by bisection on the
memory with a banded DP (:func:`least_contiguous_memory`).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 0, 0) for i in range(4)))
>>> p = plan_dp(chain, Target.of(2, memory_model="paper"))
>>> round(p.period, 6), p.assignment
(0.006, (0, 0, 1, 1))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from workbench.bisection import least_bottleneck, least_feasible
from workbench.model.activations import POLICIES, apply_policies, describe
from workbench.model.chain import Chain
from workbench.model.memory_bands import band_terms
from workbench.model.plan import Plan, infeasible_plan, lower_bound
from workbench.model.target import Target
from workbench.model.tolerances import FLOOR_MARGIN, MEMORY_SLACK, PERIOD_SEARCH, TINY
from workbench.model.units import format_bytes
from workbench.planners.budget import Budget
from workbench.planners.dp.auto import auto_on_chain
from workbench.planners.dp.coarse_start import LAYERS_PER_BLOCK, MIN_LAYERS, block_start
from workbench.planners.dp.graph import best_order
from workbench.planners.dp.memory_dp import BAND_ELEMENTS, StageTables, memory_dp
from workbench.planners.fixed_policies import plan_with_policies
from workbench.planners.partition import place, unconstrained_period
from workbench.schedules.builder import Scheduler

__all__ = [
    "plan_dp", "partition_period", "least_contiguous_memory", "schedule_partition", "WIDE_PROBE",
]

#: above this many entries for a probe with every k = 1, the period search climbs from the bound (_growth)
WIDE_PROBE = 20_000_000
#: progress lines on long searches, at most one per this many seconds
PROGRESS_EVERY = 2.0
#: a long chain's first plan on blocks (_block_start) takes at most this share of the time limit
BLOCK_SHARE = 0.3


# ----------------------------------------------------------------------------
# the least memory of any contiguous plan (every k = 1)
# ----------------------------------------------------------------------------
def _one_in_flight(t: StageTables, ends: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Row blocks ``(first row, memory of stage i..i+d at k = 1)`` for d up to each row's end (inf beyond)."""
    L = t.L
    width = max(int(np.max(ends - np.arange(L))) + 1, 1)
    step = max(1, BAND_ELEMENTS // width)
    out = []
    for r0 in range(0, L, step):
        rows = np.arange(r0, min(r0 + step, L))
        J = rows[:, None] + np.arange(width)[None, :]
        Jc = np.minimum(J, L - 1)
        mem = band_terms(t.terms, rows[:, None], Jc).memory(np.ones(J.shape))
        out.append((r0, np.where(J <= ends[rows, None], mem, np.inf)))
    return out


def _fewest_stages(blocks: list[tuple[int, np.ndarray]], L: int, P: int, V: float) -> list[tuple[int, int]] | None:
    """A partition into at most P stages whose memory at k = 1 is at most V each, or None. Level r
    finds the layers from which r stages cover the rest (each keeps the stage of its first level);
    only rows within one band width before the previous level's new rows can be new."""
    ok = np.concatenate([mem <= V for _, mem in blocks])
    w = ok.shape[1]
    cols = np.arange(w)
    reach = np.zeros(L + 1, dtype=bool)
    reach[L] = True
    pick = np.full(L, -1)
    f_lo, f_hi = L, L                       # the rows reached at the previous level lie in f_lo..f_hi
    for _ in range(P):
        r0, r1 = max(0, f_lo - w), f_hi - 1
        if r1 < r0:
            break
        rows = np.arange(r0, r1 + 1)
        hit = ok[r0:r1 + 1] & reach[np.minimum(rows[:, None] + cols[None, :] + 1, L)]
        new = np.flatnonzero(hit.any(axis=1) & ~reach[r0:r1 + 1])
        if len(new) == 0:
            break
        pick[r0 + new] = r0 + new + np.argmax(hit[new], axis=1)
        reach[r0 + new] = True
        f_lo, f_hi = r0 + int(new[0]), r0 + int(new[-1])
        if reach[0]:
            break
    if not reach[0]:
        return None
    bounds, i = [], 0
    while i < L:
        bounds.append((i, int(pick[i])))
        i = int(pick[i]) + 1
    return bounds


def least_contiguous_memory(chain: Chain, platform: Target, tables: StageTables | None = None
                            ) -> tuple[float, list[tuple[int, int]]]:
    """The least peak memory of any contiguous plan (every k = 1, i.e. a long period), and a partition
    reaching it: the bottleneck of the one-in-flight stage memory over partitions into at most P
    stages. Exact: bisection on the memory, each probe a banded fewest-stages DP, and a last probe at
    the largest float below the value found.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 10, 0, 5) for i in range(4)))
    >>> least_contiguous_memory(ch, Target.of(2, memory_model="paper"))
    (30.0, [(0, 1), (2, 3)])
    """
    t = tables or StageTables(chain, platform)
    L, P = t.L, min(platform.devices, t.L)
    start = unconstrained_period(chain, platform, t.c)[1]

    def stage_memory(i: int, j: int) -> float:     # as in the band: the ends i..j of start i (running maxima)
        J = np.arange(i, j + 1)[None, :]
        return float(band_terms(t.terms, np.array([[i]]), J).memory(np.ones(J.shape))[0, -1])

    def peak(bounds: list[tuple[int, int]]) -> float:
        return max(stage_memory(i, j) for i, j in bounds)

    hi = peak(start)
    blocks = _one_in_flight(t, t.memory_ends(hi * (1 + FLOOR_MARGIN), np.ones(L)))
    return least_bottleneck(start, hi, lambda V: _fewest_stages(blocks, L, P, V), peak)


# ----------------------------------------------------------------------------
# one partition: the window recurrence lives in workbench.schedules.builder.Scheduler
# ----------------------------------------------------------------------------
def partition_period(chain: Chain, platform: Target, bounds: Sequence[tuple[int, int]], *,
                     ignore_memory: bool = False) -> float:
    """Least period at which the window schedule of the partition ``bounds`` fits in memory (inf if none;
    ``ignore_memory``: the least period of any schedule of it, its load bound).

    The schedule is :class:`~workbench.schedules.builder.Scheduler`'s contiguous
    builder (the recurrence above); its ``best`` search is exact up to 1e-9.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(2)))
    >>> partition_period(ch, Target.of(2, memory_model="paper"), [(0, 0), (1, 1)])
    3.0
    """
    sched = Scheduler(chain, platform, place(bounds, platform))
    if ignore_memory:
        return sched.load_period
    best = sched.best()
    return best.period if best.feasible else math.inf


def schedule_partition(chain: Chain, platform: Target, bounds: Sequence[tuple[int, int]], *,
                       method: str, period: float | None = None, ignore_memory: bool = False,
                       status: str = "feasible", notes: Sequence[str] = (), **kw: Any) -> Plan:
    """A :class:`Plan` for a contiguous partition at its least feasible period (or ``period``)."""
    sched = Scheduler(chain, platform, place(bounds, platform))
    T = period if period is not None else partition_period(chain, platform, bounds, ignore_memory=ignore_memory)
    if not math.isfinite(T):
        raise ValueError("no period fits this partition")
    return sched.plan(T, method=method, allocation="contiguous", status=status, notes=tuple(notes), **kw)


# ----------------------------------------------------------------------------
# the search and the plan
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Answer:
    """dp's answer on one layer order: the period, the partition (None: nothing found), the policies
    (auto), why not optimal or not found, whether the search completed and its proven lower bound."""

    period: float
    bounds: list[tuple[int, int]] | None
    policies: tuple[str, ...] | None
    why: str
    complete: bool = True
    lower: float = 0.0


def _stopper(budget: Budget, L: int, P: int) -> Callable[[float, float], bool]:
    """``stop(lo, hi)`` for the period search: a progress line every PROGRESS_EVERY seconds, and True
    once the time limit is spent."""
    last = [budget.elapsed()]
    probes = [0]

    def stop(lo: float, hi: float) -> bool:
        probes[0] += 1
        if budget.elapsed() - last[0] >= PROGRESS_EVERY:
            last[0] = budget.elapsed()
            budget.say(f"dp: {L} layers x {P} devices: period in [{lo:.6g}, {hi:.6g}] s after {probes[0]} probes "
                       f"({budget.elapsed():.1f} s)")
        return budget.left() <= 0

    return stop


def _probe_work(t: StageTables, platform: Target) -> int:
    """About how many (q, i, j) entries a probe at a period long enough for every k to be 1 visits."""
    ends = t.memory_ends(t.M * (1 + MEMORY_SLACK) * (1 + FLOOR_MARGIN), np.ones(t.L))
    return int(np.sum(np.maximum(ends - np.arange(t.L) + 1, 0))) * min(platform.devices, t.L)


def _growth(t0: float, hi: float) -> list[float]:
    """Periods to probe above t0 before ``hi``: t0 (1 + 2^n / 16), n = 0, 1, ... (a probe costs about
    (T / t0)^2 times one at t0, so on long chains the search climbs from the bound rather than coming
    down from hi; it finds the same least period, and where several partitions reach it, may return
    another one than the descent from hi)."""
    out, n = [], 0
    while (T := t0 * (1 + 2.0 ** n / 16)) < hi:
        out.append(T)
        n += 1
    return out


def _dp_on_chain(chain: Chain, platform: Target, budget: Budget) -> _Answer:
    """dp's answer for one linear order, keeping every layer's activations."""
    tables = StageTables(chain, platform)
    t0, _ = unconstrained_period(chain, platform, tables.c)
    t0 = max(t0, TINY)
    hi = (t0 + tables.total_fb + 2 * float(tables.links.most.sum()) + 2 * float(tables.x.sum())) * 1.01
    deadline = budget.t0 + budget.seconds if budget.limited else None
    if len(chain) >= 1000:
        budget.say(f"dp: {len(chain)} layers x {platform.devices} devices, unconstrained period {t0:.6g} s; "
                   f"searching the least period that fits in memory")
    wide = _probe_work(tables, platform) > WIDE_PROBE
    try:
        start = _block_start(chain, platform, budget) if wide and len(chain) >= MIN_LAYERS else None
        found = least_feasible(t0, hi, lambda T: (r[1] if (r := memory_dp(chain, platform, T, tables, deadline))
                                                  is not None else None),
                               lambda bounds: partition_period(chain, platform, bounds),
                               stop=_stopper(budget, len(chain), platform.devices),
                               steps=_growth(t0, hi) if wide else (), start=start)
    except TimeoutError:
        return _Answer(math.inf, None, None, f"time limit reached before dp found a plan ({budget.elapsed():.1f} s)",
                       complete=False, lower=t0)
    if found is None:
        need, _ = least_contiguous_memory(chain, platform, tables)
        return _Answer(math.inf, None, None, (
            f"no contiguous plan fits in {format_bytes(platform.memory_limit)} per device: the least memory any "
            f"contiguous plan on {platform.devices} devices needs is {format_bytes(need)} "
            f"(one mini-batch in flight per stage)"))
    why = "" if found.complete else (f"time limit reached: the best partition found; the optimum is at least "
                                     f"{found.lower:.6g} s")
    return _Answer(found.period, found.structure, None, why, found.complete, found.lower)


def _block_start(chain: Chain, platform: Target, budget: Budget) -> tuple[list[tuple[int, int]], float] | None:
    """A long chain's first plan: dp on blocks of about ten layers (:mod:`workbench.planners.dp.coarse_start`),
    within :data:`BLOCK_SHARE` of the time limit."""
    child = budget.child(BLOCK_SHARE)
    budget.say(f"dp: a first plan on {len(chain) // LAYERS_PER_BLOCK} blocks of about {LAYERS_PER_BLOCK} layers")
    found = block_start(chain, lambda blocks: _dp_on_chain(blocks, platform, child).bounds,
                        lambda bounds: partition_period(chain, platform, bounds))
    if found is not None:
        budget.say(f"dp: first plan {found[1]:.6g} s ({budget.elapsed():.1f} s)")
    return found


def _one_policy(chain: Chain, platform: Target, budget: Budget) -> tuple[_Answer, str] | None:
    """The best plan with one policy on every layer (the exact DP of each effective chain: keep, recompute,
    offload) and that policy; None if none fits."""
    fixed: tuple[_Answer, str] | None = None
    for pol in POLICIES:
        ans = _dp_on_chain(chain if pol == "keep" else apply_policies(chain, pol), platform, budget)
        if ans.bounds is not None and (fixed is None or ans.period < fixed[0].period):
            fixed = (ans, pol)
    return fixed


def _auto_on_chain(chain: Chain, platform: Target, budget: Budget, fixed: tuple[_Answer, str] | None) -> _Answer:
    """dp with ``activations="auto"`` on one layer order: the per-layer search
    (:func:`workbench.planners.dp.auto.auto_on_chain`) below the best one-policy plan ``fixed``, which is the
    incumbent and the fallback."""
    deadline = budget.t0 + budget.seconds if budget.limited else None
    upper = fixed[0].period if fixed is not None else None
    cuts = [b for _, b in fixed[0].bounds][:-1] if fixed is not None else []
    budget.say(f"dp auto: {len(chain)} layers, per-layer policies below {upper:.6g} s" if upper is not None
               else f"dp auto: {len(chain)} layers, per-layer policies")
    try:
        a = auto_on_chain(chain, platform, upper=upper, deadline=deadline, cuts=cuts)
    except TimeoutError:
        a = None
    if a is not None and a.bounds is not None and (fixed is None or a.period < fixed[0].period):
        return _Answer(a.period, a.bounds, a.policies, a.why, a.complete, a.lower)
    if fixed is None:
        if a is None:
            why = f"time limit reached before dp found a plan ({budget.elapsed():.1f} s)"
            return _Answer(math.inf, None, None, why, complete=False)
        return _Answer(math.inf, None, None, a.why, a.complete, a.lower)
    ans, pol = fixed
    what = f"{pol} on every layer"
    if a is None:
        return _Answer(ans.period, ans.bounds, (pol,) * len(chain),
                       f"time limit reached: {what}, per-layer policies not searched", False,
                       unconstrained_period(chain, platform)[0])
    why = "" if a.lower >= ans.period * (1 - PERIOD_SEARCH) and not a.why else f"{what}; {a.why}".rstrip("; ")
    return _Answer(ans.period, ans.bounds, (pol,) * len(chain), why, a.complete, min(a.lower, ans.period))


def _auto_orders(chain: Chain, platform: Target, budget: Budget, dag: bool, notes: list[str]
                 ) -> tuple[_Answer, Chain, tuple[str, ...] | None]:
    """dp auto's answer, chain and order (None: the chain's own): on a DAG, the one-policy plans of the default
    order and of :func:`best_order`'s, and the per-layer search in the order whose one-policy plan is best
    (best_order is skipped when less time is left than the default order's plans took)."""
    orders: list[tuple[Chain, tuple[str, ...] | None]] = [(chain, None)]
    fixed = [_one_policy(chain, platform, budget)]
    if dag and budget.limited and budget.left() < budget.elapsed():
        notes.append(f"layer order search (best_order) skipped: {budget.left():.1f} s of the time limit left")
    elif dag:
        order = [str(n) for n in best_order(chain.graph, platform.devices, platform=platform).order]
        if order != [l.name for l in chain.layers]:
            orders.append((chain.graph.linearise(order), tuple(order)))
            fixed.append(_one_policy(orders[-1][0], platform, budget))
    k = min(range(len(orders)), key=lambda t: fixed[t][0].period if fixed[t] is not None else math.inf)
    if len(orders) > 1:
        notes.append("per-layer policies searched in the layer order whose one-policy plan is best")
    used, order = orders[k]
    return _auto_on_chain(used, platform, budget, fixed[k]), used, order


def plan_dp(chain: Chain, platform: Target, *, allocation: str = "contiguous",
            time_limit: float | None = None, graph: bool = True, activations: str | None = None,
            progress: Callable[[str], None] | None = None, **options: Any) -> Plan:
    """Exact contiguous plan: least period under the memory limit (see the module docstring).

    ``allocation="general"`` still returns the contiguous optimum (noted).
    On a chain linearised from a DAG (``chain.graph``), with ``graph=True``
    the DP also runs on the order from
    :func:`workbench.planners.dp.graph.best_order` and keeps the better,
    recording the order in ``plan.chain_order``. ``time_limit``: past it the search stops with the
    best partition found (status ``timeout``, its gap to the proven bound); ``progress`` receives a
    line every few seconds of a long search. ``activations="auto"`` also chooses every layer's
    activation policy, exactly (:mod:`workbench.planners.dp.auto`); other policies:
    :mod:`workbench.planners.fixed_policies`. Other options are ignored.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
    >>> plan_dp(ch, Target.of(2, memory=10_000, memory_model="paper")).period
    6.0
    >>> plan_dp(ch, Target.of(2, memory=150, memory_model="paper")).status
    'infeasible'
    """
    if activations not in (None, "keep", "auto"):
        return plan_with_policies(chain, platform, plan_dp, "dp", activations, allocation=allocation,
                                  time_limit=time_limit, graph=graph, progress=progress)
    budget = Budget(time_limit, progress=progress)
    notes: list[str] = []
    if allocation == "general":
        notes.append("dp is contiguous: this is the best contiguous plan (general allocations: use ilp)")
    auto = activations == "auto"
    if auto and not math.isfinite(platform.memory_limit):
        auto = False        # recompute and offload only add time or constraints
        notes.append("no memory limit: every layer keeps its activations (the best policy)")
    dag = graph and getattr(chain, "graph", None) is not None
    if auto:
        ans, used, order = _auto_orders(chain, platform, budget, dag, notes)
        candidates = [(ans, used, order)]
    else:
        candidates = [(_dp_on_chain(chain, platform, budget), chain, None)]
        if dag:
            res = best_order(chain.graph, platform.devices, platform=platform)
            order = [str(n) for n in res.order]
            if order != [l.name for l in chain.layers]:
                other = chain.graph.linearise(order)
                candidates.append((_dp_on_chain(other, platform, budget), other, tuple(order)))
        ans, used, order = min(candidates, key=lambda c: c[0].period)
    if order is not None and not auto:
        notes.append(f"graph order from best_order: {ans.period:.6g} s against {candidates[0][0].period:.6g} s "
                     f"in the default order")
    elif order is not None:
        notes.append("graph order from best_order")
    if ans.bounds is None:
        p = infeasible_plan(chain, platform, "dp", ans.why, allocation=allocation, solve_seconds=budget.elapsed())
        return p if ans.complete else p.with_(status="timeout")
    if not ans.complete:
        status, gap = "timeout", max(0.0, (ans.period - ans.lower) / ans.period)
    elif ans.why:       # a plan, and its gap to the bound proven (dp auto on thinned versions or on blocks)
        status, gap = "feasible", (max(0.0, (ans.period - ans.lower) / ans.period) if ans.lower > 0 else None)
    else:
        status, gap = "optimal", None
    if ans.policies is None or all(p == "keep" for p in ans.policies):
        if ans.why:
            notes.append(ans.why)
        plan = schedule_partition(used, platform, ans.bounds, method="dp", period=ans.period, status=status,
                                  notes=notes, chain_order=order)
    else:
        notes.append(f"activations chosen per layer: {describe(ans.policies)}")
        if ans.why:     # versions were thinned: a plan, not a proven optimum
            notes.append(ans.why)
        plan = schedule_partition(apply_policies(used, ans.policies), platform, ans.bounds, method="dp",
                                  period=ans.period, status=status, notes=notes, chain_order=order)
        plan = plan.with_(activations=ans.policies, lower_bound=lower_bound(used, platform))
    if gap is not None:
        plan = plan.with_(gap=gap)
    return plan.with_(solve_seconds=budget.elapsed())
