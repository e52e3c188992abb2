"""Incumbents for the general ILP: local search over allocations.

HiGHS's own heuristics find good general allocations slowly; a strong
incumbent bounds the ILP (``T <= T_inc`` prunes most of the tree). Starting
from a plan (the contiguous DP's), :func:`local_search` tries moving one layer
to another device, and swapping the devices of two layers, keeping any move
that lowers the period. Each allocation is scored by its *exact* least period
(:func:`workbench.planners.evaluate.period.allocation_best`, with the current period as a
cut-off so that most candidates are rejected by bounds alone).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.dp.contiguous import plan_dp
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 1) for i in range(3)), input_bytes=1)
>>> plat = Target.of(2, memory=1000, memory_model="paper")
>>> p = local_search(ch, plat, plan_dp(ch, plat), seconds=5)
>>> p.period <= plan_dp(ch, plat).period
True
"""

from __future__ import annotations

import random
import time
from itertools import islice
from typing import Any, Iterator

from workbench.model.chain import Chain
from workbench.model.plan import Plan, make_plan, stages_of
from workbench.model.target import Target
from workbench.model.tolerances import BETTER
from workbench.planners.budget import within
from workbench.planners.evaluate.period import allocation_best, normalise, path_period

__all__ = ["guided_search", "local_search"]


def _neighbours(a0: tuple[int, ...], P: int, max_shift: int, swaps: bool) -> Iterator[tuple[int, ...]]:
    """Moves from ``a0``, most promising first: a whole stage to another device, a stage boundary
    shifted by 2 to ``max_shift`` layers, one layer to another device, pairwise swaps. A generator:
    a descent that takes the first improving move builds only the moves before it."""
    L = len(a0)
    used = max(a0) + 1
    runs = stages_of(a0)
    for a, b in runs:
        for d in range(min(P, used + 1)):
            if d != a0[a]:
                yield normalise(a0[:a] + (d,) * (b - a + 1) + a0[b + 1:])
    for (a1, b1), (a2, b2) in zip(runs, runs[1:]):
        d1, d2 = a0[a1], a0[a2]
        for j in range(2, max_shift + 1):
            if j <= b1 - a1:   # the last j layers of the first stage join the second
                yield normalise(a0[:b1 - j + 1] + (d2,) * j + a0[b1 + 1:])
            if j <= b2 - a2:   # the first j layers of the second stage join the first
                yield normalise(a0[:a2] + (d1,) * j + a0[a2 + j:])
    for l in range(L):
        for d in range(min(P, used + 1)):
            if d != a0[l]:
                yield normalise(a0[:l] + (d,) + a0[l + 1:])
    if swaps:
        for l in range(L):
            for m in range(l + 2, L):
                if a0[l] != a0[m]:
                    a = list(a0)
                    a[l], a[m] = a[m], a[l]
                    yield normalise(a)


def local_search(chain: Chain, platform: Target, start: Plan, *, seconds: float = 10.0,
                 swaps: bool = True, max_stages: int | None = None, max_shift: int = 8,
                 kicks: int = 0, kick_slack: float = 0.1, seed: int = 0, deadline: Any = None) -> Plan:
    """Improve ``start`` by moves (first improvement), within ``seconds``: a whole stage to another
    device, a stage boundary shifted by 2 to ``max_shift`` layers, one layer to another device,
    and pairwise swaps.

    With ``kicks`` (iterated local search), once no move improves: two random stage moves from
    the best allocation (kept only when its period is within ``kick_slack`` of the best), then
    the same descent from there, again and again until ``kicks`` kicks in a row find nothing
    better or the time is up; the best allocation found is returned.

    Allocations with more than ``max_stages`` stages (default P + 4) are skipped: the exact
    evaluator's effort grows quickly with the number of stages and it does not always
    stop at the deadline.

    ``deadline`` (a ``perf_counter`` time or a :class:`~workbench.planners.budget.WorkDeadline`)
    replaces ``seconds`` when given."""
    cap = max_stages if max_stages is not None else platform.devices + 4
    t_end = deadline if deadline is not None else time.perf_counter() + seconds
    P = platform.devices

    def descend(cur_a: tuple[int, ...], cur_T: float, cur_fb):
        seen = {cur_a}
        improved = True
        while improved and time.perf_counter() < t_end:
            improved = False
            for a in _neighbours(cur_a, P, max_shift, swaps):
                if time.perf_counter() > t_end:   # polled per move, skipped ones too (each costs O(L))
                    break
                if a in seen or max(a) >= P or len(stages_of(a)) > cap:
                    continue
                seen.add(a)
                try:
                    r = allocation_best(chain, platform, a, cur_T * (1 - BETTER), deadline=t_end)
                except TimeoutError:
                    break
                if r is not None and r[0] < cur_T * (1 - BETTER):
                    cur_a, cur_T, cur_fb = a, r[0], (r[1], r[2])
                    improved = True
                    break
        return cur_a, cur_T, cur_fb

    best_a, best_T, best_fb = descend(normalise(start.assignment), start.period, None)
    rng = random.Random(seed)
    stale = 0
    while stale < kicks and time.perf_counter() < t_end:
        stale += 1
        a = best_a
        for _ in range(2):  # a kick: two random whole-stage moves or boundary shifts
            moves = [m for m in islice(_neighbours(a, P, max_shift, swaps=False), 4 * P * len(stages_of(a)))
                     if max(m) < P and len(stages_of(m)) <= cap]
            if moves:
                a = rng.choice(moves)
        if a == best_a:
            continue
        try:
            r = allocation_best(chain, platform, a, best_T * (1 + kick_slack), deadline=t_end)
        except TimeoutError:
            break
        if r is None:
            continue
        a, T, fb = descend(a, r[0], (r[1], r[2]))
        if T < best_T * (1 - BETTER):
            best_a, best_T, best_fb, stale = a, T, fb, 0
    if best_fb is None:
        return start
    plan = make_plan(chain, platform, best_T, best_a, best_fb[0], best_fb[1], method="local_search")
    return plan


