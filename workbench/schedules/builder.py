"""The periodic schedule builder: start times for an allocation and a period (docs/model.md, "Plan").

Given the device of every layer (an *allocation*) and a period T,
:func:`build_schedule` places the forward and backward of every stage as
early as rules 2-6 allow and returns a :class:`~workbench.model.plan.Plan`;
:func:`best_schedule` finds the smallest period whose schedule fits the
memory limit. :class:`Scheduler` does the same with the per-stage sums
computed once, for planners that call it many times.

**Contiguous allocations** (one stage per device). Walk backward from the
last stage S. Its backward starts when its forward ends (rule 3): window
w_S = F_S + B_S, which needs F_S + B_S <= T (rule 5). For stage s < S, with
forwards and backwards as early as rules 2 and 4 allow, the raw window is

    w_s = F_s + c_s + w_{s+1} + c_s + B_s,       k_s = ceil(w_s / T).

Rule 5 on the device of s concerns only F_s and B_s. Write
d = b_s - f_s = qT + r (0 <= r < T): F_s and B_s are disjoint modulo T iff
F_s <= r <= T - B_s, i.e. the window w = d + B_s lies in
[jT + F_s + B_s, (j+1)T] for some j >= 0. With k = ceil(w/T) that is
j = k - 1 and "the gap between the end of the forward and the start of the
backward, b_s - (f_s + F_s), is at least (k-1)T". If the raw window breaks
it (w - (k-1)T < F_s + B_s) the backward is delayed to make
w_s = (k-1)T + F_s + B_s <= kT: k_s does not change. This is the smallest
admissible window not below the raw one, and the raw window of stage s
only grows with w_{s+1}, so every stage gets its smallest possible window,
hence its smallest in-flight count k_s and the least memory any schedule of
this allocation and period can have. (By induction w_s(T)/T is
non-increasing in T, so the k_s and the memory are non-increasing in T and
the feasible periods form an interval [T*, inf): bisection is exact, and a
final "polish" solves the affine breakpoint equation w_s(T) = k_s T.)

**General allocations** (a device holds several stages). The operations of
one mini-batch form a single dependency chain F_0 .. F_S, B_S .. B_0, so a
list schedule places each, in that order, at the earliest time after its
release at which it does not overlap (modulo T) what its device already
holds (``mode="asap"``, which reproduces the contiguous construction above
when each device has one stage). It can fail when the free time of a device
is fragmented; ``mode="packed"`` keeps each device's operations in one
contiguous arc of the period (an operation goes right after or right
before the arc) and never fails while every device load is <= T.
``mode="auto"`` tries both and keeps the one that fits best.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 100, 10) for i in range(6)), input_bytes=10)
>>> plat = Target.of(3, memory=1000, bandwidth=20000, memory_model="paper")
>>> plan = build_schedule(chain, plat, [0, 0, 1, 1, 2, 2], 0.008)
>>> [round(s.bwd_start * 1e3, 6) for s in plan.stages], [s.in_flight for s in plan.stages]
([18.0, 12.5, 7.0], [3, 2, 1])
>>> best = best_schedule(chain, plat.with_(memory=500), [0, 0, 1, 1, 2, 2])
>>> round(best.period * 1e3, 6), [s.in_flight for s in best.stages]
(13.0, [2, 1, 1])
"""

from __future__ import annotations

import math
import time
from typing import Literal, Sequence

from workbench.model.activations import stage_host_time
from workbench.model.chain import Chain
from workbench.model.memory import device_extra, layer_terms, stage_activation, stage_memory
from workbench.model.plan import Plan, Stage, in_flight, infeasible_plan, lower_bound, stages_of, with_memory_setup
from workbench.model.target import Target
from workbench.model.tolerances import CEIL_SLACK, COUNT_NOISE, PERIOD_SEARCH, REL_TOL, START_PERIOD
from workbench.model.units import format_bytes, format_seconds
from workbench.schedules.builder_host import NoSchedule, earliest, general_offload

__all__ = ["NoSchedule", "Scheduler", "build_schedule", "best_schedule", "load_period", "one_in_flight_memory"]

Mode = Literal["auto", "asap", "packed"]


def _ceil(x: float) -> int:
    """ceil(x) for x >= 0, forgiving float noise only (the checker forgives REL_TOL; plans record its count)."""
    k = int(x)
    if x - k > COUNT_NOISE * (x if x > 1.0 else 1.0):
        k += 1
    return k


