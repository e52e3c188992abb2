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
                 workbench.memory: each stage alone on its device)

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

If no period works, the least memory any contiguous plan needs is reported:
with T large enough every k is 1, and the least peak of a stage's memory at
k = 1 over partitions is another bottleneck, searched by bisection on the
memory with a banded DP (:func:`least_contiguous_memory`).

>>> from workbench.chain import Chain, Layer, Platform
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 0, 0) for i in range(4)))
>>> p = plan_dp(chain, Platform(2, memory_model="paper"))
>>> round(p.period, 6), p.assignment
(0.006, (0, 0, 1, 1))
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..activations import apply_policies, describe
from ..bisection import least_feasible
from ..chain import Chain, Platform
from ..memory import band_terms, layer_terms, suffix_terms
from ..plan import Plan, infeasible_plan, lower_bound
from ..schedule import Scheduler
from ..tolerances import CEIL_SLACK, FLOOR_MARGIN, MEMORY_SLACK, TINY, ceil_counts
from ..units import format_bytes
from .budget import Budget
from .dp_auto import auto_on_chain
from .fixed_policies import plan_with_policies
from .graph_dp import best_order
from .partition import boundary_costs, bounds_to_assignment, suffix_bounds, unconstrained_period

__all__ = [
    "plan_dp", "memory_dp", "partition_period", "least_contiguous_memory", "schedule_partition",
    "BAND_ELEMENTS", "WIDE_PROBE",
]

#: a probe works on the band in row blocks of about this many (i, j) entries (bounds its memory)
BAND_ELEMENTS = 4_000_000
#: above this many entries for a probe with every k = 1, the period search climbs from the bound (_growth)
WIDE_PROBE = 20_000_000
#: progress lines on long searches, at most one per this many seconds
PROGRESS_EVERY = 2.0


class _Tables:
    """Per-layer arrays of one chain and platform for the memory DP (prefix sums: no L x L matrix)."""

    def __init__(self, chain: Chain, platform: Platform) -> None:
        L = len(chain)
        p = chain._prefix
        self.L = L
        self.pfb = p["f"] + p["b"]
        # F + B of the whole chain, summed as the stage sums are (F and B apart)
        self.total_fb = float((p["f"][L] - p["f"][0]) + (p["b"][L] - p["b"][0]))
        self.c = boundary_costs(chain, platform)
        # rule 8: a stage's host round trip, 2 x its offloaded bytes over the host bandwidth
        self.x = np.array([platform.host_time(l.offload_bytes) for l in chain.layers])
        self.px = np.concatenate([[0.0], np.cumsum(2 * self.x)])
        self.terms = t = layer_terms(chain, platform)
        self.M = platform.memory
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


def _band(t: _Tables, T: float, r0: int, r1: int, ends: np.ndarray, M: float) -> _Band:
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


def memory_dp(chain: Chain, platform: Platform, period: float, tables: _Tables | None = None,
              deadline: float | None = None) -> tuple[float, list[tuple[int, int]]] | None:
    """For period T: the contiguous partition whose first-stage window is least, subject to
    F+B <= T, c <= T and rule-7 memory <= M on every stage; ``None`` if none exists.

    Returns ``(window of stage 0, bounds)``. Only the stages and states described in the module
    docstring are computed, a block of rows at a time. ``deadline`` (a ``perf_counter`` time):
    past it, ``TimeoutError``.
    """
    t = tables or _Tables(chain, platform)
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
        blocks = [_band(t, T, r, min(r + step, hi_rows + 1) - 1, ends, M) for r in range(lo_rows, hi_rows + 1, step)]
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
            raw = b.FB2c[sl] + np.where(fin, down, 0.0)
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


# ----------------------------------------------------------------------------
# the least memory of any contiguous plan (every k = 1)
# ----------------------------------------------------------------------------
def _one_in_flight(t: _Tables, ends: np.ndarray) -> list[tuple[int, np.ndarray]]:
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


