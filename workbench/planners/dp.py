"""``dp``: exact contiguous partitioning, with and without a memory limit.

Two dynamic programmes over a chain of L layers and P devices, one stage per
device, stage s on device s:

* **No memory limit** (chains-on-chains with link costs). A stage
  ``i..j`` costs ``max(F+B, c_j)``: its device must run one forward and one
  backward per period, and the link after it carries ``c_j`` forward one
  way and ``c_j`` backward the other way, each on its own ordered pair of
  devices (rule 6). Any contiguous allocation reaches
  ``T = max over stages of that cost`` (DESIGN.md section 3), so the optimum
  is the bottleneck-minimising partition into at most P stages. The DP is
  ``g[q][j] = min_i max(g[q-1][i-1], cost[i, j])`` over prefixes, computed a
  whole ``(i, j)`` matrix at a time with numpy: O(L^2 P) work, O(P) numpy
  calls.

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
  by search: start at the unconstrained optimum, and bisect; every feasible
  probe's partition is re-timed exactly (:func:`min_period`, a 1-D search
  on a fixed partition) which pulls the upper end down to an achievable
  period, and the search stops when the bracket is within 1e-9 relative.

If no period works, the least memory any contiguous plan needs is reported:
with T large enough every k is 1, and the least peak of a stage's memory at
k = 1 over partitions is another bottleneck DP.

>>> from workbench.chain import Chain, Layer, Platform
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 0, 0) for i in range(4)))
>>> p = plan_dp(chain, Platform(2, memory_model="paper"))
>>> round(p.period, 6), p.assignment
(0.006, (0, 0, 1, 1))
"""

from __future__ import annotations

import math
import time
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np

from ..chain import Chain, Platform
from ..memory import band_terms, layer_terms, square_terms, suffix_terms
from ..plan import Plan, infeasible_plan
from ..schedule import Scheduler
from ..units import format_bytes

__all__ = [
    "plan_dp", "bottleneck_partition", "memory_dp", "min_period",
    "least_memory", "unconstrained_period", "schedule_partition", "bounds_to_assignment", "least_feasible_period",
    "suffix_bounds",
]

_EPS = 1e-12      # relative slack on ceil and comparisons inside the DP
_MEM_EPS = 1e-9   # relative slack on the memory limit


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
def _comm(chain: Chain, platform: Platform) -> np.ndarray:
    """c_j: boundary cost after layer j (0 after the last layer)."""
    L = len(chain)
    c = np.array([platform.comm_time(chain.cut(j)) for j in range(L)], dtype=float)
    c[L - 1] = 0.0
    return c


def _ceil(x: np.ndarray | float) -> np.ndarray:
    """ceil with a tiny relative slack (so x = 2.0000000000001 counts as 2), at least 1."""
    return np.maximum(1.0, np.ceil(np.asarray(x) * (1.0 - _EPS)))