class Scheduler:
    """Schedules for one allocation, with the per-stage sums computed once.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
    >>> s = Scheduler(chain, Target.of(2, memory_model="paper"), [0, 0, 1, 1])
    >>> s.load_period, s.stage_count, s.contiguous
    (6.0, 2, True)
    >>> s.times(6.0)
    ([0.0, 2.0], [8.0, 4.0])
    """

    def __init__(self, chain: Chain, platform: Target, assignment: Sequence[int]):
        assignment = tuple(int(a) for a in assignment)
        if len(assignment) != len(chain):
            raise ValueError(f"the assignment has {len(assignment)} entries for a chain of {len(chain)} layers")
        P = platform.devices
        for l, d in enumerate(assignment):
            if not 0 <= d < P:
                raise ValueError(f"layer {l} ({chain[l].name}) is on device {d}, not in 0..{P - 1}")
        self.chain, self.platform, self.assignment = chain, platform, assignment
        self.runs = runs = stages_of(assignment)
        # the sums of Chain.stage_costs, bit for bit, without building a StageCosts per stage
        pre = chain._prefix
        pf, pb = pre["f"], pre["b"]
        last_layer = len(chain) - 1
        self.F = [float(pf[b + 1] - pf[a]) for a, b in runs]
        self.B = [float(pb[b + 1] - pb[a]) for a, b in runs]
        terms = layer_terms(chain, platform)
        # per stage: resident bytes k A + static + (k - 1) stash (workbench.model.memory)
        self.A = [stage_activation(terms, a, b) for a, b in runs]
        self._per_k = [stage_memory(terms, a, b, 2) - stage_memory(terms, a, b, 1) for a, b in runs]
        self._static = [stage_memory(terms, a, b, 1) - x for (a, b), x in zip(runs, self._per_k)]
        # boundary cost after each stage; 0 after the last
        self.dev = dev = [assignment[a] for a, _ in runs]
        self.c = [platform.comm_time(chain.cut(b), dev[s], dev[s + 1]) if b < last_layer else 0.0
                  for s, (_, b) in enumerate(runs)]
        S = self.stage_count = len(self.runs)
        self.contiguous = len(set(self.dev)) == S
        load = [0.0] * P
        for s in range(S):
            load[self.dev[s]] += self.F[s] + self.B[s]
        links: dict[tuple[int, int], float] = {}
        for s in range(S - 1):
            p, q = self.dev[s], self.dev[s + 1]
            links[(p, q)] = links.get((p, q), 0.0) + self.c[s]
            links[(q, p)] = links.get((q, p), 0.0) + self.c[s]
        # offloaded activations (docs/model.md, rule 8): x_s each way on the device's host link; the
        # gap between the stage's forward end and backward start must hold both (a_s = 2 x_s modulo T)
        self.x = [stage_host_time(chain, platform, a, b) for a, b in runs]
        self.a = [2.0 * x for x in self.x]
        host = [0.0] * P
        for s in range(S):
            host[self.dev[s]] += self.a[s]
        self.host_load = host
        self._offload = any(x > 0 for x in self.x)
        self.device_load = load
        self.link_load = links
        self._max_load = max(load)
        self._max_link = max(links.values()) if links else 0.0
        t0 = max(self._max_load, self._max_link)
        if self._offload:
            t0 = max([t0] + host + [self.F[s] + self.B[s] + self.a[s] for s in range(S) if self.a[s] > 0])
        self._lower_bound: float | None = None
        #: the least period of any schedule: max(device load, link load)
        self.load_period = t0
        #: the longest window: one mini-batch from the first forward to the last backward
        self.max_window = sum(self.F) + sum(self.B) + 2 * sum(self.c) + sum(self.a)
        per_device: list[list[tuple[int, int]]] = [[] for _ in range(P)]
        for s in range(S):
            per_device[self.dev[s]].append(runs[s])
        #: per device, what does not depend on the in-flight counts: largest excess + runtime constant
        self._extra = [device_extra(terms, st) for st in per_device]
        base = list(self._extra)
        for s in range(S):
            base[self.dev[s]] += self._static[s] + self._per_k[s]
        #: memory per device with one mini-batch in flight on every stage (the least possible)
        self.one_in_flight_memory = base
        self.limits = [platform.memory_of(p) for p in range(P)]

    # ----- feasibility of the period ---------------------------------------
    def _check_period(self, T: float) -> None:
        if not (T > 0 and math.isfinite(T)):
            raise NoSchedule(f"the period must be positive and finite, got {T!r}")
        tol = REL_TOL * T
        if self._max_load <= T + tol and self._max_link <= T + tol and not self._offload:
            return
        for p, load in enumerate(self.device_load):
            if load > T + tol:
                raise NoSchedule(f"device {p} load {format_seconds(load)} exceeds the period {format_seconds(T)}")
        for (p, q), load in self.link_load.items():
            if load > T + tol:
                raise NoSchedule(f"link {p}->{q} load {format_seconds(load)} exceeds the period {format_seconds(T)}")
        for s in range(self.stage_count):
            need = self.F[s] + self.B[s] + self.a[s]
            if self.a[s] > 0 and need > T + tol:
                raise NoSchedule(f"stage {s}: forward, backward and the host round trip of its offloaded activations "
                                 f"take {format_seconds(need)}, more than the period {format_seconds(T)}")
        for p, load in enumerate(self.host_load):
            if load > T + tol:
                raise NoSchedule(f"device {p}'s host link load {format_seconds(load)} exceeds the period "
                                 f"{format_seconds(T)}")

    # ----- the builders ---------------------------------------------------
    def _contiguous(self, T: float) -> tuple[list[float], list[float]]:
        F, B, c = self.F, self.B, self.c
        S = self.stage_count
        f = [0.0] * S
        for s in range(1, S):
            f[s] = f[s - 1] + F[s - 1] + c[s - 1]
        a = self.a
        b = [0.0] * S
        b[S - 1] = f[S - 1] + F[S - 1] + a[S - 1]
        for s in range(S - 2, -1, -1):
            bs = b[s + 1] + B[s + 1] + c[s]
            k = _ceil((bs + B[s] - f[s]) / T)
            # the gap forward-end -> backward-start must be >= (k-1)T (+ the host round trip, rule 8)
            least = f[s] + F[s] + (k - 1) * T + a[s]
            b[s] = bs if bs >= least else least
        return f, b

    def _general(self, T: float, mode: str) -> tuple[list[float], list[float]]:
        F, B, c, dev = self.F, self.B, self.c, self.dev
        S = self.stage_count
        f = [0.0] * S
        b = [0.0] * S
        if self._offload:
            if mode == "asap":
                return general_offload(F, B, c, dev, self.x, T)
            raise NoSchedule("the packed builder does not place host-link transfers (offloaded activations)")
        if mode == "asap":
            arcs: dict[int, list[tuple[float, float]]] = {}

            def place(p: int, r: float, d: float, what: str) -> float:
                lst = arcs.setdefault(p, [])
                t = earliest(lst, r, d, T)
                if t is None:
                    raise NoSchedule(f"no free slot of {format_seconds(d)} on device {p} for the {what} "
                                     f"(its free time in the period {format_seconds(T)} is fragmented)")
                if d > 0:
                    lst.append((t % T, d))
                return t
        elif mode == "packed":
            block: dict[int, tuple[float, float]] = {}  # device -> (arc start mod T, arc length)

            def place(p: int, r: float, d: float, what: str) -> float:
                if d <= 0:
                    return r
                if p not in block:
                    block[p] = (r % T, d)
                    return r
                s0, ln = block[p]
                after = (s0 + ln) % T
                before = (s0 - d) % T
                t_after = r + (after - r % T) % T
                t_before = r + (before - r % T) % T
                if t_after <= t_before:
                    block[p] = (s0, ln + d)
                    return t_after
                block[p] = (before, ln + d)
                return t_before
        else:
            raise ValueError(f"mode must be 'auto', 'asap' or 'packed', got {mode!r}")
        r = 0.0
        for s in range(S):
            f[s] = place(dev[s], r, F[s], f"forward of stage {s}")
            r = f[s] + F[s] + c[s]
        r = f[S - 1] + F[S - 1]
        for s in range(S - 1, -1, -1):
            b[s] = place(dev[s], r, B[s], f"backward of stage {s}")
            if s > 0:
                r = b[s] + B[s] + c[s - 1]
        return f, b

    def times(self, period: float, mode: Mode = "auto") -> tuple[list[float], list[float]]:
        """Forward and backward start times of mini-batch 0, per stage; :class:`NoSchedule` if none."""
        if self.contiguous and mode in ("auto", "asap"):
            self._check_period(period)
            return self._contiguous(period)
        return self._times(period, mode)[:2]

    def _times(self, T: float, mode: Mode) -> tuple[list[float], list[float], list[int], list[float], str]:
        self._check_period(T)
        if self.contiguous and mode in ("auto", "asap"):
            f, b = self._contiguous(T)
            k, mem = self._memory(T, f, b)
            return f, b, k, mem, "asap"
        modes = ["asap", "packed"] if mode == "auto" else [mode]
        best = None
        err: NoSchedule | None = None
        for m in modes:
            try:
                f, b = self._general(T, m)
            except NoSchedule as e:
                err = e
                continue
            k, mem = self._memory(T, f, b)
            over = max(x - M for x, M in zip(mem, self.limits))
            key = (over > 0, over if over > 0 else sum(mem))
            if best is None or key < best[0]:
                best = (key, (f, b, k, mem, m))
        if best is None:
            assert err is not None
            raise err
        return best[1]

    def _memory(self, T: float, f: list[float], b: list[float], *,
                record: bool = False) -> tuple[list[int], list[float]]:
        """In-flight counts and rule 7 memory. ``record``: with the checker's tolerant count (for plans)."""
        mem = list(self._extra)
        ks = []
        B, dev, static, per_k = self.B, self.dev, self._static, self._per_k
        for s in range(self.stage_count):
            if record:
                k = in_flight(f[s], b[s] + B[s], T)
            else:
                k = _ceil((b[s] + B[s] - f[s]) / T)
                if k < 1:
                    k = 1
            ks.append(k)
            mem[dev[s]] += static[s] + k * per_k[s]
        return ks, mem

    def _fits(self, mem: list[float]) -> bool:
        return all(x <= M * (1 + REL_TOL) for x, M in zip(mem, self.limits))

    def memory(self, period: float, mode: Mode = "auto") -> list[float]:
        """Rule 7 memory per device of the schedule built for ``period``."""
        return self._times(period, mode)[3]

    def fits(self, period: float, mode: Mode = "auto") -> bool:
        """Whether a schedule exists for ``period`` and fits the memory limit."""
        try:
            return self._fits(self._times(period, mode)[3])
        except NoSchedule:
            return False

    def plan(self, period: float, *, mode: Mode = "auto", method: str = "", allocation: str | None = None,
             **kw) -> Plan:
        """The plan for ``period`` (:class:`NoSchedule` when none is found)."""
        T = float(period)
        if self.contiguous and mode in ("auto", "asap"):
            self._check_period(T)
            f, b = self._contiguous(T)
            used = "asap"
        else:
            f, b, _, _, used = self._times(T, mode)
        k, mem = self._memory(T, f, b, record=True)
        stages = tuple(Stage(a, z, self.dev[s], f[s], b[s], k[s]) for s, (a, z) in enumerate(self.runs))
        if allocation is None:
            allocation = "contiguous" if self.contiguous else "general"
        extra = dict(kw.pop("extra", {}) or {})
        extra.setdefault("builder", used)
        if self._lower_bound is None:
            self._lower_bound = lower_bound(self.chain, self.platform)
        return Plan(period=T, assignment=self.assignment, stages=stages, devices=self.platform.devices,
                    memory=tuple(mem), memory_limit=self.platform.memory_limit, lower_bound=self._lower_bound,
                    method=method, allocation=allocation, extra=extra,
                    **with_memory_setup(self.chain, self.platform, kw))

    # ----- the smallest period that fits ----------------------------------
    def _polish(self, T: float) -> float:
        """Contiguous: the least period keeping the in-flight counts and delays found at ``T``.

        Every window is affine in the period, w_s = a_s + n_s T; keeping
        k_s = ceil(w_raw_s / T) needs T >= a_s / (k_s - n_s).
        """
        F, B, c = self.F, self.B, self.c
        S = self.stage_count
        f, b = self._contiguous(T)
        x2 = self.a
        a, n = F[S - 1] + B[S - 1] + x2[S - 1], 0
        low = self.load_period
        for s in range(S - 2, -1, -1):
            ra, rn = F[s] + 2 * c[s] + B[s] + a, n
            k = max(1, _ceil((b[s] + B[s] - f[s]) / T))
            if k > rn and ra > 0:
                low = max(low, ra / (k - rn))
            bs = b[s + 1] + B[s + 1] + c[s]
            if b[s] > bs:  # delayed: w = F + B + host round trip + (k-1) T
                a, n = F[s] + B[s] + x2[s], k - 1
            else:
                a, n = ra, rn
        return low

    def best(self, *, method: str = "", tol: float = PERIOD_SEARCH, allocation: str | None = None,
             mode: Mode = "auto") -> Plan:
        """The smallest period whose schedule fits the memory limit, or an infeasible plan saying why.

        Exact for contiguous allocations (bisection on a monotone predicate,
        then the breakpoint); for general ones a heuristic (the builder is).
        ``tol`` is the relative precision of the bisection. (Not
        :func:`workbench.bisection.least_feasible`: each step here first jumps to the breakpoint of the
        structure at the upper end, :meth:`_polish`, which needs no probe of its own.)
        """
        t_start = time.perf_counter()
        alloc = allocation or ("contiguous" if self.contiguous else "general")
        P = self.platform.devices
        for p in range(P):
            if self.one_in_flight_memory[p] > self.limits[p] * (1 + REL_TOL):
                nst = sum(1 for d in self.dev if d == p)
                return infeasible_plan(
                    self.chain, self.platform, method,
                    f"device {p} needs at least {format_bytes(self.one_in_flight_memory[p])} ({nst} stage(s) with one "
                    f"mini-batch in flight each), more than its limit {format_bytes(self.limits[p])}",
                    allocation=alloc, solve_seconds=time.perf_counter() - t_start)
        lo = self.load_period if self.load_period > 0 else START_PERIOD
        if self.fits(lo, mode):
            hi = lo
        else:
            hi = max(self.max_window, lo) * (1 + CEIL_SLACK)   # every k is 1
            if not self.fits(hi, mode):  # cannot happen: every k is 1 at this period
                return infeasible_plan(self.chain, self.platform, method,
                                       "no schedule found that fits the memory limit", allocation=alloc,
                                       solve_seconds=time.perf_counter() - t_start)
            exact = self.contiguous and mode in ("auto", "asap")
            while hi - lo > tol * hi:
                if exact:
                    # jump to the breakpoint of the structure found at hi; stop when just below it fails
                    tp = self._polish(hi)
                    if lo < tp < hi and self.fits(tp, mode):
                        hi = tp
                    below = hi * (1 - tol)
                    if below <= lo or not self.fits(below, mode):
                        break
                    hi = below
                mid = 0.5 * (lo + hi)
                if self.fits(mid, mode):
                    hi = mid
                else:
                    lo = mid
        return self.plan(hi, mode=mode, method=method, allocation=alloc,
                         solve_seconds=time.perf_counter() - t_start)