def least_contiguous_memory(chain: Chain, platform: Platform, tables: _Tables | None = None
                            ) -> tuple[float, list[tuple[int, int]]]:
    """The least peak memory of any contiguous plan (every k = 1, i.e. a long period), and a partition
    reaching it: the bottleneck of the one-in-flight stage memory over partitions into at most P
    stages. Exact: bisection on the memory, each probe a banded fewest-stages DP, and a last probe at
    the largest float below the value found.

    >>> from workbench.chain import Chain, Layer, Platform
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 10, 0, 5) for i in range(4)))
    >>> least_contiguous_memory(ch, Platform(2, memory_model="paper"))
    (30.0, [(0, 1), (2, 3)])
    """
    t = tables or _Tables(chain, platform)
    L, P = t.L, min(platform.devices, t.L)
    start = unconstrained_period(chain, platform, t.c)[1]

    def stage_memory(i: int, j: int) -> float:     # as in the band: the ends i..j of start i (running maxima)
        J = np.arange(i, j + 1)[None, :]
        return float(band_terms(t.terms, np.array([[i]]), J).memory(np.ones(J.shape))[0, -1])

    best = start
    hi = max(stage_memory(i, j) for i, j in best)
    blocks = _one_in_flight(t, t.memory_ends(hi * (1 + FLOOR_MARGIN), np.ones(L)))
    lo, descent = 0.0, True
    while True:
        V = float(np.nextafter(hi, -math.inf)) if descent else 0.5 * (lo + hi)
        found = _fewest_stages(blocks, L, P, V) if (descent or V > lo) else None
        if found is None:
            if descent:
                return hi, best
            lo = V
        else:
            best, hi = found, max(stage_memory(i, j) for i, j in found)
        descent = not descent


# ----------------------------------------------------------------------------
# one partition: the window recurrence lives in workbench.schedule.Scheduler
# ----------------------------------------------------------------------------
def partition_period(chain: Chain, platform: Platform, bounds: Sequence[tuple[int, int]], *,
                     ignore_memory: bool = False) -> float:
    """Least period at which the window schedule of the partition ``bounds`` fits in memory (inf if none;
    ``ignore_memory``: the least period of any schedule of it, its load bound).

    The schedule is :class:`~workbench.schedule.Scheduler`'s contiguous
    builder (the recurrence above); its ``best`` search is exact up to 1e-9.

    >>> from workbench.chain import Chain, Layer, Platform
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(2)))
    >>> partition_period(ch, Platform(2, memory_model="paper"), [(0, 0), (1, 1)])
    3.0
    """
    sched = Scheduler(chain, platform, bounds_to_assignment(bounds))
    if ignore_memory:
        return sched.load_period
    best = sched.best()
    return best.period if best.feasible else math.inf


def schedule_partition(chain: Chain, platform: Platform, bounds: Sequence[tuple[int, int]], *,
                       method: str, period: float | None = None, ignore_memory: bool = False,
                       status: str = "feasible", notes: Sequence[str] = (), **kw: Any) -> Plan:
    """A :class:`Plan` for a contiguous partition at its least feasible period (or ``period``)."""
    sched = Scheduler(chain, platform, bounds_to_assignment(bounds))
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


def _probe_work(t: _Tables, platform: Platform) -> int:
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