def bounds_to_assignment(bounds: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Stage s of ``bounds`` goes on device s.

    >>> bounds_to_assignment([(0, 1), (2, 2)])
    (0, 0, 1)
    """
    out: list[int] = []
    for s, (a, b) in enumerate(bounds):
        out.extend([s] * (b - a + 1))
    return tuple(out)


class _Tables:
    """(i, j) matrices of stage sums for stage ``i..j`` (upper triangle)."""

    def __init__(self, chain: Chain, platform: Platform) -> None:
        L = len(chain)
        p = chain._prefix
        lo = np.arange(L)[:, None]
        hi = np.arange(L)[None, :]
        self.L = L
        self.upper = hi >= lo
        span = lambda a: a[1:][None, :] - a[:-1][:, None]  # noqa: E731  a[j+1] - a[i]
        self.F = span(p["f"])
        self.B = span(p["b"])
        self.A = span(p["a"])          # the profile's saved bytes and weights (PipeDream's own charge)
        self.W = span(p["w"])
        self.FB = self.F + self.B
        self.pfb = p["f"] + p["b"]
        self.c = _comm(chain, platform)
        # rule 8: a stage's host round trip, 2 x its offloaded bytes over the host bandwidth
        self.x = np.array([platform.host_time(l.offload_bytes) for l in chain.layers])
        self.px = np.concatenate([[0.0], np.cumsum(2 * self.x)])
        self.terms = layer_terms(chain, platform)
        self.M = platform.memory

    @cached_property
    def least(self) -> np.ndarray:
        """(i, j): memory of stage i..j alone on a device with one mini-batch in flight."""
        sq = square_terms(self.terms)
        return sq.memory(np.ones_like(sq.A))


# ----------------------------------------------------------------------------
# bottleneck (chains-on-chains) DP
# ----------------------------------------------------------------------------
def suffix_bounds(args: Sequence[np.ndarray], q: int) -> list[tuple[int, int]]:
    """The stages of a suffix DP's answer: ``args[qq-1][i]`` is the last layer of the stage that starts a
    qq-stage suffix at layer i; walk from layer 0 with q stages.

    >>> suffix_bounds([np.array([2, 2, 2]), np.array([0, 1, 1])], 2)
    [(0, 0), (1, 2)]
    """
    bounds: list[tuple[int, int]] = []
    i = 0
    for qq in range(q, 0, -1):
        j = int(args[qq - 1][i])
        bounds.append((i, j))
        i = j + 1
    return bounds


def bottleneck_partition(cost: np.ndarray, P: int) -> tuple[float, list[tuple[int, int]]]:
    """Minimise the largest ``cost[i, j]`` over partitions into at most P runs.

    ``cost`` is an L x L matrix (only the upper triangle is read). Exact,
    O(L^2 P). Among optimal partitions, the one with fewest stages is kept.

    >>> c = np.array([[1, 3, 6], [0, 2, 5], [0, 0, 3]], dtype=float)
    >>> bottleneck_partition(c, 2)
    (3.0, [(0, 1), (2, 2)])
    """
    L = cost.shape[0]
    upper = np.arange(L)[None, :] >= np.arange(L)[:, None]
    cost = np.where(upper, cost, np.inf)
    g = [cost[0].copy()]                  # g[q-1][j]: best over prefixes 0..j with q runs
    args: list[np.ndarray] = [np.zeros(L, dtype=int)]
    for q in range(2, min(P, L) + 1):
        prev = np.concatenate([[np.inf], g[-1][:-1]])     # prev[i] = g[q-1][i-1]; i=0 impossible
        m = np.maximum(prev[:, None], cost)                # m[i, j]: last run i..j
        arg = np.argmin(m, axis=0)
        g.append(m[arg, np.arange(L)])
        args.append(arg)
    finals = [gq[L - 1] for gq in g]
    q = int(np.argmin(finals)) + 1                         # argmin: fewest runs among ties
    value = float(finals[q - 1])
    bounds: list[tuple[int, int]] = []
    j = L - 1
    for qq in range(q, 0, -1):
        i = int(args[qq - 1][j]) if qq > 1 else 0
        bounds.append((i, j))
        j = i - 1
    return value, bounds[::-1]


def unconstrained_period(chain: Chain, platform: Platform, tables: _Tables | None = None
                         ) -> tuple[float, list[tuple[int, int]]]:
    """The optimal contiguous period without memory limit, and a partition reaching it."""
    t = tables or _Tables(chain, platform)
    cost = np.maximum(t.FB, t.c[None, :])
    return bottleneck_partition(cost, platform.devices)


def least_memory(chain: Chain, platform: Platform, tables: _Tables | None = None
                 ) -> tuple[float, list[tuple[int, int]]]:
    """The least peak memory of any contiguous plan (every k = 1, i.e. a long period)."""
    t = tables or _Tables(chain, platform)
    return bottleneck_partition(t.least, platform.devices)


# ----------------------------------------------------------------------------
# one partition: the window recurrence lives in workbench.schedule.Scheduler
# ----------------------------------------------------------------------------
def min_period(chain: Chain, platform: Platform, bounds: Sequence[tuple[int, int]], *,
               ignore_memory: bool = False) -> float:
    """Least period at which the window schedule of ``bounds`` is valid (inf if none).

    The schedule is :class:`~workbench.schedule.Scheduler`'s contiguous
    builder (the recurrence above); its ``best`` search is exact up to 1e-9.

    >>> from workbench.chain import Chain, Layer, Platform
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(2)))
    >>> min_period(ch, Platform(2, memory_model="paper"), [(0, 0), (1, 1)])
    3.0
    """
    sched = Scheduler(chain, platform, bounds_to_assignment(bounds))
    if ignore_memory:
        return sched.min_period
    best = sched.best()
    return best.period if best.feasible else math.inf


# ----------------------------------------------------------------------------
# the memory-aware DP at a fixed period
# ----------------------------------------------------------------------------
def memory_dp(chain: Chain, platform: Platform, period: float, tables: _Tables | None = None
              ) -> tuple[float, list[tuple[int, int]]] | None:
    """For period T: the contiguous partition whose first-stage window is least, subject to
    F+B <= T, c <= T and rule-7 memory <= M on every stage; ``None`` if none exists.

    Returns ``(window of stage 0, bounds)``. Vectorised over a band: a stage
    starting at layer i can only end at j <= jmax(i), the last layer with
    F+B(i..j) <= T, so the (i, j) matrices are stored as (i, j - i) with
    width max(jmax(i) - i) + 1: one L x width numpy pass per stage count.
    """
    t = tables or _Tables(chain, platform)
    L, T = t.L, float(period)
    tolT = T * (1 + _EPS)
    M = t.M * (1 + _MEM_EPS)
    idx = np.arange(L)
    # jmax(i): prefix sums are non-decreasing, so a binary search per row
    jmax = np.searchsorted(t.pfb, t.pfb[:L] + tolT, side="right") - 2
    jmax = np.minimum(jmax, L - 1)
    if np.any(jmax < idx):                    # a single layer longer than T
        return None
    width = int(np.max(jmax - idx)) + 1
    J = idx[:, None] + np.arange(width)[None, :]
    inband = J <= jmax[:, None]
    Jc = np.minimum(J, L - 1)
    I = idx[:, None]
    FB = t.pfb[Jc + 1] - t.pfb[I]
    host = t.px[Jc + 1] - t.px[I]                      # rule 8: the stage's host round trip (0: no offload)
    inband = inband & (FB + host <= tolT)
    band = band_terms(t.terms, I, Jc)
    cj = t.c[Jc]
    base_inner = inband & (cj <= tolT) & (J < L - 1)   # a non-last stage cannot end at the last layer
    # q = 1: the last stage i..L-1, one mini-batch in flight
    fb_last = t.pfb[L] - t.pfb[:L] + (t.px[L] - t.px[:L])
    last = suffix_terms(t.terms)
    last_ok = (fb_last <= tolT) & (last.memory(np.ones(L)) <= M)
    D = [np.where(last_ok, fb_last, np.inf)]
    args: list[np.ndarray] = [np.full(L, L - 1)]
    for q in range(2, min(platform.devices, L) + 1):
        Dn = np.concatenate([D[-1], [np.inf]])
        down = Dn[np.minimum(J + 1, L)]                # down[i, d] = D[q-1][j+1]
        fin = np.isfinite(down)
        ok0 = base_inner & fin
        if not ok0.any():
            break
        raw = FB + 2 * cj + np.where(fin, down, 0.0)
        k = _ceil(raw / T)
        window = np.where(raw - (k - 1) * T < FB + host, (k - 1) * T + FB + host, raw)
        mem = band.memory(k)
        window = np.where(ok0 & (mem <= M), window, np.inf)
        arg = np.argmin(window, axis=1)
        D.append(window[idx, arg])
        args.append(arg + idx)
    finals = [Dq[0] for Dq in D]
    q = int(np.argmin(finals)) + 1
    if not math.isfinite(finals[q - 1]):
        return None
    return float(finals[q - 1]), suffix_bounds(args, q)


def _search_period(chain: Chain, platform: Platform, tables: _Tables, t0: float
                   ) -> tuple[float, list[tuple[int, int]]] | None:
    """Least T (>= t0) at which the memory DP finds a partition; with the partition."""
    hi = (t0 + float(np.sum(tables.FB[0, -1])) + 2 * float(tables.c.sum()) + 2 * float(tables.x.sum())) * 1.01

    def probe(T: float):
        res = memory_dp(chain, platform, T, tables)
        return None if res is None else res[1]

    return least_feasible_period(t0, hi, probe, lambda bounds: min_period(chain, platform, bounds))


def least_feasible_period(t0: float, hi: float, probe: Callable[[float], Any], exact: Callable[[Any], float]
                          ) -> tuple[float, Any] | None:
    """The least period at which ``probe`` finds a plan, searched from ``t0`` (a lower bound) with ``hi``
    (a period every feasible instance meets), and what the probe found there.

    ``probe(T)`` is a structure valid at T or None, monotone in T; ``exact(structure)`` is that
    structure's own least period (<= the probe's T). Steps alternate a probe just below the
    incumbent (infeasible there: it is optimal up to 1e-9; else a better structure) and bisection.

    >>> least_feasible_period(1.0, 100.0, lambda T: "x" if T >= 3.0 else None, lambda s: 3.0)
    (3.0, 'x')
    """
    first = probe(t0)
    if first is not None:
        return t0, first
    best = probe(hi)
    if best is None:
        return None
    hi = min(hi, exact(best))
    lo = t0
    # Invariant: infeasible at lo, feasible (exactly, via min_period) at hi. Steps alternate:
    # a *descent* probe just below hi (infeasible there: hi is the optimum up to 1e-9; else the
    # new partition's exact period lowers hi), and a bisection probe (keeps the count logarithmic).
    descent = True
    while hi - lo > 1e-9 * hi:
        if descent:
            mid = hi * (1 - 1e-9)
        else:
            mid = math.sqrt(lo * hi) if lo > 0 and hi / lo > 4 else 0.5 * (lo + hi)
        descent = not descent
        res = probe(mid)
        if res is None:
            lo = mid
        else:
            # the structure found at mid is valid at its own exact least period <= mid
            period = exact(res)
            if period >= hi:        # cannot happen beyond rounding; keep the search finite
                break
            hi, best = period, res
    return hi, best


# ----------------------------------------------------------------------------
# plans
# ----------------------------------------------------------------------------
def schedule_partition(chain: Chain, platform: Platform, bounds: Sequence[tuple[int, int]], *,
                       method: str, period: float | None = None, ignore_memory: bool = False,
                       status: str = "feasible", notes: Sequence[str] = (), **kw: Any) -> Plan:
    """A :class:`Plan` for a contiguous partition at its least feasible period (or ``period``)."""
    sched = Scheduler(chain, platform, bounds_to_assignment(bounds))
    T = period if period is not None else min_period(chain, platform, bounds, ignore_memory=ignore_memory)
    if not math.isfinite(T):
        raise ValueError("no period fits this partition")
    return sched.plan(T, method=method, allocation="contiguous", status=status, notes=tuple(notes), **kw)


def _dp_on_chain(chain: Chain, platform: Platform) -> tuple[float, list[tuple[int, int]] | None, str]:
    """(period, bounds, why-not) for one linear order."""
    tables = _Tables(chain, platform)
    t0, _ = unconstrained_period(chain, platform, tables)
    t0 = max(t0, 1e-300)
    found = _search_period(chain, platform, tables, t0)
    if found is None:
        need, _ = least_memory(chain, platform, tables)
        return math.inf, None, (
            f"no contiguous plan fits in {format_bytes(platform.memory)} per device: the least memory any "
            f"contiguous plan on {platform.devices} devices needs is {format_bytes(need)} "
            f"(one mini-batch in flight per stage)")
    return found[0], found[1], ""


def _on_chain(chain: Chain, platform: Platform, auto: bool
              ) -> tuple[float, list[tuple[int, int]] | None, tuple[str, ...] | None, str]:
    """(period, bounds, policies or None, why-not) for one linear order."""
    if auto:
        from .dp_auto import auto_on_chain

        return auto_on_chain(chain, platform)
    T, bounds, why = _dp_on_chain(chain, platform)
    return T, bounds, None, why


def plan_dp(chain: Chain, platform: Platform, *, allocation: str = "contiguous",
            time_limit: float | None = None, graph: bool = True, activations: str | None = None,
            **options: Any) -> Plan:
    """Exact contiguous plan: least period under the memory limit (see the module docstring).

    ``allocation="general"`` still returns the contiguous optimum (noted).
    On a chain linearised from a DAG (``chain.graph``), with ``graph=True``
    the DP also runs on the order from
    :func:`workbench.planners.graph_dp.best_order` and keeps the better,
    recording the order in ``plan.chain_order``. ``time_limit`` is ignored.
    ``activations="auto"`` also chooses every layer's activation policy, exactly
    (:mod:`workbench.planners.dp_auto`); other policies: :func:`workbench.planners.plan`.

    >>> from workbench.chain import Chain, Layer, Platform
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
    >>> plan_dp(ch, Platform(2, memory=10_000, memory_model="paper")).period
    6.0
    >>> plan_dp(ch, Platform(2, memory=150, memory_model="paper")).status
    'infeasible'
    """
    t_start = time.perf_counter()
    notes: list[str] = []
    if allocation == "general":
        notes.append("dp is contiguous: this is the best contiguous plan (general allocations: use ilp)")
    if activations not in (None, "keep", "auto"):
        from . import plan as run_planner

        return run_planner(chain, platform, "dp", allocation=allocation, graph=graph, activations=activations)
    auto = activations == "auto"
    candidates: list[tuple[float, Chain, list[tuple[int, int]] | None, tuple[str, ...] | None, str,
                           tuple[str, ...] | None]] = []
    T, bounds, pol, why = _on_chain(chain, platform, auto)
    candidates.append((T, chain, bounds, pol, why, None))
    if graph and getattr(chain, "graph", None) is not None:
        try:
            from .graph_dp import best_order

            res = best_order(chain.graph, platform.devices, platform=platform)
            order = [str(n) for n in res.order]
            if order != [l.name for l in chain.layers]:
                other = chain.graph.linearise(order)
                T2, b2, pol2, why2 = _on_chain(other, platform, auto)
                candidates.append((T2, other, b2, pol2, why2, tuple(order)))
        except ImportError:
            notes.append("graph mode unavailable (workbench.planners.graph_dp missing): default order used")
    T, used, bounds, pol, why, order = min(candidates, key=lambda c: c[0])
    if order is not None:
        notes.append(f"graph order from best_order: {T:.6g} s against {candidates[0][0]:.6g} s in the default order")
    if bounds is None:
        return infeasible_plan(chain, platform, "dp", why, allocation=allocation,
                               solve_seconds=time.perf_counter() - t_start)
    if pol is None or all(p == "keep" for p in pol):
        if why:
            notes.append(why)
        plan = schedule_partition(used, platform, bounds, method="dp", period=T,
                                  status="feasible" if why else "optimal", notes=notes, chain_order=order)
    else:
        from ..activations import apply_policies, describe
        from ..plan import lower_bound

        notes.append(f"activations chosen per layer: {describe(pol)}")
        if why:     # versions were thinned: a plan, not a proven optimum
            notes.append(why)
        plan = schedule_partition(apply_policies(used, pol), platform, bounds, method="dp", period=T,
                                  status="feasible" if why else "optimal", notes=notes, chain_order=order)
        plan = plan.with_(activations=pol, lower_bound=lower_bound(used, platform))
    return plan.with_(solve_seconds=time.perf_counter() - t_start)
