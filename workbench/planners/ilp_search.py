"""Incumbents for the general ILP: local search over allocations.

HiGHS's own heuristics find good general allocations slowly; a strong
incumbent bounds the ILP (``T <= T_inc`` prunes most of the tree). Starting
from a plan (the contiguous DP's), :func:`local_search` tries moving one layer
to another device, and swapping the devices of two layers, keeping any move
that lowers the period. Each allocation is scored by its *exact* least period
(:func:`workbench.planners.brute.allocation_period`'s search, with the current
period as a cut-off so that most candidates are rejected by bounds alone).

>>> from workbench.chain import Chain, Layer, Platform
>>> from workbench.planners.dp import plan_dp
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 1) for i in range(3)), input_bytes=1)
>>> plat = Platform(2, memory=1000)
>>> p = local_search(ch, plat, plan_dp(ch, plat), seconds=5)
>>> p.period <= plan_dp(ch, plat).period
True
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from ..chain import Chain, Platform
from ..plan import Plan, make_plan

__all__ = ["allocation_best", "local_search", "normalise"]


def normalise(assignment: Sequence[int]) -> tuple[int, ...]:
    """Relabel devices in first-use order (identical devices)."""
    m: dict[int, int] = {}
    return tuple(m.setdefault(int(a), len(m)) for a in assignment)


def allocation_best(chain: Chain, platform: Platform, assignment: Sequence[int], upper: float = math.inf,
                    deadline: float | None = None) -> tuple[float, list[float], list[float]] | None:
    """Least period of ``assignment`` if below ``upper``: (T, fwd starts, bwd starts) per stage, else None."""
    try:
        from .brute import _alloc, _general_period

        al = _alloc(chain, platform, assignment)
        if al.contiguous:
            from .brute import allocation_period

            r = allocation_period(chain, platform, assignment)
            return r if (r is not None and r[0] < upper) else None
        return _general_period(al, platform, upper, deadline)
    except ImportError:  # pragma: no cover
        from .brute import allocation_period

        r = allocation_period(chain, platform, assignment)
        return r if (r is not None and r[0] < upper) else None


def local_search(chain: Chain, platform: Platform, start: Plan, *, seconds: float = 10.0,
                 swaps: bool = True, max_stages: int | None = None, max_shift: int = 8) -> Plan:
    """Improve ``start`` by moves (first improvement), within ``seconds``: a whole stage to another
    device, a stage boundary shifted by 2 to ``max_shift`` layers, one layer to another device,
    and pairwise swaps.

    Allocations with more than ``max_stages`` stages (default P + 4) are skipped: the exact
    evaluator's effort grows quickly with the number of stages and it does not always
    stop at the deadline."""
    from ..plan import stages_of

    cap = max_stages if max_stages is not None else platform.devices + 4
    t_end = time.perf_counter() + seconds
    L, P = len(chain), platform.devices
    best_a = normalise(start.assignment)
    best_T = start.period
    best_fb = None
    seen = {best_a}
    improved = True
    while improved and time.perf_counter() < t_end:
        improved = False
        cands: list[tuple[int, ...]] = []
        used = max(best_a) + 1
        runs = stages_of(best_a)
        for a, b in runs:  # a whole stage to another device; a stage boundary shifted by several layers
            for d in range(min(P, used + 1)):
                if d != best_a[a]:
                    cands.append(normalise(best_a[:a] + (d,) * (b - a + 1) + best_a[b + 1:]))
        for (a1, b1), (a2, b2) in zip(runs, runs[1:]):
            d1, d2 = best_a[a1], best_a[a2]
            for j in range(2, max_shift + 1):
                if j <= b1 - a1:   # the last j layers of the first stage join the second
                    cands.append(normalise(best_a[:b1 - j + 1] + (d2,) * j + best_a[b1 + 1:]))
                if j <= b2 - a2:   # the first j layers of the second stage join the first
                    cands.append(normalise(best_a[:a2] + (d1,) * j + best_a[a2 + j:]))
        for l in range(L):
            for d in range(min(P, used + 1)):
                if d != best_a[l]:
                    a = list(best_a)
                    a[l] = d
                    cands.append(normalise(a))
        if swaps:
            for l in range(L):
                for m in range(l + 2, L):
                    if best_a[l] != best_a[m]:
                        a = list(best_a)
                        a[l], a[m] = a[m], a[l]
                        cands.append(normalise(a))
        for a in cands:
            if a in seen or max(a) >= P or len(stages_of(a)) > cap:
                continue
            seen.add(a)
            if time.perf_counter() > t_end:
                break
            try:
                r = allocation_best(chain, platform, a, best_T * (1 - 1e-9), deadline=t_end)
            except TimeoutError:
                break
            if r is not None and r[0] < best_T * (1 - 1e-9):
                best_a, best_T, best_fb = a, r[0], (r[1], r[2])
                improved = True
                break
    if best_fb is None:
        return start
    plan = make_plan(chain, platform, best_T, best_a, best_fb[0], best_fb[1], method="local_search")
    return plan