def guided_search(chain: Chain, platform: Target, start: Plan, *, seconds: float = 10.0,
                  max_stages: int | None = None, max_shift: int = 8, kicks: int | None = None,
                  seed: int = 0, check_seconds: float = 5.0, deadline: Any = None,
                  target: float | None = None) -> Plan:
    """Improve ``start`` by a descent on :func:`path_period` (cheap) that checks its steps exactly.

    From the current allocation, take the first move (as in :func:`local_search`, without swaps)
    that lowers the path period; every step whose path period is below the best exact period so
    far is scored exactly (:func:`allocation_best`, at most ``check_seconds`` each) and kept as the
    best plan if it beats it. At a local minimum of the path period, kick: two random moves from
    the best allocation, and descend again. It stops when ``seconds`` are up, or after ``kicks``
    kicks in a row without a better plan.

    Why: the exact period scores some 10-100 allocations a second on resnet50, the path period
    thousands, and the two agree wherever no stage waits; so the descent walks through
    allocations the exact search would reject (their period is not yet better) towards ones that
    are. On resnet50 x 8 (general, 35.8 GiB), from the 0.06144 s plan that the block solves and
    :func:`local_search` with kicks had reached, it found 0.0594-0.0601 s in 100 s (three seeds),
    where :func:`local_search` with kicks found nothing better in 60 s (and 0.0593 s in 500 s).

    ``deadline`` (a ``perf_counter`` time or a :class:`~workbench.planners.budget.WorkDeadline`)
    replaces ``seconds`` when given. ``target``: stop once a plan reaches this period (a proven lower bound).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.planners.dp.contiguous import plan_dp
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 1) for i in range(3)), input_bytes=1)
    >>> plat = Target.of(2, memory=1000, memory_model="paper")
    >>> guided_search(ch, plat, plan_dp(ch, plat), seconds=5, kicks=5).period <= plan_dp(ch, plat).period
    True
    """
    cap = max_stages if max_stages is not None else 2 * platform.devices
    t_end = deadline if deadline is not None else time.perf_counter() + seconds
    guide = _Guide(chain, platform, normalise(start.assignment), start.period, cap, max_shift, t_end, check_seconds)
    rng = random.Random(seed)
    cur = guide.best_a
    while (time.perf_counter() < t_end and (kicks is None or guide.stale <= kicks)
           and (target is None or guide.best_T > target)):
        cur, cur_r = guide.descend(cur)
        guide.score(cur, cur_r)
        guide.stale += 1
        cur = guide.kick(rng)
    if guide.best_fb is None:
        return start
    return make_plan(chain, platform, guide.best_T, guide.best_a, guide.best_fb[0], guide.best_fb[1],
                     method="guided_search")


class _Guide:
    """The state of :func:`guided_search`: the best exactly scored allocation (``best_a``, its period
    ``best_T`` and start times ``best_fb``, None until one beats the start), the allocations scored
    exactly, and ``stale``, the kicks since the best last improved."""

    def __init__(self, chain: Chain, platform: Target, start_a: tuple[int, ...], start_T: float, cap: int,
                 max_shift: int, t_end: Any, check_seconds: float) -> None:
        self.chain, self.platform, self.cap, self.max_shift = chain, platform, cap, max_shift
        self.t_end, self.check_seconds = t_end, check_seconds
        self.best_a, self.best_T = start_a, start_T
        self.best_fb: tuple[list[float], list[float]] | None = None
        self.checked: set[tuple[int, ...]] = set()
        self.stale = 0

    def score(self, a: tuple[int, ...], r: float) -> None:
        """The exact period of ``a`` if its path period ``r`` says it may beat the best."""
        if a in self.checked or not r < self.best_T * (1 - BETTER):
            return
        self.checked.add(a)
        try:
            got = allocation_best(self.chain, self.platform, a, self.best_T * (1 - BETTER),
                                  deadline=within(self.t_end, self.check_seconds, "guided_search"))
        except TimeoutError:
            return
        if got is not None and got[0] < self.best_T * (1 - BETTER):
            self.best_a, self.best_T, self.best_fb, self.stale = a, got[0], (got[1], got[2]), 0

    def moves(self, a: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        """The moves from ``a`` within the stage cap; the deadline is polled per move looked at
        (most are over the cap near it, and each costs O(L) to build)."""
        P = self.platform.devices
        for m in _neighbours(a, P, self.max_shift, swaps=False):
            if time.perf_counter() > self.t_end:
                return
            if max(m) < P and len(stages_of(m)) <= self.cap:
                yield m

    def descend(self, cur: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
        """First-improvement descent on the path period from ``cur``, scoring each step exactly
        (:meth:`score`); the local minimum reached and its path period."""
        cur_r = path_period(self.chain, self.platform, cur)
        improved = True
        while improved and time.perf_counter() < self.t_end:
            improved = False
            for m in self.moves(cur):
                r = path_period(self.chain, self.platform, m, cur_r * (1 - BETTER))
                if r < cur_r * (1 - BETTER):
                    self.score(m, r)
                    cur, cur_r, improved = m, r, True
                    break
                if time.perf_counter() > self.t_end:
                    break
        return cur, cur_r

    def kick(self, rng: random.Random) -> tuple[int, ...]:
        """Two random moves from the best allocation."""
        cur = self.best_a
        for _ in range(2):
            options = list(islice(self.moves(cur), 4 * self.platform.devices * len(stages_of(cur))))
            if options:
                cur = rng.choice(options)
        return cur
