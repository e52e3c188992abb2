"""The memory-aware DP of ``dp`` at one period: is there a contiguous partition valid at T, and which.

The recurrence is :mod:`workbench.planners.dp.contiguous`'s (its module docstring);
this module computes it without an L x L matrix.

**What one probe computes** (:func:`memory_dp`). Only pairs (i, j) that can be
a stage are visited: ``F+B`` of ``i..j`` at most T, and a floor of its memory
(its activations and static bytes, its first layer's head and receive buffer:
every other term is >= 0) at most M; both grow with j, so each start i has a
band of ends. Only states that can be part of a plan are computed: a q-stage
suffix must start at or after the first layer from which q stages can reach
the end, and no later than P - q stages can reach from layer 0 (each bound by
the bands). When the stages must be balanced (T near the optimum) these two
bounds pinch the states to a narrow diagonal of the (q, i) table, so a probe
costs about ``P * (states per q) * (band width)`` instead of ``P L^2``. Each
band entry's memory test is a precomputed cap on its in-flight count (the
largest k whose rule-7 memory fits: memory is non-decreasing in k), exact to
the float. Nothing is an approximation: the DP's answer is the same as over
the full table.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> memory_dp(ch, Target.of(2, memory=10_000, memory_model="paper"), 6.0)
(12.0, [(0, 1), (2, 3)])
>>> memory_dp(ch, Target.of(2, memory=10_000, memory_model="paper"), 5.9) is None
True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import band_terms, suffix_terms
from workbench.model.target import Target
from workbench.model.tolerances import CEIL_SLACK, FLOOR_MARGIN, MEMORY_SLACK, ceil_counts
from workbench.planners.partition import SuffixLinks, suffix_bounds

__all__ = ["StageTables", "memory_dp", "BAND_ELEMENTS"]

#: a probe works on the band in row blocks of about this many (i, j) entries (bounds its memory)
BAND_ELEMENTS = 4_000_000


class StageTables:
    """Per-layer arrays of one chain and platform for the memory DP (prefix sums: no L x L matrix), and the
    bands of stage ends its memory floor allows (:meth:`memory_ends`)."""

    def __init__(self, chain: Chain, platform: Target) -> None:
        L = len(chain)
        p = chain._prefix
        self.L = L
        self.pfb = p["f"] + p["b"]
        # F + B of the whole chain, summed as the stage sums are (F and B apart)
        self.total_fb = float((p["f"][L] - p["f"][0]) + (p["b"][L] - p["b"][0]))
        # c_j: the links within a node; on several nodes a q-stage suffix's first boundary may pay the
        # node link (links.after(q), dp's placement: workbench.planners.partition.place)
        self.links = SuffixLinks(chain, platform)
        self.c = self.links.least
        # rule 8: a stage's host round trip, 2 x its offloaded bytes over the host bandwidth
        self.x = np.array([platform.host_time(l.offload_bytes) for l in chain.layers])
        self.px = np.concatenate([[0.0], np.cumsum(2 * self.x)])
        self.terms = t = layer_terms(chain, platform)
        self.M = platform.memory_limit
        # the last stage i..L-1 (one mini-batch in flight) for every i: its F + B + host round trip, memory
        self.fb_last = self.pfb[L] - self.pfb[:L] + (self.px[L] - self.px[:L])
        self.mem_last = suffix_terms(t).memory(np.ones(L))

    def memory_ends(self, cap: float, k: np.ndarray) -> np.ndarray:
        """Per start i, the last end j whose memory *floor* with at least ``k[i]`` mini-batches in flight
        is within ``cap`` (i - 1 when none). The floor of stage i..j, ``k (sum act + head_i) + sum static
        + buf_in_i + (k - 1) sum stash``, leaves out terms that are >= 0 and grows with j: a binary
        search per row, all rows at once."""
        L, t = self.L, self.terms
        if not math.isfinite(cap):
            return np.full(L, L - 1)
        i = np.arange(L)
        base = k * (t.head - t.p_act[:L]) - t.p_static[:L] + t.buf_in - (k - 1) * t.p_stash[:L]

        def floor(j: np.ndarray) -> np.ndarray:
            return base + k * t.p_act[j + 1] + t.p_static[j + 1] + (k - 1) * t.p_stash[j + 1]

        lo, hi = i - 1, np.full(L, L - 1)       # floor(lo) fits (lo = i - 1: the empty stage), find the last
        while np.any(lo < hi):
            mid = (lo + hi + 1) // 2
            ok = floor(np.maximum(mid, i)) <= cap
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
        return lo

    def least_counts(self, T: float) -> np.ndarray:
        """Per start i, a floor of its stage's in-flight count at period T: its window is at least the
        compute from layer i to the end and back (slack 1e-9 below any float the DP computes)."""
        return np.maximum(1.0, np.ceil((self.pfb[self.L] - self.pfb[:self.L]) / T * (1 - FLOOR_MARGIN)))


@dataclass
class _Band:
    """Per-probe data of every stage ``i..j`` that may be one, rows ``r0..r1`` (starts), columns j - i."""

    r0: int
    J: np.ndarray        # the stage's last layer
    FB: np.ndarray       # F + B
    host: np.ndarray     # its host round trip (rule 8)
    FB2c: np.ndarray     # F + B + 2 c_j
    inner: np.ndarray    # may be a non-last stage: in the band, F + B + host and c_j within T, j < L - 1
    kcap: np.ndarray     # the most mini-batches in flight whose memory fits M (0: none)


def _count_cap(band, M: float) -> np.ndarray:
    """Per entry, the largest k >= 1 with ``band.memory(k) <= M`` (0 if none; inf if any k fits):
    memory is non-decreasing in k, so a first estimate is corrected to the float."""
    if not math.isfinite(M):
        return np.full(band.A.shape, np.inf)
    per = band.A + band.stash
    fits1 = band.memory(np.ones_like(per)) <= M
    grows = per > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        est = np.floor((M - band.static - band.extra + band.stash) / np.where(grows, per, 1.0))
    k = np.where(grows & fits1, np.clip(est, 1.0, 1e15), 1.0)
    for _ in range(64):
        up = grows & fits1 & (band.memory(k + 1) <= M)
        down = grows & fits1 & (k > 1) & (band.memory(k) > M)
        if not (up.any() or down.any()):
            break
        k = k + up - down
    return np.where(fits1, np.where(grows, k, np.inf), 0.0)


def _band(t: StageTables, T: float, r0: int, r1: int, ends: np.ndarray, M: float) -> _Band:
    """The band of stages starting at layers r0..r1 at period T (``ends``: each start's last admissible end)."""
    L = t.L
    tolT = T * (1 + CEIL_SLACK)
    rows = np.arange(r0, r1 + 1)
    width = max(int(np.max(ends[r0:r1 + 1] - rows)) + 1, 1)
    J = rows[:, None] + np.arange(width)[None, :]
    inband = J <= ends[r0:r1 + 1, None]
    Jc = np.minimum(J, L - 1)
    I = rows[:, None]
    FB = t.pfb[Jc + 1] - t.pfb[I]
    host = t.px[Jc + 1] - t.px[I]
    cj = t.c[Jc]
    inner = inband & (FB + host <= tolT) & (cj <= tolT) & (J < L - 1)   # a non-last stage cannot end at the last layer
    kcap = _count_cap(band_terms(t.terms, I, Jc), M)
    return _Band(r0, J, FB, host, FB + 2 * cj, inner, kcap)


def _reach(ends: np.ndarray, first_last: int, L: int, P: int) -> tuple[list[int], list[int]]:
    """(first, last): a q-stage suffix starts at a layer i >= first[q], and a state used by a plan of
    at most P stages has i <= last[P - q] (the farthest start r stages can reach from layer 0).
    ``first_last``: the first layer that can start the last stage."""
    env = np.maximum.accumulate(ends)                    # the farthest end of any start <= i
    first = [L, first_last]
    for _ in range(P - 1):
        prev = first[-1]
        first.append(int(np.searchsorted(env, prev - 1, side="left")) if prev > 0 else 0)
    last = [0]
    for _ in range(P):
        prev = last[-1]
        last.append(min(L, int(env[prev]) + 1) if prev < L else L)
    return first, last


def memory_dp(chain: Chain, platform: Target, period: float, tables: StageTables | None = None,
              deadline: float | None = None) -> tuple[float, list[tuple[int, int]]] | None:
    """For period T: the contiguous partition whose first-stage window is least, subject to
    F+B <= T, c <= T and rule-7 memory <= M on every stage; ``None`` if none exists.

    Returns ``(window of stage 0, bounds)``. Only the stages and states described in the module
    docstring are computed, a block of rows at a time. ``deadline`` (a ``perf_counter`` time):
    past it, ``TimeoutError``.
    """
    t = tables or StageTables(chain, platform)
    L, T = t.L, float(period)
    tolT = T * (1 + CEIL_SLACK)
    M = t.M * (1 + MEMORY_SLACK)
    idx = np.arange(L)
    # the last end of each start by time: prefix sums are non-decreasing, so a binary search per row
    ends = np.minimum(np.searchsorted(t.pfb, t.pfb[:L] + tolT, side="right") - 2, L - 1)
    if np.any(ends < idx):                    # a single layer longer than T
        return None
    ends = np.minimum(ends, t.memory_ends(M * (1 + FLOOR_MARGIN), t.least_counts(T)))
    P = min(platform.devices, L)
    # q = 1: the last stage i..L-1, one mini-batch in flight
    D = [np.where((t.fb_last <= tolT) & (t.mem_last <= M), t.fb_last, np.inf)]
    finite = np.flatnonzero(np.isfinite(D[0]))
    first, last = _reach(ends, int(finite[0]) if len(finite) else L, L, P)
    args: list[np.ndarray] = [np.full(L, L - 1)]
    lo_rows = max(first[P], 0) if P >= 2 else 0
    hi_rows = min(last[P - 2], L - 1) if P >= 2 else -1
    blocks: list[_Band] = []
    if hi_rows >= lo_rows:
        width = max(int(np.max(ends[lo_rows:hi_rows + 1] - idx[lo_rows:hi_rows + 1])) + 1, 1)
        step = max(1, BAND_ELEMENTS // width)
        for r in range(lo_rows, hi_rows + 1, step):      # a block's band is the work between two looks at the clock
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError("dp: time limit")
            blocks.append(_band(t, T, r, min(r + step, hi_rows + 1) - 1, ends, M))
    for q in range(2, P + 1):
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError("dp: time limit")
        r0, r1 = max(first[q], 0), min(last[P - q], L - 1)
        if r1 < r0:
            break
        Dn = np.concatenate([D[-1], [np.inf]])
        Dq, argq = np.full(L, np.inf), np.full(L, L - 1)
        any_ok = False
        for b in blocks:
            a0, a1 = max(r0, b.r0), min(r1, b.r0 + len(b.J) - 1)
            if a1 < a0:
                continue
            sl = slice(a0 - b.r0, a1 - b.r0 + 1)
            down = Dn[np.minimum(b.J[sl] + 1, L)]          # down[i, d] = D[q-1][j+1]
            fin = np.isfinite(down)
            ok0 = b.inner[sl] & fin
            if not ok0.any():
                continue
            any_ok = True
            FB, host = b.FB[sl], b.host[sl]
            cq = t.links.after(q)
            if cq is t.c:
                raw = b.FB2c[sl] + np.where(fin, down, 0.0)
            else:                                           # this boundary crosses nodes
                cj = cq[np.minimum(b.J[sl], L - 1)]
                ok0 = ok0 & (cj <= tolT)
                raw = FB + 2 * cj + np.where(fin, down, 0.0)
            k = ceil_counts(raw / T)
            window = np.where(raw - (k - 1) * T < FB + host, (k - 1) * T + FB + host, raw)
            window = np.where(ok0 & (k <= b.kcap[sl]), window, np.inf)
            arg = np.argmin(window, axis=1)
            rows = np.arange(a1 - a0 + 1)
            Dq[a0:a1 + 1] = window[rows, arg]
            argq[a0:a1 + 1] = arg + idx[a0:a1 + 1]
        if not any_ok:
            break
        D.append(Dq)
        args.append(argq)
    finals = [Dq[0] for Dq in D]
    q = int(np.argmin(finals)) + 1
    if not math.isfinite(finals[q - 1]):
        return None
    return float(finals[q - 1]), suffix_bounds(args, q)
