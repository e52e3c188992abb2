"""The exact least period of a general allocation: a search over the orders modulo T.

A device holding several stages must keep its operations apart modulo T
(rule 5); for a fixed period T, :func:`_feasible_at` decides exactly whether
some schedule of the allocation (:class:`~workbench.planners.evaluate.allocation.Allocation`)
is valid: it tries every maximal in-flight vector, then a depth-first search
over the integer q of each pair of operations sharing a device (which period
apart they are, the derivation in :mod:`workbench.planners.evaluate.allocation`),
keeping the all-pairs bounds of the difference system closed
(Floyd-Warshall) and backtracking on a negative cycle. A feasible leaf fixes
(k, q); :func:`_structure_period` then returns the exact least T of that
fixed system (parametric longest paths: raise T to the ratio of each positive
cycle until none is left). :func:`general_period` alternates probes just
below the incumbent and bisection, so the returned period T satisfies
T* <= T <= T* (1 + 1e-9), T* the allocation's true optimum (certified: a
probe at T / (1 + 1e-9) was proven infeasible, or T equals a lower bound).
(Its search is not :func:`workbench.bisection.least_feasible`: it starts
from the incumbent it is asked to beat, and its bracket is certified from
below as T (1 + 1e-9), the precision brute force's results are stated in.)

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.evaluate.allocation import allocation_of
>>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
>>> general_period(allocation_of(chain, Target.of(2), (0, 1, 0)), Target.of(2), float("inf"))[0]
6.0
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Sequence

import numpy as np

from workbench.model.target import Target
from workbench.model.tolerances import (
    COUNT_SLACK,
    LAST_BITS,
    MEMORY_SLACK,
    ORDER_SLACK,
    PERIOD_SEARCH,
    PRUNE_SLACK,
    TINY,
)
from workbench.planners.evaluate.allocation import (
    Allocation,
    k_cap,
    kmax_memory,
    least_counts,
    memory_floor,
    memory_ok,
    paths_fit,
    resident_budget,
)

__all__ = ["general_period"]



def _base_constraints(al: Allocation, ks: Sequence[int]) -> list[tuple[int, int, float, int]]:
    S = al.S
    cons: list[tuple[int, int, float, int]] = []
    for s in range(S - 1):
        cons.append((2 * s, 2 * s + 2, al.F[s] + al.c[s], 0))                  # rule 2
        cons.append((2 * s + 3, 2 * s + 1, al.B[s + 1] + al.c[s], 0))          # rule 4
    cons.append((2 * S - 2, 2 * S - 1, al.F[S - 1], 0))                         # rule 3
    for s in range(S):
        cons.append((2 * s + 1, 2 * s, al.B[s], -int(ks[s])))                  # window <= k T
    return cons


def _device_pairs(al: Allocation) -> list[tuple[int, int, float, float]]:
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
    if np.any(np.diag(D) < -ORDER_SLACK * T * 10):
        return None
    return D


def _add(D: np.ndarray, i: int, j: int, w: float, tol: float) -> np.ndarray | None:
    """Add x_j - x_i <= w to a closed system; None when it closes a negative cycle."""
    if w + D[j, i] < -tol:
        return None
    if w >= D[i, j]:
        return D
    return np.minimum(D, D[:, i:i + 1] + w + D[j:j + 1, :])


def _maximal_vectors(al: Allocation, platform: Target, stages: list[int], kmin: list[int], kmax: list[int],
                     deadline: float | None = None) -> list[tuple[int, ...]]:
    """Maximal in-flight vectors of one device's stages that fit its memory (k >= kmin).

    A depth-first walk over the box ``kmin..kmax`` in lexicographic order
    (memory grows with every k, so a branch stops at the first k that cannot
    fit even with the least k downstream); each leaf is confirmed with
    :func:`memory_ok` and kept when no single k can grow. Raises
    ``TimeoutError`` past ``deadline``.
    """
    lo = [kmin[s] for s in stages]
    hi = [kmax[s] for s in stages]
    if any(l > h for l, h in zip(lo, hi)):
        return []
    if not math.isfinite(platform.memory_limit):
        return [tuple(hi)]                      # everything fits: only the top corner is maximal
    limit = (platform.memory_limit * (1 + MEMORY_SLACK) * (1 + PRUNE_SLACK)   # pruning only; leaves use memory_ok
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
            if not memory_ok(al, platform, t, stages):
                return
            for j in range(n):
                if t[j] < hi[j] and memory_ok(al, platform, t[:j] + (t[j] + 1,) + t[j + 1:], stages):
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


def _feasible_at(al: Allocation, platform: Target, T: float, deadline: float | None = None, loose: bool = True):
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
    if T < al.static_lb * (1 - ORDER_SLACK):
        return None
    box = _count_box(al, platform, T)
    if box is None:
        return None
    kmin, kmax, devs = box
    if not loose or all(len(st) == 1 for st in devs):
        return _feasible_per_vectors(al, platform, T, kmin, kmax, devs, deadline)
    return _feasible_loose(al, platform, T, kmin, kmax, devs, deadline)


def _count_box(al: Allocation, platform: Target, T: float
               ) -> tuple[list[int], list[int], list[list[int]]] | None:
    """At period T: per stage its least in-flight count and the largest its device's memory allows
    (the device's other stages at their least), and the stages of every used device; None when
    some device cannot hold even the least counts."""
    cap = k_cap(al, T)
    kmin = least_counts(al, T)
    kmax = [cap] * al.S
    devs = []
    for p, stages in enumerate(al.devices):
        if not stages:
            continue
        base = sum(kmin[s] * al.ka[s] + al.kc[s] for s in stages)
        budget = resident_budget(al, platform, p)
        if base > budget + platform.memory_of(p) * MEMORY_SLACK:   # even the least k's do not fit
            return None
        for s in stages:
            rest = base - (kmin[s] * al.ka[s] + al.kc[s])
            kmax[s] = kmax_memory(al, s, budget - rest, cap)
        devs.append(stages)
    return kmin, kmax, devs


def _feasible_per_vectors(al: Allocation, platform: Target, T: float, kmin: list[int], kmax: list[int],
                          devs: list[list[int]], deadline: float | None):
    """``loose=False`` (or one stage per device): one order search per combination of the devices'
    maximal in-flight vectors; the first valid (ks, qs), or None."""
    per_dev = [(st, _maximal_vectors(al, platform, st, kmin, kmax, deadline)) for st in devs]
    for combo in itertools.product(*[vs for _, vs in per_dev]):
        ks = [0] * al.S
        for (stages, _), v in zip(per_dev, combo):
            for s, k in zip(stages, v):
                ks[s] = k
        hit = _order_search(al, ks, T, deadline)
        if hit is not None:
            return tuple(ks), hit[0]
    return None


def _feasible_loose(al: Allocation, platform: Target, T: float, kmin: list[int], kmax: list[int],
                    devs: list[list[int]], deadline: float | None):
    """One search over the orders with every stage at its largest k; each node's least windows (from
    the closed system) give least k's that must fit in memory (rule 7: k * ka + kc bytes per stage,
    each device's extra on top); at a leaf, the combinations of maximal vectors above those k's are
    tried by adding their window limits. The first valid (ks, qs), or None."""
    S = al.S
    tol = ORDER_SLACK * max(T, TINY) * 10
    ka, kc = al.ka, al.kc
    lim = platform.memory_limit * (1 + MEMORY_SLACK)
    per_dev: list = []

    def least_k(D) -> list[int]:
        return [max(kmin[s], int(math.ceil((al.B[s] - D[2 * s + 1, 2 * s]) / T - COUNT_SLACK))) for s in range(S)]

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


def _order_search(al: Allocation, ks: Sequence[int], T: float, deadline: float | None = None, *,
                  node_ok=None, leaf=None):
    """Orders modulo T of the operations sharing a device, for fixed in-flight counts ``ks``:
    ``(qs, D)`` (the chosen orders and the closed difference system), or None if none is valid.

    ``node_ok(D)``: a test every node of the search must pass; ``leaf(D, qs)``: what a complete
    order returns instead (None: go on searching)."""
    S = al.S
    n = 2 * S
    tol = ORDER_SLACK * max(T, TINY) * 10
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


def _structure_period(al: Allocation, ks: Sequence[int], qs: dict, T0: float):
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
        tol = ORDER_SLACK * max(T, TINY)
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
        T = max(T * (1 + LAST_BITS), a_sum / -b_sum)
    raise RuntimeError("parametric longest path did not converge")


def general_period(al: Allocation, platform: Target, upper: float, deadline: float | None = None,
                    loose: bool = True):
    """Best period of allocation ``al`` if below ``upper`` (certified to PERIOD_SEARCH): (T, f, b) or None."""
    if math.isfinite(upper) and not paths_fit(al, platform, upper / (1 + PERIOD_SEARCH)):
        return None
    lb = max(al.static_lb, memory_floor(al, platform))
    if not lb < upper / (1 + PERIOD_SEARCH) or not math.isfinite(lb):
        return None
    if not math.isfinite(upper):
        # k = 1 everywhere must fit, and then the sequential layout works at T = max(lb, path)
        probe = max(lb, al.total_path)
    else:
        probe = upper / (1 + PERIOD_SEARCH)
    hit = _feasible_at(al, platform, probe, deadline, loose)
    if hit is None:
        return None
    best = _structure_period(al, *hit, lb)
    if best is None:  # pragma: no cover - a feasible leaf always has a period
        raise RuntimeError("feasible leaf without a period")
    T_hi, x = best
    T_lo = lb
    toward_top = True
    while T_hi > T_lo * (1 + PERIOD_SEARCH):
        probe = T_hi / (1 + PERIOD_SEARCH) if toward_top else (T_lo + T_hi) / 2
        toward_top = not toward_top
        hit = _feasible_at(al, platform, probe, deadline, loose)
        if hit is None:
            T_lo = probe
            continue
        res = _structure_period(al, *hit, lb)
        if res is not None and res[0] < T_hi:
            T_hi, x = res
        else:  # numerical corner: the leaf's own period is the probe at most
            T_hi = min(T_hi, probe)
    S = al.S
    f = [x[2 * s] - x[0] for s in range(S)]
    b = [x[2 * s + 1] - x[0] for s in range(S)]
    return T_hi, f, b
