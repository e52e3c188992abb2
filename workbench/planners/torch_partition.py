"""The partition search of torch's schedules as planners: stages balanced by time under the memory limit.

:mod:`workbench.planners.torch_schedules` plans a chain with one of torch's multi-stage schedules; the order
of operations does not depend on the partition, so for each micro-batch count it searches partitions of the
chain into S stages (docs/model.md, "Torch's schedules"):

1. the time-balanced partition: the least largest stage time ``tau`` such that a partition has every stage
   within ``tau`` (and, with caps, within each stage's share of memory): the answer is one of the distinct
   stage times; a bisection over ``tau`` (each probe a backward reachability over (stage, first layer))
   narrows it to a window holding a few of them, which are then listed and bisected exactly; each stage is
   then chosen as close as allowed to an equal share of the compute left;
2. under a finite limit that the first does not fit, seeds from shares of the limit per stage, each improved
   by a local search that moves one stage boundary at a time.

Without caps a probe is O(S L) (prefix sums: a stage's time grows with its last layer); the memory of every
stage ``a..b`` (L x L matrices, :func:`workbench.model.memory_bands.square_terms`) is computed only when a cap
asks for it, once per call. Every step after the time-balanced partition polls a deadline (a :class:`Clock`)
and stops there with what it has; the clock says whether it stopped anything.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1, 1) for i in range(8)), input_bytes=1)
>>> spans = Spans(ch, Target.of(2, memory_model="paper"))
>>> Balance(spans, [0, 1, 0, 1], [2, 2, 1, 1], [0, 0, 0, 0]).least_tau([float("inf")] * 4)
[(0, 1), (2, 3), (4, 5), (6, 7)]
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from workbench.model.chain import Chain
from workbench.model.memory import flushed_platform, layer_terms
from workbench.model.memory_bands import band_terms, square_terms
from workbench.model.split import split_columns
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.schedules.order_memory import OrderMemory

__all__ = ["Spans", "Balance", "Clock", "candidates"]

#: the exact bisection lists the stage times of a window once it holds at most this many per layer
WINDOW_PER_LAYER = 4
#: seconds per stage a..b of building the memory matrices (square_terms: about 1 s for 2,000 layers on the 2-core
#: machine, 2-5 s under load): a cap's seeds are not tried when this does not fit what is left
SQUARE_SECONDS_PER_CELL = 1e-6


class Clock:
    """A deadline (a ``perf_counter`` time; None: none) that remembers whether it stopped anything (``cut``:
    the result may then differ between runs).

    >>> c = Clock(None); c.past(), c.cut
    (False, False)
    >>> c = Clock(0.0); c.past(), c.cut
    (True, True)
    """

    def __init__(self, end: float | None = None) -> None:
        self.end = end
        self.cut = False

    def past(self) -> bool:
        if self.end is not None and time.perf_counter() > self.end:
            self.cut = True
        return self.cut

    def left(self) -> float:
        """Seconds to the end (inf: none; 0 once cut)."""
        if self.cut:
            return 0.0
        return math.inf if self.end is None else max(0.0, self.end - time.perf_counter())


def _past(clock: Clock | None) -> bool:
    return clock is not None and clock.past()


class Spans:
    """What every micro-batch count shares: per layer compute and its prefix sums, and (on first use) every
    stage's memory terms as L x L matrices: activations ``A``, the rest ``base`` and the pending bytes."""

    def __init__(self, chain: Chain, platform: Target) -> None:
        self.chain, self.platform = chain, platform
        self.comp = np.asarray(chain.forward + chain.backward, dtype=float)
        self.L = len(self.comp)
        self.pre = np.concatenate([[0.0], np.cumsum(self.comp)])
        self.terms = layer_terms(chain, flushed_platform(platform))     # a flush's gradients accumulate
        pend = np.concatenate([[0.0], np.cumsum(split_columns(chain)[1])])
        #: pending bytes' prefix sums
        self.pend = pend if platform.setup.memory_model == "full" else np.zeros_like(pend)
        self._square: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def span(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        """The compute of stages ``a..b``."""
        return self.pre[np.asarray(b) + 1] - self.pre[np.asarray(a)]

    def last_within(self, limit: float) -> np.ndarray:
        """Per first layer a, the last layer b with ``span(a, b) <= limit`` (a - 1 if none): the same floats the
        stage times are, found by a search on the prefix sums and set right where rounding differs."""
        a = np.arange(self.L)
        e = np.clip(np.searchsorted(self.pre, self.pre[:-1] + limit, side="right") - 2, a - 1, self.L - 1)
        while True:
            up = (e < self.L - 1) & (self.pre[np.minimum(e + 2, self.L)] - self.pre[a] <= limit)
            down = (e >= a) & (self.pre[e + 1] - self.pre[a] > limit)
            if not (up.any() or down.any()):
                return e
            e = e + up - down

    @property
    def has_square(self) -> bool:
        return self._square is not None

    def square_seconds(self, stages: int) -> float:
        """About how long the L x L memory matrices and one mask per stage take (:data:`SQUARE_SECONDS_PER_CELL`)."""
        return SQUARE_SECONDS_PER_CELL * self.L ** 2 * (1 + 0.1 * stages)

    def square(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A, base, pending) of every stage a..b (0 where b < a), computed once."""
        if self._square is None:
            L = self.L
            first, last = np.arange(L)[:, None], np.arange(L)[None, :]
            sq = square_terms(self.terms)
            pend_sq = np.where(last >= first, self.pend[np.minimum(last + 1, L)] - self.pend[first], 0.0)
            self._square = (np.where(last >= first, sq.A, 0.0), sq.static + sq.extra - self.terms.const, pend_sq)
        return self._square

    def stage_memory(self, k: int, p: int) -> np.ndarray:
        """The memory of every stage a..b holding ``k`` micro-batches and ``p`` pending ones (inf where b < a)."""
        A, base, pend = self.square()
        ends = np.arange(self.L)
        return np.where(ends[None, :] >= ends[:, None], k * A + base + p * pend, np.inf)

    def stage_memory_row(self, k: int, p: int, a: int) -> np.ndarray:
        """Row ``a`` of :meth:`stage_memory` (the same figures) without the L x L matrices."""
        J = np.arange(a, self.L)[None, :]
        band = band_terms(self.terms, np.array([[a]]), J)
        out = np.full(self.L, np.inf)
        out[a:] = k * band.A[0] + (band.static[0] + band.extra[0] - self.terms.const) + \
            p * (self.pend[J[0] + 1] - self.pend[a])
        return out

    def count_stage_times_in(self, lo: float, hi: float) -> int:
        """How many stages a..b have a time in (lo, hi] (with repeats)."""
        x, y = self.last_within(lo), self.last_within(hi)
        return int(np.maximum(y - np.maximum(x, np.arange(self.L) - 1), 0).sum())

    def stage_times_in(self, lo: float, hi: float) -> np.ndarray:
        """The distinct stage times in (lo, hi], sorted."""
        x, y = self.last_within(lo), self.last_within(hi)
        n = np.maximum(y - np.maximum(x, np.arange(self.L) - 1), 0)
        starts = np.repeat(np.arange(self.L), n)
        ends = np.repeat(np.maximum(x, np.arange(self.L) - 1) + 1, n) + _ramp(n)
        return np.unique(self.span(starts, ends))


def _ramp(n: np.ndarray) -> np.ndarray:
    """0, 1, ..., n[0]-1, 0, 1, ..., n[1]-1, ..."""
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, dtype=int)
    offsets = np.repeat(np.cumsum(n) - n, n)
    return np.arange(total) - offsets


class Balance:
    """One micro-batch count's partition problem: per stage its device, the most micro-batches it holds and
    the most whose weight gradients wait (``k``, ``p``: :func:`workbench.schedules.torch_orders.order_counts`)."""

    def __init__(self, spans: Spans, dev: list[int], k: list[int], p: list[int]) -> None:
        self.spans, self.dev, self.k, self.p = spans, dev, k, p
        self._masks: tuple[tuple[float, ...], list[np.ndarray | None]] | None = None

    @property
    def S(self) -> int:
        return len(self.k)

    def mem_row(self, s: int, a: int) -> np.ndarray:
        """Stage s's memory on layers a..b for every b (inf for b < a)."""
        return self.spans.stage_memory_row(self.k[s], self.p[s], a)

    def masks(self, caps: Sequence[float]) -> list[np.ndarray | None]:
        """Per stage, which stages a..b fit its cap (None: no cap), for the caps last asked about."""
        key = tuple(float(c) for c in caps)
        if self._masks is None or self._masks[0] != key:
            out: list[np.ndarray | None] = []
            for s, cap in enumerate(key):
                if not np.isfinite(cap):
                    out.append(None)
                    continue
                out.append(self.spans.stage_memory(self.k[s], self.p[s]) <= cap * (1 + REL_TOL))
            self._masks = (key, out)
        return self._masks[1]

    def feasible(self, tau: float, caps: Sequence[float]) -> list[np.ndarray] | None:
        """Backward reachability: ``can[s][a]`` is True when layers a.. split into stages s.. within ``tau``
        and the caps; None when stage 0 cannot start at layer 0."""
        L, S = self.spans.L, self.S
        last = self.spans.last_within(tau * (1 + REL_TOL))
        masks = self.masks(caps)
        can = [np.zeros(L + 1, dtype=bool) for _ in range(S + 1)]
        can[S][L] = True
        a = np.arange(L)
        for s in range(S - 1, -1, -1):
            nxt = can[s + 1]
            if masks[s] is None:   # some end in a..last[a] leaves a reachable rest
                count = np.concatenate([[0], np.cumsum(nxt[1:])])
                can[s][:L] = count[last + 1] - count[a] > 0
            else:
                ok = masks[s] & nxt[None, 1:]
                first = np.argmax(ok, axis=1)
                can[s][:L] = ok[a, first] & (first <= last)
        return can if can[0][0] else None

    def pick(self, tau: float, caps: Sequence[float], can: list[np.ndarray]) -> list[tuple[int, int]]:
        """A partition within ``tau`` and the caps: each stage as close as allowed to an equal share of the
        compute left."""
        L, S, sp = self.spans.L, self.S, self.spans
        out, a = [], 0
        for s in range(S):
            ends = np.arange(a, L)
            span = sp.span(a, ends)
            ok = (span <= tau * (1 + REL_TOL)) & can[s + 1][ends + 1]
            if np.isfinite(caps[s]):
                ok &= self.mem_row(s, a)[a:] <= caps[s] * (1 + REL_TOL)
            target = (sp.pre[L] - sp.pre[a]) / (S - s)
            choice = ends[ok][np.argmin(np.abs(span[ok] - target))]
            out.append((a, int(choice)))
            a = int(choice) + 1
        return out

    def least_tau(self, caps: Sequence[float], deadline: Clock | None = None) -> list[tuple[int, int]] | None:
        """The partition at the least feasible largest stage time (one of the distinct stage times), or None
        (also past ``deadline``): a bisection over tau until a window holds a few stage times, then over
        them (module docstring)."""
        sp = self.spans
        if _past(deadline):
            return None
        lo_v, hi_v = float(sp.comp.max()), float(sp.pre[-1])
        if self.feasible(hi_v, caps) is None:
            return None
        if self.feasible(lo_v, caps) is not None:
            taus = np.array([lo_v])
        else:
            for _ in range(200):   # f(lo_v) false, f(hi_v) true
                if sp.count_stage_times_in(lo_v, hi_v * (1 + REL_TOL)) <= WINDOW_PER_LAYER * sp.L + 64:
                    break
                if _past(deadline):
                    return None
                mid = 0.5 * (lo_v + hi_v)
                if mid <= lo_v or mid >= hi_v:
                    break
                if self.feasible(mid, caps) is None:
                    lo_v = mid
                else:
                    hi_v = mid
            taus = sp.stage_times_in(lo_v, hi_v * (1 + REL_TOL))
        lo, hi = 0, len(taus) - 1
        best = self.feasible(float(taus[hi]), caps)
        if best is None:   # pragma: no cover - the window's largest time is at least a feasible partition's
            return None
        while lo < hi:
            if _past(deadline):
                return None
            mid = (lo + hi) // 2
            got = self.feasible(float(taus[mid]), caps)
            if got is None:
                lo = mid + 1
            else:
                hi, best = mid, got
        return self.pick(float(taus[hi]), caps, best)

    def needs(self, parts: list[tuple[int, int]]) -> list[float]:
        return [float(self.mem_row(s, a)[b]) for s, (a, b) in enumerate(parts)]


def _shares(prob: Balance, base: list[tuple[int, int]], devices: int) -> list[list[float]]:
    """The shares of the limit per stage tried as seeds: equal per device, by need under ``base``, by held
    count."""
    def per_device(weights: Sequence[float]) -> list[float]:
        tot = [0.0] * devices
        for s, w in enumerate(weights):
            tot[prob.dev[s]] += w
        return [w / tot[prob.dev[s]] if tot[prob.dev[s]] > 0 else 1.0 for s, w in enumerate(weights)]

    return [per_device([1.0] * prob.S), per_device(prob.needs(base)), per_device([float(k) for k in prob.k])]


def _score(prob: Balance, peaks: OrderMemory, parts: list[tuple[int, int]], limit: float
           ) -> tuple[float, float, float]:
    """(how far the worst device is over the limit, the largest stage time, the sum of squared device loads)."""
    over = max(0.0, max(peaks.peaks(parts)) - limit) if np.isfinite(limit) else 0.0
    times = [float(prob.spans.span(a, b)) for a, b in parts]
    load = [0.0] * prob.spans.platform.devices
    for s, t in enumerate(times):
        load[prob.dev[s]] += t
    return over, max(times), float(sum(x * x for x in load))


def _local_search(prob: Balance, peaks: OrderMemory, parts: list[tuple[int, int]], limit: float,
                  deadline: Clock | None = None) -> list[tuple[int, int]]:
    """Move one stage boundary at a time (by one layer, or by a few) to the best neighbour, first towards
    fitting the limit, then towards a smaller largest stage time, until no move helps (or ``deadline``)."""
    L = prob.spans.L
    bounds = [b for _, b in parts[:-1]]
    steps = sorted({1, max(1, L // (4 * len(parts)))})
    best = _score(prob, peaks, parts, limit)
    for _ in range(4 * L):
        if _past(deadline):
            break
        found = None
        for i in range(len(bounds)):
            for step in steps:
                for delta in (-step, step):
                    nb = bounds[i] + delta
                    lo = bounds[i - 1] + 1 if i > 0 else 0
                    hi = bounds[i + 1] - 1 if i + 1 < len(bounds) else L - 2
                    if not lo <= nb <= hi:
                        continue
                    trial = bounds[:i] + [nb] + bounds[i + 1:]
                    sc = _score(prob, peaks, _parts(trial, L), limit)
                    if sc < best and (found is None or sc < found[0]):
                        found = (sc, trial)
        if found is None:
            break
        best, bounds = found
    return _parts(bounds, L)


def _parts(bounds: Sequence[int], L: int) -> list[tuple[int, int]]:
    starts = [0] + [b + 1 for b in bounds]
    return [(a, e) for a, e in zip(starts, list(bounds) + [L - 1])]


def candidates(prob: Balance, peaks: OrderMemory, limit: float, devices: int,
               deadline: Clock | None = None) -> list[list[tuple[int, int]]]:
    """Partitions to simulate: the time-balanced one and, under a finite limit it does not fit, seeds from
    shares of the limit per stage (the sum of its stages' needs bounds a device's peak), each improved by
    :func:`_local_search`; past ``deadline`` no further seed is made or improved."""
    base = prob.least_tau([np.inf] * prob.S)
    if base is None:
        return []
    if not np.isfinite(limit) or max(peaks.peaks(base)) <= limit * (1 + REL_TOL):
        return [base]
    seeds = [base]
    budget = limit - prob.spans.terms.const
    if deadline is not None and not prob.spans.has_square and prob.spans.square_seconds(prob.S) > deadline.left():
        deadline.cut = True        # the seeds' memory matrices would not be built in time: the local search alone
    for share in _shares(prob, base, devices):
        if _past(deadline):
            break
        got = prob.least_tau([budget * x for x in share], deadline)
        if got is not None:
            seeds.append(got)
    out: list[list[tuple[int, int]]] = []
    for seed in seeds:
        found = _local_search(prob, peaks, seed, limit, deadline)
        if found not in out:
            out.append(found)
    return out
