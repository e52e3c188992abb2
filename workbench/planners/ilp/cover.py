"""Exact search for GENERAL allocations: an exact-cover master and an exact per-allocation check.

A general allocation is a partition of the layers into at most P *device sets* (devices are identical). This module
bounds and searches those partitions without a MILP (a logic-based Benders decomposition with a combinatorial master):

Device sets and their thresholds
    A set S of layers (a bitmask) on one device has a *threshold* ``t(S)``: the
    least period at which S alone can be valid, from two necessary conditions:

    * load: ``sum_{l in S} (f_l + b_l) <= T`` (rule 5);
    * memory (rule 7): each maximal run ``[i..j]`` of S is a stage whose window
      holds layer i's forward, everything downstream and back, and both transfers
      of every cut from j on; the cuts S itself makes (a layer in S next to one not
      in S) are certain, so ``k >= ceil((D_i + 2 sum_{certain cuts >= j} c) / T)``
      and the device needs ``sum_runs k (A + [stash] W) + (phi - [stash]) W <= M``.

    Both sides only get harder as T falls, so S is possible at T iff ``T >= t(S)``.

The cover bound
    Every plan with period T partitions the layers into sets with ``t(S) <= T``,
    so ``min over partitions of max_S t(S)`` (a bottleneck exact cover, solved by
    branch and bound: :func:`cover_bound`) is a lower bound on the optimal period.
    It handles what the MILP relaxation cannot: indivisible layers, and stage
    windows that depend on where the cuts fall.

The exact search (:func:`cover_search`)
    Partitions are enumerated in bands of their bottleneck value; each is
    evaluated *exactly* (:func:`workbench.planners.evaluate.period.allocation_best`,
    brute force's certified per-allocation period, with the incumbent as a
    cut-off so most are rejected by bounds alone). After a band up to theta is
    exhausted, every allocation with period below theta has been seen, so
    ``min(theta, incumbent)`` is a proven lower bound; when it reaches the
    incumbent, the incumbent is optimal.

    Two things keep it fast. The DFS finds the last set (and the last two)
    by a lookup of the remaining layers rather than a scan. Before the exact
    check, :meth:`DeviceSets.allocation_fits` tests the whole partition with
    every cut known (each device's memory with its stages' full downstream
    paths, every link's load): on 16 x 4 it rejects about 95 % of the
    partitions in microseconds. The exact check itself first searches the
    *loose* system (every stage at the largest k its device allows), which
    settles most allocations with one order search instead of one per
    combination of in-flight vectors.

Sizes: the sets are enumerated under the load bound; above ``MAX_SETS`` of them (e.g. 32 blocks on 2 or 4 devices)
the search is refused (:class:`TooManySets`). 16 random layers x 4 devices have 2,000-5,000.

>>> from workbench.model.chain import Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
>>> r = cover_search(ch, Target.of(2, memory_model="paper"), 9.0)
>>> r.status, r.period, r.assignment
('optimal', 6.0, (0, 1, 1))
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from workbench import bisection
from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.plan import lower_bound
from workbench.model.target import Target
from workbench.model.tolerances import BETTER, COVER_SLACK, SET_THRESHOLD_SEARCH, TINY, ceil_count, ceil_counts
from workbench.planners.evaluate.period import allocation_best, normalise
from workbench.planners.ilp.bounds import chain_arrays

__all__ = ["DeviceSets", "device_sets", "cover_bound", "cover_search", "CoverResult", "TooManySets"]

MAX_SETS = 200_000


class TooManySets(RuntimeError):
    """The device sets under the period bound are too many to enumerate."""


@dataclass
class DeviceSets:
    """Every device set possible below ``t_max``: masks, thresholds, loads, least memory.

    ``groups[u]`` lists (threshold, mask, load) of the sets whose lowest layer is u,
    sorted by threshold (a DFS that always covers the lowest uncovered layer next
    sees every partition exactly once)."""

    L: int
    P: int
    t_max: float
    masks: np.ndarray
    thresholds: np.ndarray
    loads: np.ndarray
    comp: np.ndarray   # per layer: f + b
    down: np.ndarray   # per layer: compute from it to the end and back
    a: np.ndarray      # per layer memory terms (workbench.model.memory_bands.linear_terms)
    w0: np.ndarray
    head: np.ndarray   # added per in-flight mini-batch where a run (a stage) starts
    tail: np.ndarray   # ... and where it ends
    buf_head: np.ndarray   # a receive buffer where a run starts (once, not per mini-batch)
    buf_tail: np.ndarray   # ... and where it ends
    const: float       # runtime constant of a used device
    groups: list[list[tuple[float, int, float]]] = field(repr=False)
    keys: list[list[float]] = field(repr=False)
    c: np.ndarray      # per cut position l (between l and l+1): transfer time
    memory: float
    _runs: dict = field(default_factory=dict, repr=False)
    _index: dict | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        return int(len(self.masks))

    @property
    def index(self) -> dict[int, float]:
        """mask -> threshold."""
        if self._index is None:
            self._index = dict(zip(self.masks.tolist(), self.thresholds.tolist()))
        return self._index

    def runs(self, mask: int) -> tuple[int, tuple[tuple[float, int, float], ...], float]:
        """``(own cuts, runs, w0 sum)`` of a set: its own cut positions as a bitmask (a layer of the
        set next to one outside it), and per maximal run ``(D of its first layer, its last layer,
        sum of a)``, runs in chain order. Cached."""
        r = self._runs.get(mask)
        if r is None:
            L = self.L
            own = (mask ^ (mask >> 1)) & ((1 << (L - 1)) - 1) if L > 1 else 0
            out = []
            buffers = 0.0
            l = 0
            while l < L:
                if mask >> l & 1:
                    i = l
                    while l + 1 < L and mask >> (l + 1) & 1:
                        l += 1
                    out.append((float(self.down[i]), l, float(self.a[i:l + 1].sum() + self.head[i] + self.tail[l])))
                    buffers += float(self.buf_head[i] + self.buf_tail[l])
                l += 1
            w0 = float(sum(self.w0[l] for l in range(L) if mask >> l & 1)) + self.const + buffers
            r = (own, tuple(out), w0)
            self._runs[mask] = r
        return r

    def suffix(self, cuts: int) -> list[float]:
        """Per layer j: twice the transfer time of the cuts (a bitmask) at positions >= j."""
        c = self.c
        out = [0.0] * self.L
        acc = 0.0
        for m in range(self.L - 1, -1, -1):
            if cuts >> m & 1:
                acc += 2 * c[m]
            out[m] = acc
        return out

    def _fits(self, mask: int, cs: list[float], T: float) -> bool:
        """Rule 7 for ``mask`` on one device at period T, every run a stage whose window holds
        everything downstream plus ``cs`` (:meth:`suffix`) from its end on: k >= ceil(window / T)."""
        _, runs, w0 = self.runs(mask)
        need = w0
        for d, j, asum in runs:
            need += ceil_count((d + cs[j]) / T) * asum
        return need <= self.memory * (1 + COVER_SLACK)

    def allocation_fits(self, parts: list[int], T: float) -> bool:
        """Necessary conditions for a whole partition at period T, every cut known: each device's
        memory with every stage's full downstream path (rule 7, k >= ceil(path / T)) and every
        link's load (rule 6)."""
        L = self.L
        c = self.c
        cuts = 0
        for s in parts:
            cuts |= self.runs(s)[0]
        if math.isfinite(self.memory):
            cs = self.suffix(cuts)
            for s in parts:
                if not self._fits(s, cs, T):
                    return False
        if cuts:
            dev = _assignment(parts, L)
            link: dict[tuple[int, int], float] = {}
            lim = T * (1 + COVER_SLACK)
            for m in range(L - 1):
                if cuts >> m & 1:
                    key = (min(dev[m], dev[m + 1]), max(dev[m], dev[m + 1]))
                    v = link.get(key, 0.0) + c[m]
                    if v > lim:
                        return False
                    link[key] = v
        return True


