"""Brute force: the exact optimal periodic plan of a tiny instance (method ``brute``).

The ground truth the other planners (the DP, the ILP) are tested against. It
enumerates *every* allocation and, for each, finds the exact smallest period
of a valid periodic schedule (docs/model.md, "Plan", rules 1-7) by a method
that shares nothing with the ILP. Nothing here is a heuristic; every pruning
step below is a proven bound.

Allocations
    contiguous: one interval of layers per device; identical devices make the
    labels irrelevant, so these are the compositions of the chain into at most
    P parts (labelled 0, 1, ... in chain order).
    general: every map layer -> device up to relabelling of the devices, i.e.
    the set partitions of the layers into at most P blocks (restricted growth
    strings). Stages are the maximal runs (:func:`workbench.plan.stages_of`).

One allocation, written with absolute start times x of mini-batch 0 (f_s, b_s)
    Rules 2-4 are difference constraints. Rule 6 (links) and the device loads
    are lower bounds on T. Rule 5 for two operations o, o' of one device
    (lengths d, d' > 0) says exactly: for the integer q = floor((x_o' - x_o)/T),
    ``q*T + d <= x_o' - x_o <= (q+1)*T - d'``; for a fixed q these are two
    difference constraints whose constants are linear in T. Rule 7: with an
    integer k_s per stage and ``b_s + B_s - f_s <= k_s*T`` (a difference
    constraint again) the plan's in-flight count ceil(window/T) is <= k_s, so
    the memory of the k vector bounds the plan's memory; conversely a valid
    plan satisfies these constraints with k_s = its own in-flight count. So
    a plan is valid iff some integer choice (k, q) makes a system of
    difference constraints ``x_j - x_i >= a + beta*T`` feasible.

Why the search is finite (lemma, used for bounds)
    Larger k only loosens (window <= k*T) and costs memory, so at a fixed T
    only the *maximal* k vectors that fit in memory need trying. k is capped
    by ``K_cap = ceil(path / T) + 2S`` (path = sum of F+B+2c along the chain):
    in a valid plan, if an operation of the chain f_1..f_S, b_S..b_1 waits T
    or more after its predecessor, shift it and everything after it on the
    backward side one period earlier (a backward wait) or everything before
    it one period later (a forward wait): residues mod T, precedences and
    links stay valid and no window grows, the outer window shrinks by T. At
    the end every wait is < T, so window_1 < path + 2S*T and every window,
    nested in window_1, is below K_cap*T. All operations of a device then lie
    within window_1, which bounds q.

Feasibility is monotone in T
    Scaling every start time by alpha >= 1 keeps rules 2-6 and every k
    (the constants d and the chain costs are non-negative), so the feasible
    periods of an allocation are [T*, inf).

Contiguous allocations: a closed form
    Each device holds one stage, so the only pair is (f_s, b_s), and with
    q = k_s - 1 the smallest window given T satisfies
    ``w_s = max(F_s + 2c_s + B_s + w_{s+1}, (k_s-1)T + F_s + B_s) <= k_s T``.
    Unrolled, this is ``T >= P_{s,j} / (k_s - k_j + 1)`` for all s <= j, with
    ``P_{s,j} = sum_{i=s}^{j-1}(F_i + 2c_i + B_i) + F_j + B_j`` and k
    non-increasing along the chain; plus the link costs. So T*(allocation) is
    the minimum, over the non-increasing k vectors that fit in memory, of a
    maximum of ratios: exact, and fast.

General allocations: certified search on T
    For a fixed T, :func:`_feasible_at` decides feasibility exactly: it tries
    every maximal k vector, then a depth-first search over the q of each pair
    of operations sharing a device, keeping the all-pairs bounds of the
    difference system closed (Floyd-Warshall) and backtracking on a negative
    cycle. A feasible leaf fixes (k, q); :func:`_min_period` then returns the
    exact least T of that fixed system (parametric longest paths: raise T to
    the ratio of each positive cycle until none is left). The period search
    alternates probes just below the incumbent and bisection, so the returned
    period T satisfies T* <= T <= T* (1 + 1e-9), T* the true optimum
    (certified: a probe at T / (1 + 1e-9) was proven infeasible, or T equals
    a lower bound). The contiguous optimum is the first incumbent; general
    allocations are visited in order of a lower bound (loads, links, memory)
    and skipped when the bound reaches the incumbent.

Sizes: contiguous up to ~10 layers x 4 devices in well under a second;
general up to 8 layers x 3 devices in about a second or less on average.

>>> from workbench.chain import Chain, Layer, Platform
>>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
>>> plan_brute(chain, Platform(3, memory_model="paper")).period
3.0
>>> plan_brute(chain, Platform(2, memory_model="paper"), allocation="general").period
6.0
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..activations import POLICIES, apply_policies, is_keep, stage_host_time
from ..chain import Chain, Platform
from ..memory import device_extra, layer_terms, stage_memory
from ..plan import Plan, infeasible_plan, lower_bound, make_plan, stages_of
from .fixed_policies import plan_with_policies

__all__ = [
    "plan_brute", "contiguous_allocations", "general_allocations", "allocation_period",
    "EPS", "clear_cache",
]

EPS = 1e-9          # relative precision of the certified period search (general allocations)
_TOL = 1e-10        # relative slack in floating comparisons (scaled by T)
_MEM_TOL = 1e-9     # relative slack on the memory limit (float sums)


# ----------------------------------------------------------------------------
# allocations
# ----------------------------------------------------------------------------
def contiguous_allocations(n_layers: int, devices: int) -> Iterator[tuple[int, ...]]:
    """Every composition of the chain into at most ``devices`` parts, devices 0, 1, ... in chain order.

    >>> list(contiguous_allocations(3, 2))
    [(0, 0, 0), (0, 1, 1), (0, 0, 1)]
    """
    for parts in range(1, min(devices, n_layers) + 1):
        for cuts in itertools.combinations(range(1, n_layers), parts - 1):
            bounds = (0,) + cuts + (n_layers,)
            yield tuple(p for p in range(parts) for _ in range(bounds[p + 1] - bounds[p]))


def general_allocations(n_layers: int, devices: int) -> Iterator[tuple[int, ...]]:
    """Every layer -> device map up to relabelling: restricted growth strings with labels < ``devices``.

    >>> list(general_allocations(3, 2))
    [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    """
    def rec(prefix: list[int], used: int) -> Iterator[tuple[int, ...]]:
        if len(prefix) == n_layers:
            yield tuple(prefix)
            return
        for d in range(min(used + 1, devices)):
            prefix.append(d)
            yield from rec(prefix, max(used, d + 1))
            prefix.pop()

    yield from rec([], 0)


# ----------------------------------------------------------------------------
# one allocation
# ----------------------------------------------------------------------------
@dataclass
class _Alloc:
    """Stage data of one allocation (stages in chain order)."""

    assignment: tuple[int, ...]
    runs: list[tuple[int, int]]
    dev: list[int]
    F: list[float]
    B: list[float]
    ka: list[float]         # memory per in-flight mini-batch of stage s (workbench.memory: A + stash)
    kc: list[float]         # memory of stage s that does not grow with k (static - stash)
    c: list[float]          # boundary cost after stage s (0 after the last)
    path: list[float]       # P_s: least window of stage s = sum_{i>=s}(F_i+B_i) + 2 sum_{s<=i<S-1} c_i
    static_lb: float        # device loads, link loads, single operations
    total_path: float       # path[0]
    devices: list[list[int]]  # stages of each used device
    extra: list[float]        # per used device: largest excess + runtime constant (no k in it)
    x: list[float]            # rule 8: seconds each way on the host link (offloaded activations)

    @property
    def S(self) -> int:
        return len(self.runs)

    @property
    def contiguous(self) -> bool:
        return all(len(d) == 1 for d in self.devices)


def _alloc(chain: Chain, platform: Platform, assignment: Sequence[int]) -> _Alloc:
    assignment = tuple(int(a) for a in assignment)
    runs = stages_of(assignment)
    S = len(runs)
    # the sums of Chain.stage_costs, from its prefix sums as Python floats (same values, faster)
    pf, pb, _, _, cut = chain._prefix_lists
    F = [pf[b + 1] - pf[a] for a, b in runs]
    B = [pb[b + 1] - pb[a] for a, b in runs]
    terms = layer_terms(chain, platform)
    one = [stage_memory(terms, a, b, 1) for a, b in runs]
    ka = [stage_memory(terms, a, b, 2) - m for (a, b), m in zip(runs, one)]
    kc = [m - x for m, x in zip(one, ka)]
    c = [platform.comm_time(cut[b]) if s < S - 1 else 0.0 for s, (_, b) in enumerate(runs)]
    dev = [assignment[a] for a, _ in runs]
    x = [stage_host_time(chain, platform, a, b) for a, b in runs]
    path = [0.0] * S
    acc = 0.0
    for s in range(S - 1, -1, -1):
        if x[s] > 0:   # the least window also holds the stage's own host round trip (rule 8)
            acc = F[s] + B[s] + max(2 * x[s], 2 * c[s] + acc if s < S - 1 else 0.0)
        else:
            acc += F[s] + B[s] + (2 * c[s] if s < S - 1 else 0.0)
        path[s] = acc
    n_dev = max(dev) + 1
    load = [0.0] * n_dev
    host = [0.0] * n_dev
    for s in range(S):
        load[dev[s]] += F[s] + B[s]
        host[dev[s]] += 2 * x[s]
    link: dict[tuple[int, int], float] = {}
    for s in range(S - 1):
        key = (min(dev[s], dev[s + 1]), max(dev[s], dev[s + 1]))
        link[key] = link.get(key, 0.0) + c[s]   # p->q and q->p carry the same total
    static = max(load + list(link.values()) + F + B + host + [F[s] + B[s] + 2 * x[s] for s in range(S)] + [0.0])
    devices = [[s for s in range(S) if dev[s] == p] for p in range(n_dev)]
    extra = [device_extra(terms, [runs[s] for s in st]) for st in devices]
    return _Alloc(assignment, runs, dev, F, B, ka, kc, c, path, static, path[0], devices, extra, x)


def _k_cap(al: _Alloc, T: float) -> int:
    """No valid plan needs an in-flight count above this (lemma in the module docstring)."""
    return int(math.ceil(al.total_path / T)) + 2 * al.S if T > 0 else 1


def _kmax_memory(al: _Alloc, s: int, budget: float, cap: int) -> int:
    """Largest k <= cap with stage s's memory ``k ka + kc`` <= budget (0 if even k = 1 does not fit)."""
    lim = budget * (1 + _MEM_TOL) if math.isfinite(budget) else math.inf
    ka, kc = al.ka[s], al.kc[s]
    if ka + kc > lim:
        return 0
    if ka <= 0 or not math.isfinite(lim):
        return cap
    k = int((lim - kc) // ka)
    while k > 1 and k * ka + kc > lim:
        k -= 1
    while k < cap and (k + 1) * ka + kc <= lim:
        k += 1
    return max(1, min(k, cap))


def _budget(al: _Alloc, platform: Platform, device: int) -> float:
    """What device ``device``'s stages may hold in resident bytes (its limit less its extra)."""
    return platform.memory_of(device) - al.extra[device]


def _memory_ok(al: _Alloc, platform: Platform, ks: Sequence[int], stages: Sequence[int]) -> bool:
    M = platform.memory
    if not math.isfinite(M) or not stages:
        return True
    mem = sum(k * al.ka[s] + al.kc[s] for s, k in zip(stages, ks)) + al.extra[al.dev[stages[0]]]
    return mem <= M * (1 + _MEM_TOL)


def _least_ks(al: _Alloc, T: float) -> list[int]:
    """Per stage, the least in-flight count at period T: ceil(path_s / T) (no window is shorter than
    its path)."""
    return [max(1, int(math.ceil(al.path[s] / T - 1e-9))) for s in range(al.S)]


def _paths_fit(al: _Alloc, platform: Platform, T: float) -> bool:
    """Necessary for a period <= T: every device fits its stages at :func:`_least_ks` (memory only
    grows as T falls). The first test of :func:`_feasible_at`, cheap enough to run on its own."""
    if not math.isfinite(platform.memory):
        return T > 0
    if T <= 0:
        return False
    kmin = _least_ks(al, T)
    return all(_memory_ok(al, platform, [kmin[s] for s in stages], stages) for stages in al.devices if stages)


def _memory_lb(al: _Alloc, platform: Platform) -> float:
    """T >= path_s / k_s for the largest k_s memory allows (each stage alone on its device)."""
    lb = 0.0
    for s in range(al.S):
        k = _kmax_memory(al, s, _budget(al, platform, al.dev[s]), 10**9)
        if k == 0:
            return math.inf
        lb = max(lb, al.path[s] / k)
    return lb


# ----------------------------------------------------------------------------
# contiguous: closed form
# ----------------------------------------------------------------------------
def _contiguous_period(al: _Alloc, platform: Platform) -> tuple[float, tuple[int, ...]] | None:
    """Exact least period of a contiguous allocation and the in-flight vector reaching it."""
    S = al.S
    lb = al.static_lb
    cap = _k_cap(al, lb) if lb > 0 else 1
    kmax = [_kmax_memory(al, s, _budget(al, platform, al.dev[s]), cap) for s in range(S)]
    if min(kmax) < 1:
        return None
    # P[s, j] for s <= j
    P = np.zeros((S, S))
    for s in range(S):
        acc = 0.0
        for j in range(s, S):
            P[s, j] = acc + al.F[j] + al.B[j] + 2 * al.x[j]   # stage j's gap holds its host round trip
            acc += al.F[j] + al.B[j] + 2 * al.c[j]
    iu = [(s, j) for s in range(S) for j in range(s + 1, S)]
    vecs = np.array([v for v in itertools.combinations_with_replacement(range(max(kmax), 0, -1), S)
                     if all(v[s] <= kmax[s] for s in range(S))], dtype=float)
    if len(vecs) == 0:
        return None
    T = np.full(len(vecs), lb)
    for s, j in iu:
        T = np.maximum(T, P[s, j] / (vecs[:, s] - vecs[:, j] + 1))
    # least period; among ties the fewest mini-batches in flight (least memory)
    i = int(np.lexsort((vecs.sum(axis=1), T))[0])
    return float(T[i]), tuple(int(k) for k in vecs[i])


def _contiguous_schedule(al: _Alloc, T: float, ks: Sequence[int]) -> tuple[list[float], list[float]]:
    """Forwards back to back; each backward as early as its k allows (the recurrence of the closed form)."""
    S = al.S
    f = [0.0] * S
    for s in range(1, S):
        f[s] = f[s - 1] + al.F[s - 1] + al.c[s - 1]
    b = [0.0] * S
    for s in range(S - 1, -1, -1):
        ready = f[s] + al.F[s] if s == S - 1 else b[s + 1] + al.B[s + 1] + al.c[s]
        b[s] = max(ready, f[s] + al.F[s] + (ks[s] - 1) * T + 2 * al.x[s])
    return f, b


# ----------------------------------------------------------------------------
# general: difference systems
# ----------------------------------------------------------------------------
# operation index: forward of stage s = 2s, backward = 2s + 1
# a constraint (i, j, a, beta) means x_j - x_i >= a + beta * T


def _base_constraints(al: _Alloc, ks: Sequence[int]) -> list[tuple[int, int, float, int]]:
    S = al.S
    cons: list[tuple[int, int, float, int]] = []
    for s in range(S - 1):
        cons.append((2 * s, 2 * s + 2, al.F[s] + al.c[s], 0))                  # rule 2
        cons.append((2 * s + 3, 2 * s + 1, al.B[s + 1] + al.c[s], 0))          # rule 4
    cons.append((2 * S - 2, 2 * S - 1, al.F[S - 1], 0))                         # rule 3
    for s in range(S):
        cons.append((2 * s + 1, 2 * s, al.B[s], -int(ks[s])))                  # window <= k T
    return cons


def _device_pairs(al: _Alloc) -> list[tuple[int, int, float, float]]:
    """Every pair of intervals that must not overlap modulo T, as ``(o, p, d_o, d_p)``: for some integer
    q, ``x_p - x_o`` lies in ``[q T + d_o, (q+1) T - d_p]``. Rule 5: the operations of one device
    (op o's length d_o). Rule 8, with offloaded activations (x_s > 0 seconds each way): a stage's
    forward-backward pair needs the gap to hold the round trip (d_o = F_s + 2 x_s); the transfers
    out, ``[x_f + F_s, + x_s)``, and back, ``[x_b - x_s, + x_s)``, of different stages of one device
    must not overlap on its host link (offsets folded into d_o, d_p)."""
    S = al.S
    length = [0.0] * (2 * S)
    for s in range(S):
        length[2 * s], length[2 * s + 1] = al.F[s], al.B[s]
    pairs: list[tuple[int, int, float, float]] = []
    for stages in al.devices:
        ops = [o for s in stages for o in (2 * s, 2 * s + 1) if length[o] > 0 or al.x[o // 2] > 0]
        for o, p in itertools.combinations(ops, 2):
            own = p == o + 1 and o % 2 == 0
            pairs.append((o, p, length[o] + (2 * al.x[o // 2] if own else 0.0), length[p]))
    for stages in al.devices:
        blocks = [(2 * s, al.F[s], s) for s in stages if al.x[s] > 0]
        blocks += [(2 * s + 1, -al.x[s], s) for s in stages if al.x[s] > 0]
        for (o, off_o, s), (p, off_p, t) in itertools.combinations(sorted(blocks), 2):
            if s != t:   # (x_p + off_p) - (x_o + off_o) in [qT + x_s, (q+1)T - x_t]
                pairs.append((o, p, al.x[s] + off_o - off_p, al.x[t] - off_o + off_p))
    return pairs


def _pair_constraints(o: int, p: int, d_o: float, d_p: float, q: int) -> list[tuple[int, int, float, int]]:
    """Rule 5 for x_p - x_o in [q T + d_o, (q+1) T - d_p]."""
    return [(o, p, d_o, q), (p, o, d_p, -(q + 1))]


def _closure(n: int, cons, T: float) -> np.ndarray | None:
    """All-pairs upper bounds D[i, j] >= x_j - x_i; None when inconsistent."""
    D = np.full((n, n), np.inf)
    np.fill_diagonal(D, 0.0)
    for i, j, a, beta in cons:
        w = -(a + beta * T)            # x_i - x_j <= w
        if w < D[j, i]:
            D[j, i] = w
    for k in range(n):
        D = np.minimum(D, D[:, k:k + 1] + D[k:k + 1, :])
    if np.any(np.diag(D) < -_TOL * T * 10):
        return None
    return D


def _add(D: np.ndarray, i: int, j: int, w: float, tol: float) -> np.ndarray | None:
    """Add x_j - x_i <= w to a closed system; None when it closes a negative cycle."""
    if w + D[j, i] < -tol:
        return None
    if w >= D[i, j]:
        return D
    return np.minimum(D, D[:, i:i + 1] + w + D[j:j + 1, :])


def _maximal_vectors(al: _Alloc, platform: Platform, stages: list[int], kmin: list[int], kmax: list[int],
                     deadline: float | None = None) -> list[tuple[int, ...]]:
    """Maximal in-flight vectors of one device's stages that fit its memory (k >= kmin).

    A depth-first walk over the box ``kmin..kmax`` in lexicographic order
    (memory grows with every k, so a branch stops at the first k that cannot
    fit even with the least k downstream); each leaf is confirmed with
    :func:`_memory_ok` and kept when no single k can grow. Raises
    ``TimeoutError`` past ``deadline``.
    """
    lo = [kmin[s] for s in stages]
    hi = [kmax[s] for s in stages]
    if any(l > h for l, h in zip(lo, hi)):
        return []
    if not math.isfinite(platform.memory):
        return [tuple(hi)]                      # everything fits: only the top corner is maximal
    limit = (platform.memory * (1 + _MEM_TOL) * (1 + 1e-12)   # pruning only; leaves use _memory_ok
             - al.extra[al.dev[stages[0]]])

    def cost(i: int, k: int) -> float:
        return k * al.ka[stages[i]] + al.kc[stages[i]]

    n = len(stages)
    rest = [0.0] * (n + 1)                      # least memory of stages i.. (all at their kmin)
    for i in range(n - 1, -1, -1):
        rest[i] = rest[i + 1] + cost(i, lo[i])
    out: list[tuple[int, ...]] = []
    v = list(lo)

    def walk(i: int, used: float) -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError
        if i == n:
            t = tuple(v)
            if not _memory_ok(al, platform, t, stages):
                return
            for j in range(n):
                if t[j] < hi[j] and _memory_ok(al, platform, t[:j] + (t[j] + 1,) + t[j + 1:], stages):
                    return
            out.append(t)
            return
        for k in range(lo[i], hi[i] + 1):
            c = cost(i, k)
            if used + c + rest[i + 1] > limit:
                break
            v[i] = k
            walk(i + 1, used + c)
        v[i] = lo[i]

    walk(0, 0.0)
    return out


def _feasible_at(al: _Alloc, platform: Platform, T: float, deadline: float | None = None, loose: bool = True):
    """Exact feasibility of a period T for allocation ``al``: (ks, qs) of a valid plan, or None.

    The orders modulo T of the operations sharing a device are searched
    (:func:`_order_search`) once, with every stage at the largest k its device allows it
    (the others at their least): a smaller k only adds constraints, so every valid plan's
    orders are in that search. At each node the closed difference system gives every
    stage's least window, hence a least k, and each device's memory at those k's must fit;
    at a complete order, the combinations of maximal in-flight vectors (the k's memory
    allows) above them are tried by adding their window limits. ``loose=False`` instead
    runs one order search per combination of maximal vectors (slower; tests compare the
    two)."""
    if T < al.static_lb * (1 - _TOL):
        return None
    S = al.S
    cap = _k_cap(al, T)
    kmin = _least_ks(al, T)
    kmax = [cap] * S
    devs = []
    for p, stages in enumerate(al.devices):
        if not stages:
            continue
        base = sum(kmin[s] * al.ka[s] + al.kc[s] for s in stages)
        budget = _budget(al, platform, p)
        if base > budget + platform.memory_of(p) * _MEM_TOL:   # even the least k's do not fit
            return None
        for s in stages:
            rest = base - (kmin[s] * al.ka[s] + al.kc[s])
            kmax[s] = _kmax_memory(al, s, budget - rest, cap)
        devs.append(stages)
    if not loose or all(len(st) == 1 for st in devs):
        per_dev = [(st, _maximal_vectors(al, platform, st, kmin, kmax, deadline)) for st in devs]
        for combo in itertools.product(*[vs for _, vs in per_dev]):
            ks = [0] * S
            for (stages, _), v in zip(per_dev, combo):
                for s, k in zip(stages, v):
                    ks[s] = k
            hit = _order_search(al, ks, T, deadline)
            if hit is not None:
                return tuple(ks), hit[0]
        return None
    # one search over the orders with every stage at its largest k; each node's least windows
    # (from the closed system) give least k's that must fit in memory; at a leaf, the
    # combinations of maximal vectors above those k's are tried by adding their window limits
    tol = _TOL * max(T, 1e-300) * 10

    def least_k(D) -> list[int]:
        return [max(kmin[s], int(math.ceil((al.B[s] - D[2 * s + 1, 2 * s]) / T - 1e-9))) for s in range(S)]

    # rule 7 per stage: k * ka + kc bytes, per device its extra on top
    ka, kc = al.ka, al.kc
    lim = platform.memory * (1 + _MEM_TOL)
    per_dev: list = []

    def node_ok(D) -> bool:
        kl = least_k(D)
        return all(sum(kl[s] * ka[s] + kc[s] for s in st) + al.extra[al.dev[st[0]]] <= lim for st in devs)

    def leaf(D, chosen):
        if not per_dev:   # the maximal vectors, once a complete order is reached
            per_dev.extend((st, _maximal_vectors(al, platform, st, kmin, kmax, deadline)) for st in devs)
        kl = least_k(D)
        opts = [[v for v in vs if all(k >= kl[s] for s, k in zip(st, v))] for st, vs in per_dev]
        for combo in itertools.product(*opts):
            ks, D2 = list(kmax), D
            for (st, _), v in zip(per_dev, combo):
                for s, k in zip(st, v):
                    ks[s] = k
                    if D2 is not None and k < kmax[s]:
                        D2 = _add(D2, 2 * s, 2 * s + 1, k * T - al.B[s], tol)   # window <= k T
            if D2 is not None:
                return tuple(ks), dict(chosen)
        return None

    return _order_search(al, kmax, T, deadline, node_ok=node_ok, leaf=leaf)


def _order_search(al: _Alloc, ks: Sequence[int], T: float, deadline: float | None = None, *,
                  node_ok=None, leaf=None):
    """Orders modulo T of the operations sharing a device, for fixed in-flight counts ``ks``:
    ``(qs, D)`` (the chosen orders and the closed difference system), or None if none is valid.

    ``node_ok(D)``: a test every node of the search must pass; ``leaf(D, qs)``: what a complete
    order returns instead (None: go on searching)."""
    S = al.S
    n = 2 * S
    tol = _TOL * max(T, 1e-300) * 10
    pairs = _device_pairs(al)
    index = {pr: i for i, pr in enumerate(pairs)}

    def candidates(D, o, p, lo_c, hi_c):
        lo, hi = -D[p, o], D[o, p]
        qlo = int(math.floor((lo + hi_c - T) / T)) - 1
        qhi = int(math.floor((hi - lo_c) / T)) + 1
        out = []
        for q in range(qlo, qhi + 1):
            a, b = q * T + lo_c, (q + 1) * T - hi_c
            if a <= hi + tol and b >= lo - tol and a <= b + tol:
                out.append(q)
        return out

    def dfs(D, todo, chosen):
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError
        if node_ok is not None and not node_ok(D):
            return None
        if not todo:
            return (dict(chosen), D) if leaf is None else leaf(D, chosen)
        best = None
        for pr in todo:
            cand = candidates(D, *pr)
            if not cand:
                return None
            if best is None or len(cand) < len(best[1]):
                best = (pr, cand)
                if len(cand) == 1:
                    break
        pr, cand = best
        o, p, lo_c, hi_c = pr
        rest = [x for x in todo if x != pr]
        for q in cand:
            D2 = _add(D, p, o, -(q * T + lo_c), tol)        # x_o - x_p <= -(qT + d_o)
            if D2 is None:
                continue
            D2 = _add(D2, o, p, (q + 1) * T - hi_c, tol)    # x_p - x_o <= (q+1)T - d_p
            if D2 is None:
                continue
            chosen[index[pr]] = q
            res = dfs(D2, rest, chosen)
            if res is not None:
                return res
            del chosen[index[pr]]
        return None

    D = _closure(n, _base_constraints(al, ks), T)
    if D is None:
        return None
    return dfs(D, pairs, {})


def _min_period(al: _Alloc, ks: Sequence[int], qs: dict, T0: float):
    """Exact least T >= T0 of the difference system fixed by (ks, qs), with start times.

    Parametric longest paths: while the graph with weights a + beta*T has a
    positive cycle C (beta(C) < 0 when the system is feasible for larger T),
    raise T to a(C) / -beta(C). Returns (T, x) or None if no T works.
    """
    S = al.S
    n = 2 * S
    pairs = _device_pairs(al)
    cons = _base_constraints(al, ks)
    for i, q in qs.items():
        o, p, lo_c, hi_c = pairs[i]
        cons += _pair_constraints(o, p, lo_c, hi_c, q)
    T = T0
    for _ in range(10 * len(cons) + 100):
        tol = _TOL * max(T, 1e-300)
        x = [0.0] * n
        pred = [-1] * n
        last = -1
        for _it in range(n):
            last = -1
            for e, (i, j, a, beta) in enumerate(cons):
                v = x[i] + a + beta * T
                if v > x[j] + tol:
                    x[j] = v
                    pred[j] = e
                    last = j
            if last < 0:
                break
        if last < 0:
            return T, x
        # walk back n steps to land on the cycle, then collect it
        v = last
        for _ in range(n):
            v = cons[pred[v]][0]
        cyc, u = [], v
        while True:
            e = pred[u]
            cyc.append(e)
            u = cons[e][0]
            if u == v:
                break
        a_sum = sum(cons[e][2] for e in cyc)
        b_sum = sum(cons[e][3] for e in cyc)
        if b_sum >= 0:
            return None
        T = max(T * (1 + 1e-15), a_sum / -b_sum)
    raise RuntimeError("parametric longest path did not converge")


def _general_period(al: _Alloc, platform: Platform, upper: float, deadline: float | None = None,
                    loose: bool = True):
    """Best period of allocation ``al`` if below ``upper`` (certified to EPS): (T, f, b) or None."""
    if math.isfinite(upper) and not _paths_fit(al, platform, upper / (1 + EPS)):
        return None
    lb = max(al.static_lb, _memory_lb(al, platform))
    if not lb < upper / (1 + EPS) or not math.isfinite(lb):
        return None
    if not math.isfinite(upper):
        # k = 1 everywhere must fit, and then the sequential layout works at T = max(lb, path)
        probe = max(lb, al.total_path)
    else:
        probe = upper / (1 + EPS)
    hit = _feasible_at(al, platform, probe, deadline, loose)
    if hit is None:
        return None
    best = _min_period(al, *hit, lb)
    if best is None:  # pragma: no cover - a feasible leaf always has a period
        raise RuntimeError("feasible leaf without a period")
    T_hi, x = best
    T_lo = lb
    toward_top = True
    while T_hi > T_lo * (1 + EPS):
        probe = T_hi / (1 + EPS) if toward_top else (T_lo + T_hi) / 2
        toward_top = not toward_top
        hit = _feasible_at(al, platform, probe, deadline, loose)
        if hit is None:
            T_lo = probe
            continue
        res = _min_period(al, *hit, lb)
        if res is not None and res[0] < T_hi:
            T_hi, x = res
        else:  # numerical corner: the leaf's own period is the probe at most
            T_hi = min(T_hi, probe)
    S = al.S
    f = [x[2 * s] - x[0] for s in range(S)]
    b = [x[2 * s + 1] - x[0] for s in range(S)]
    return T_hi, f, b


def allocation_period(chain: Chain, platform: Platform, assignment: Sequence[int], *,
                      exact_general: bool = False) -> tuple[float, list[float], list[float]] | None:
    """Least period of one allocation and stage start times reaching it, or None if nothing fits.

    Contiguous-style allocations (one stage per device) use the closed form
    unless ``exact_general``, which forces the general search (tests compare
    the two).
    """
    al = _alloc(chain, platform, assignment)
    if al.contiguous and not exact_general:
        r = _contiguous_period(al, platform)
        if r is None:
            return None
        T, ks = r
        f, b = _contiguous_schedule(al, T, ks)
        return T, f, b
    return _general_period(al, platform, math.inf)


# ----------------------------------------------------------------------------
# the planner
# ----------------------------------------------------------------------------
_CACHE: dict[Any, Plan] = {}


def clear_cache() -> None:
    _CACHE.clear()


def _plan_auto(chain: Chain, platform: Platform, allocation: str, time_limit: float | None, max_layers: int
               ) -> Plan:
    """Every policy vector (3^L of them), each planned exhaustively; the best (fewest non-keep
    layers among equal periods, then the first in keep < recompute < offload order)."""
    t0 = time.perf_counter()
    best: Plan | None = None
    best_key = None
    for vec in itertools.product(POLICIES, repeat=len(chain)):
        left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            break
        p = plan_brute(apply_policies(chain, vec), platform, allocation=allocation, time_limit=left,
                       max_layers=max_layers, cache=False)
        if not p.feasible:
            continue
        key = (p.period, sum(v != "keep" for v in vec))
        if best is None or key[0] < best_key[0] * (1 - 1e-12) or (key[0] <= best_key[0] * (1 + 1e-12)
                                                                   and key[1] < best_key[1]):
            best, best_key = p.with_(activations=() if is_keep(vec) else vec), key
    elapsed = time.perf_counter() - t0
    if best is None:
        return infeasible_plan(chain, platform, "brute", "no allocation and activation policies fit in memory",
                               allocation=allocation, solve_seconds=elapsed)
    return best.with_(lower_bound=lower_bound(chain, platform), solve_seconds=elapsed)


def plan_brute(chain: Chain, platform: Platform, *, allocation: str = "contiguous",
               time_limit: float | None = None, max_layers: int = 10, cache: bool = True,
               activations: str | None = None, **options: Any) -> Plan:
    """Exact optimal periodic plan by exhaustive search (tiny instances only).

    ``allocation``: ``"contiguous"`` or ``"general"``. Refuses chains longer
    than ``max_layers``. ``time_limit`` (seconds): when exceeded, the best
    plan found so far is returned with status ``"timeout"``. ``cache``:
    re-use the answer for an identical (chain, platform, allocation).
    ``activations="auto"``: also every activation policy vector (3^L times the work);
    one policy for all layers: :func:`workbench.planners.plan`.
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    L = len(chain)
    if activations == "auto":
        if L > max_layers:
            raise ValueError(f"brute force refuses a chain of {L} layers (max_layers={max_layers})")
        return _plan_auto(chain, platform, allocation, time_limit, max_layers)
    if activations not in (None, "keep"):
        return plan_with_policies(chain, platform, plan_brute, "brute", activations, allocation=allocation,
                                  time_limit=time_limit, max_layers=max_layers, cache=cache)
    if L > max_layers:
        raise ValueError(
            f"brute force is exhaustive and refuses a chain of {L} layers (max_layers={max_layers}); "
            f"coarsen the chain (Chain.coarsen) or use the dp / ilp methods")
    key = (chain, platform, allocation) if cache else None
    if key is not None:
        try:
            if key in _CACHE:
                return _CACHE[key]
        except TypeError:  # unhashable field somewhere: no cache
            key = None
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit else None
    P = platform.devices
    best: tuple[float, tuple[int, ...], list[float], list[float]] | None = None
    timed_out = False
    # contiguous allocations: closed form
    for asg in contiguous_allocations(L, P):
        al = _alloc(chain, platform, asg)
        r = _contiguous_period(al, platform)
        if r is not None and (best is None or r[0] < best[0]):
            f, b = _contiguous_schedule(al, r[0], r[1])
            best = (r[0], asg, f, b)
    if allocation == "general":
        allocs = [a for a in (_alloc(chain, platform, g) for g in general_allocations(L, P)) if not a.contiguous]
        bounds = [max(a.static_lb, _memory_lb(a, platform)) for a in allocs]
        for i in sorted(range(len(allocs)), key=lambda i: bounds[i]):
            upper = best[0] if best is not None else math.inf
            if not bounds[i] < upper / (1 + EPS):
                if best is not None:
                    break
                continue
            try:
                r = _general_period(allocs[i], platform, upper, deadline)
            except TimeoutError:
                timed_out = True
                break
            if r is not None and (best is None or r[0] < best[0]):
                best = (r[0], allocs[i].assignment, r[1], r[2])
            if deadline is not None and time.perf_counter() > deadline:
                timed_out = True
                break
    elapsed = time.perf_counter() - t0
    if best is None:
        why = ("no allocation fits in memory" if not timed_out else "time limit reached before any plan was found")
        result = infeasible_plan(chain, platform, "brute", why, allocation=allocation, solve_seconds=elapsed)
        if timed_out:
            result = result.with_(status="timeout")
    else:
        T, asg, f, b = best
        result = make_plan(chain, platform, T, asg, f, b, method="brute", allocation=allocation,
                           status="timeout" if timed_out else "optimal", gap=None if timed_out else 0.0,
                           solve_seconds=elapsed)
    if key is not None and not timed_out:
        _CACHE[key] = result
    return result