def _dp_on_chain(chain: Chain, platform: Platform, budget: Budget) -> _Answer:
    """dp's answer for one linear order, keeping every layer's activations."""
    tables = _Tables(chain, platform)
    t0, _ = unconstrained_period(chain, platform, tables.c)
    t0 = max(t0, TINY)
    hi = (t0 + tables.total_fb + 2 * float(tables.c.sum()) + 2 * float(tables.x.sum())) * 1.01
    deadline = budget.t0 + budget.seconds if budget.limited else None
    if len(chain) >= 1000:
        budget.say(f"dp: {len(chain)} layers x {platform.devices} devices, unconstrained period {t0:.6g} s; "
                   f"searching the least period that fits in memory")
    try:
        found = least_feasible(t0, hi, lambda T: (r[1] if (r := memory_dp(chain, platform, T, tables, deadline))
                                                  is not None else None),
                               lambda bounds: partition_period(chain, platform, bounds),
                               stop=_stopper(budget, len(chain), platform.devices),
                               steps=_growth(t0, hi) if _probe_work(tables, platform) > WIDE_PROBE else ())
    except TimeoutError:
        return _Answer(math.inf, None, None, f"time limit reached before dp found a plan ({budget.elapsed():.1f} s)",
                       complete=False, lower=t0)
    if found is None:
        need, _ = least_contiguous_memory(chain, platform, tables)
        return _Answer(math.inf, None, None, (
            f"no contiguous plan fits in {format_bytes(platform.memory)} per device: the least memory any "
            f"contiguous plan on {platform.devices} devices needs is {format_bytes(need)} "
            f"(one mini-batch in flight per stage)"))
    why = "" if found.complete else (f"time limit reached: the best partition found; the optimum is at least "
                                     f"{found.lower:.6g} s")
    return _Answer(found.period, found.structure, None, why, found.complete, found.lower)


def _on_chain(chain: Chain, platform: Platform, auto: bool, budget: Budget) -> _Answer:
    """dp's answer for one linear order."""
    if auto:
        T, bounds, pol, why = auto_on_chain(chain, platform)
        return _Answer(T, bounds, pol, why)
    return _dp_on_chain(chain, platform, budget)


def plan_dp(chain: Chain, platform: Platform, *, allocation: str = "contiguous",
            time_limit: float | None = None, graph: bool = True, activations: str | None = None,
            progress: Callable[[str], None] | None = None, **options: Any) -> Plan:
    """Exact contiguous plan: least period under the memory limit (see the module docstring).

    ``allocation="general"`` still returns the contiguous optimum (noted).
    On a chain linearised from a DAG (``chain.graph``), with ``graph=True``
    the DP also runs on the order from
    :func:`workbench.planners.graph_dp.best_order` and keeps the better,
    recording the order in ``plan.chain_order``. ``time_limit``: past it the search stops with the
    best partition found (status ``timeout``, its gap to the proven bound); ``progress`` receives a
    line every few seconds of a long search. ``activations="auto"`` also chooses every layer's
    activation policy, exactly (:mod:`workbench.planners.dp_auto`); other policies:
    :mod:`workbench.planners.fixed_policies`. Other options are ignored.

    >>> from workbench.chain import Chain, Layer, Platform
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
    >>> plan_dp(ch, Platform(2, memory=10_000, memory_model="paper")).period
    6.0
    >>> plan_dp(ch, Platform(2, memory=150, memory_model="paper")).status
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
    candidates: list[tuple[_Answer, Chain, tuple[str, ...] | None]] = [(_on_chain(chain, platform, auto, budget),
                                                                        chain, None)]
    if graph and getattr(chain, "graph", None) is not None:
        res = best_order(chain.graph, platform.devices, platform=platform)
        order = [str(n) for n in res.order]
        if order != [l.name for l in chain.layers]:
            other = chain.graph.linearise(order)
            candidates.append((_on_chain(other, platform, auto, budget), other, tuple(order)))
    ans, used, order = min(candidates, key=lambda c: c[0].period)
    if order is not None:
        notes.append(f"graph order from best_order: {ans.period:.6g} s against {candidates[0][0].period:.6g} s "
                     f"in the default order")
    if ans.bounds is None:
        p = infeasible_plan(chain, platform, "dp", ans.why, allocation=allocation, solve_seconds=budget.elapsed())
        return p if ans.complete else p.with_(status="timeout")
    if not ans.complete:
        status, gap = "timeout", max(0.0, (ans.period - ans.lower) / ans.period)
    else:
        status, gap = ("feasible" if ans.why else "optimal"), None
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