def build_schedule(chain: Chain, platform: Target, assignment: Sequence[int], period: float, *,
                   method: str = "", allocation: str | None = None, mode: Mode = "auto") -> Plan:
    """A valid periodic plan for ``assignment`` at ``period``, operations as early as the rules allow.

    Raises :class:`NoSchedule` (a ``ValueError``) with the reason when there is
    none (a device or a link loaded beyond the period, or, for a general
    allocation, no free slot). The plan may exceed the memory limit: see
    ``plan.fits``. For contiguous allocations the windows, in-flight counts
    and memory are the least possible at this period.
    """
    return Scheduler(chain, platform, assignment).plan(period, mode=mode, method=method, allocation=allocation)


def best_schedule(chain: Chain, platform: Target, assignment: Sequence[int], *, method: str = "",
                  tol: float = PERIOD_SEARCH, allocation: str | None = None, mode: Mode = "auto") -> Plan:
    """The smallest period for ``assignment`` whose schedule fits ``platform.memory_of(p)`` on every device.

    Starts from max(device load, link load); exact up to ``tol`` (relative)
    for contiguous allocations. Returns :func:`~workbench.model.plan.infeasible_plan`
    with the reason (the least memory a device needs) when nothing fits.
    """
    return Scheduler(chain, platform, assignment).best(method=method, tol=tol, allocation=allocation, mode=mode)


def load_period(chain: Chain, platform: Target, assignment: Sequence[int]) -> float:
    """max(device load, link load on an ordered pair): the least period any schedule of ``assignment`` has."""
    return Scheduler(chain, platform, assignment).load_period


def one_in_flight_memory(chain: Chain, platform: Target, assignment: Sequence[int]) -> list[float]:
    """Memory per device with one mini-batch in flight on every stage: no period needs less."""
    return list(Scheduler(chain, platform, assignment).one_in_flight_memory)