def _masks_under_load(comp: np.ndarray, t_max: float, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """All non-empty bitmasks with load <= t_max (grown one layer at a time), and their loads."""
    masks = np.zeros(1, dtype=np.int64)
    loads = np.zeros(1)
    lim = t_max * (1 + COVER_SLACK)
    for l in range(len(comp)):
        ok = loads + comp[l] <= lim
        masks = np.concatenate([masks, masks[ok] | np.int64(1 << l)])
        loads = np.concatenate([loads, loads[ok] + comp[l]])
        if len(masks) > limit:
            raise TooManySets(f"more than {limit} device sets under a period of {t_max:.6g}")
    return masks[1:], loads[1:]


def _thresholds(masks: np.ndarray, loads: np.ndarray, down, c, a, w0, memory: float,
                chunk: int = 50_000, deadline: float | None = None, device_const: float = 0.0) -> np.ndarray:
    """The threshold of every mask (``loads``: theirs); inf where even one mini-batch per stage
    does not fit. ``a`` is (per-layer a, head, tail, buf_head, buf_tail): a run of the set is a
    stage, so its first layer's head and receive buffer and its last layer's count too; the device's transient is
    left out (a relaxation, which keeps thresholds lower bounds)."""
    L = len(down)
    out_t = np.empty(len(masks))
    bits = np.arange(L, dtype=np.int64)
    for lo in range(0, len(masks), chunk):
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError("device sets: time limit")
        m = masks[lo:lo + chunk]
        B = ((m[:, None] >> bits) & 1).astype(bool)
        load = loads[lo:lo + chunk]
        if not math.isfinite(memory):
            out_t[lo:lo + chunk] = load
            continue
        nxt = np.zeros_like(B)
        nxt[:, :-1] = B[:, 1:]
        certain = (B ^ nxt)
        certain[:, -1] = False
        suffix = np.cumsum((certain * (2 * c))[:, ::-1], axis=1)[:, ::-1]  # sum over cuts >= l
        prev = np.zeros_like(B)
        prev[:, 1:] = B[:, :-1]
        start = B & ~prev
        # window of the run containing each layer (0 outside S)
        win = np.zeros(B.shape)
        cur = np.zeros(len(m))
        for l in range(L):
            cur = np.where(start[:, l], down[l] + suffix[:, l], cur)
            win[:, l] = np.where(B[:, l], cur, 0.0)
        a_l, head, tail, buf_head, buf_tail = a
        end = B & ~nxt
        A = np.where(B, a_l, 0.0) + np.where(start, head, 0.0) + np.where(end, tail, 0.0)
        const = (B.astype(float) @ w0 + start.astype(float) @ buf_head + end.astype(float) @ buf_tail
                 + device_const)

        def need(T: np.ndarray) -> np.ndarray:
            k = ceil_counts(win / T[:, None])
            return (np.where(B, k, 0.0) * A).sum(axis=1) + const

        cap = memory * (1 + COVER_SLACK)
        hi = np.maximum(win.max(axis=1), TINY)        # every k = 1
        fits = need(hi) <= cap
        lo_T, _ = bisection.bisect(np.zeros(len(m)), hi.copy(), lambda T: need(T) <= cap, rel=SET_THRESHOLD_SEARCH,
                         max_steps=64)
        t = np.maximum(load, lo_T)  # lo_T: the memory threshold from below (a valid bound)
        out_t[lo:lo + chunk] = np.where(fits, t, np.inf)
    return out_t


def device_sets(chain: Chain, platform: Target, t_max: float, *, limit: int = MAX_SETS,
                deadline: float | None = None) -> DeviceSets:
    """The device sets with threshold <= ``t_max`` (raises :class:`TooManySets` above ``limit``,
    TimeoutError past ``deadline``).

    >>> from workbench.model.chain import Chain, Layer
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
    >>> device_sets(ch, Target.of(2, memory_model="paper"), 6.0).count   # sets of at most 2 layers
    6
    """
    comp, down, c, a, w0 = chain_arrays(chain, platform)
    lin = linear_terms(layer_terms(chain, platform))
    L = len(chain)
    masks, load = _masks_under_load(comp, t_max, limit)
    t = _thresholds(masks, load, down, c, (a, lin.head, lin.tail, lin.buf_head, lin.buf_tail), w0,
                    platform.memory_limit, deadline=deadline, device_const=lin.const)
    keep = t <= t_max * (1 + COVER_SLACK)
    masks, t, load = masks[keep], t[keep], load[keep]
    low = np.zeros(len(masks), dtype=np.int64)
    if len(masks):
        low = np.array([int(mm & -mm).bit_length() - 1 for mm in masks.tolist()], dtype=np.int64)
    groups: list[list[tuple[float, int, float]]] = []
    keys: list[list[float]] = []
    for u in range(L):
        sel = np.flatnonzero(low == u)
        order = sel[np.argsort(t[sel], kind="stable")]
        g = [(float(t[i]), int(masks[i]), float(load[i])) for i in order]
        groups.append(g)
        keys.append([x[0] for x in g])
    return DeviceSets(L, platform.devices, t_max, masks, t, load, comp, down, a, w0, lin.head, lin.tail,
                      lin.buf_head, lin.buf_tail, lin.const, groups, keys, c, platform.memory_limit)


def _least_memory(ds: DeviceSets, T: float) -> np.ndarray:
    """Per layer, memory it needs whatever its stage (k >= ceil(D_l / T))."""
    return ceil_counts(ds.down / T) * ds.a + ds.w0


class _Deadline(Exception):
    pass


def _covers(ds: DeviceSets, theta_hi: float, theta_lo: float, least: np.ndarray, memory: float,
            deadline: float | None, counter: list[int]):
    """Yield (bottleneck, parts) of every partition into <= P sets with bottleneck (the largest
    threshold) in ``[theta_lo, theta_hi)`` (``theta_hi`` is ``counter[1]``, which the caller may
    lower while the search runs). Tests are made against ``theta * (1 - COVER_SLACK)`` at both ends, so
    successive bands see every partition once.

    A depth-first search that always covers the lowest uncovered layer next (:class:`_CoverWalk`); the
    last set is found by a lookup (the remaining layers must form a set), not by a scan."""
    walk = _CoverWalk(ds, least, memory, deadline, counter, theta_lo * (1 - COVER_SLACK))
    counter[1] = theta_hi
    yield from walk.dfs(0, 0, float(ds.comp.sum()), float(least.sum()), 0.0)


class _CoverWalk:
    """The depth-first search of :func:`_covers`; ``counter``: nodes visited, the band's upper end."""

    def __init__(self, ds: DeviceSets, least: np.ndarray, memory: float, deadline: float | None,
                 counter: list, lo_lim: float) -> None:
        self.ds, self.memory, self.deadline, self.counter, self.lo_lim = ds, memory, deadline, counter, lo_lim
        self.full = (1 << ds.L) - 1
        self.least_l = least.tolist()
        self.mem_ok, self.index = math.isfinite(memory), ds.index
        self.parts: list[int] = []

    def _last(self, rest: int, bott: float, lim: float) -> tuple[float, list[int]] | None:
        """The partition completed by the set ``rest``, if below ``lim`` and reaching the band's lower end."""
        t = self.index.get(rest, math.inf)
        if t < lim and max(bott, t) >= self.lo_lim:
            return max(bott, t), self.parts + [rest]
        return None

    def _least_memory_of(self, s: int) -> float:
        """The least memory of set ``s`` (0.0 without a memory limit)."""
        ml = 0.0
        if self.mem_ok:
            while s:
                bit = s & -s
                ml += self.least_l[bit.bit_length() - 1]
                s ^= bit
        return ml

    def dfs(self, covered: int, depth: int, rem_load: float, rem_mem: float, bott: float):
        """Every completion of the sets chosen so far (``covered`` their layers) within the band."""
        ds, counter, parts = self.ds, self.counter, self.parts
        counter[0] += 1
        if counter[0] & 1023 == 0 and self.deadline is not None and time.perf_counter() > self.deadline:
            raise _Deadline
        left = ds.P - depth
        th = counter[1]
        lim, free = th * (1 - COVER_SLACK), ~covered & self.full
        if rem_load > left * th * (1 + COVER_SLACK) or (
                self.mem_ok and rem_mem > left * self.memory * (1 + COVER_SLACK)):
            return
        if left == 1:  # the rest must be one set
            last = self._last(free, bott, lim)
            if last is not None:
                yield last
            return
        u = (free & -free).bit_length() - 1
        g = ds.groups[u]
        for i in range(bisect.bisect_left(ds.keys[u], lim)):
            t, s, ld = g[i]
            if t >= counter[1] * (1 - COVER_SLACK):
                break
            if s & covered:
                continue
            b = max(bott, t)
            parts.append(s)
            if s == free:
                if b >= self.lo_lim:
                    yield b, list(parts)
            elif left == 2:  # the rest must be one set
                last = self._last(free & ~s, b, counter[1] * (1 - COVER_SLACK))
                if last is not None:
                    yield last
            else:
                yield from self.dfs(covered | s, depth + 1, rem_load - ld, rem_mem - self._least_memory_of(s), b)
            parts.pop()


def cover_bound(chain: Chain, platform: Target, upper: float, *, deadline: float | None = None,
                sets: DeviceSets | None = None) -> float:
    """The cover bound: least bottleneck ``max_S t(S)`` over partitions, if below ``upper``
    (else ``upper``). A lower bound on the period of every general (and contiguous) plan.

    >>> from workbench.model.chain import Chain, Layer
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
    >>> cover_bound(ch, Target.of(2, memory_model="paper"), 9.0)   # 3 layers of load 3 on 2 devices
    6.0
    """
    ds = sets if sets is not None else device_sets(chain, platform, upper)
    least = _least_memory(ds, upper)
    counter = [0, upper]
    best = upper
    try:
        for bott, _ in _covers(ds, upper, 0.0, least, platform.memory_limit, deadline, counter):
            best = min(best, bott)
            counter[1] = best  # only strictly better partitions from now on
    except _Deadline:
        raise TimeoutError("cover bound: time limit") from None
    return best


@dataclass
class CoverResult:
    """Outcome of :func:`cover_search`: status 'optimal' (no allocation below ``period``) or
    'timeout'; ``bound`` is the proven lower bound; ``assignment``/``fwd``/``bwd`` the best
    allocation found below the starting incumbent (None if none)."""

    status: str
    period: float
    bound: float
    assignment: tuple[int, ...] | None = None
    fwd: list[float] | None = None
    bwd: list[float] | None = None
    evaluated: int = 0
    nodes: int = 0
    sets: int = 0
    seconds: float = 0.0


def _assignment(parts: list[int], L: int) -> tuple[int, ...]:
    a = [0] * L
    for p, s in enumerate(parts):
        for l in range(L):
            if s >> l & 1:
                a[l] = p
    return tuple(a)


def cover_search(chain: Chain, platform: Target, T_inc: float, *, deadline: float | None = None,
                 bands: int = 6, progress=None) -> CoverResult:
    """Exact search for a general allocation with period below ``T_inc`` (see the module docstring).

    ``progress(bound, period)`` is called when the bound or the incumbent improves.
    Raises :class:`TooManySets` when the device sets are too many to enumerate."""
    t0 = time.perf_counter()
    L = len(chain)
    try:
        ds = device_sets(chain, platform, T_inc, deadline=deadline)
    except TimeoutError:
        return CoverResult("timeout", T_inc, min(T_inc, lower_bound(chain, platform)),
                           seconds=time.perf_counter() - t0)
    best_T = T_inc
    hit = None
    counter = [0, T_inc]
    evaluated = 0

    def result(status: str, bound: float) -> CoverResult:
        a, f, b = (hit if hit is not None else (None, None, None))
        return CoverResult(status, best_T, min(bound, best_T), a, f, b, evaluated, counter[0], ds.count,
                           time.perf_counter() - t0)

    try:
        lb = cover_bound(chain, platform, T_inc, deadline=deadline, sets=ds)
    except TimeoutError:
        return result("timeout", lower_bound(chain, platform))
    if progress:
        progress(lb, best_T)
    if lb >= best_T * (1 - COVER_SLACK):
        return result("optimal", best_T)
    bound = lb
    theta_lo = 0.0
    for j in range(1, bands + 1):
        theta = lb + (best_T - lb) * (2.0 ** (j - bands)) if j < bands else best_T
        theta = min(theta, best_T)
        if theta <= theta_lo:
            continue   # the incumbent fell below this band: already searched
        least = _least_memory(ds, best_T)
        counter[1] = theta
        try:
            for _, parts in _covers(ds, theta, theta_lo, least, platform.memory_limit, deadline, counter):
                if deadline is not None and time.perf_counter() > deadline:
                    raise _Deadline   # polled per partition: each costs a feasibility test
                if not ds.allocation_fits(parts, best_T):
                    continue   # cannot reach a period below the incumbent (memory or a link)
                a = normalise(_assignment(parts, L))
                evaluated += 1
                try:
                    r = allocation_best(chain, platform, a, best_T * (1 - BETTER), deadline=deadline)
                except TimeoutError:
                    raise _Deadline from None
                if r is not None and r[0] < best_T * (1 - BETTER):
                    best_T, hit = r[0], (a, list(r[1]), list(r[2]))
                    counter[1] = min(counter[1], best_T)
                    if progress:
                        progress(bound, best_T)
        except _Deadline:
            return result("timeout", bound)
        bound = max(bound, min(theta, best_T))
        theta_lo = theta
        if progress:
            progress(bound, best_T)
        if bound >= best_T * (1 - COVER_SLACK):
            return result("optimal", best_T)
    return result("optimal", best_T)
