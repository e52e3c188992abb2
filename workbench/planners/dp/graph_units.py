"""The down-set lattice of a DAG, block by block: what :func:`workbench.planners.dp.graph.best_order` searches.

A *unit* is a set of nodes merged into one (:class:`Units`); a *down-set*
(ideal) is a set of units closed under predecessors. The steps of
:mod:`workbench.planners.dp.graph`'s module docstring are here: lossless
zero-compute merges (:func:`zero_merges`), blocks between forced cuts
(:func:`forced_splits`), bounded series contraction and the fixed-order
fallback (:func:`block_family`); down-sets are bit masks over a block's nodes
(:func:`words` packs them for numpy).

>>> U = Units({0: [0], 1: [1], 2: [2]}, {0: 1.0, 1: 0.0, 2: 2.0},
...           {0: set(), 1: {0}, 2: {1}}, {0: {1}, 1: {2}, 2: set()})
>>> zero_merges(U), sorted(U.members)
(1, [0, 2])
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from workbench.profiles.pipedream import priority_topological_order

__all__ = ["Units", "zero_merges", "forced_splits", "block_family", "words"]


class Units:
    """Block-local unit DAG: members (node positions), weights, preds/succs (unit ids)."""

    def __init__(self, members: dict[int, list[int]], weight: dict[int, float],
                 pred: dict[int, set[int]], succ: dict[int, set[int]]):
        self.members, self.weight, self.pred, self.succ = members, weight, pred, succ
        self.lossy: set[int] = set()

    def copy(self) -> "Units":
        u = Units({k: list(v) for k, v in self.members.items()}, dict(self.weight),
                   {k: set(v) for k, v in self.pred.items()}, {k: set(v) for k, v in self.succ.items()})
        u.lossy = set(self.lossy)
        return u

    def merge(self, a: int, b: int) -> None:
        """Merge unit b into unit a (an edge contraction that keeps the DAG acyclic)."""
        self.members[a] += self.members.pop(b)
        self.weight[a] += self.weight.pop(b)
        pb, sb = self.pred.pop(b), self.succ.pop(b)
        for x in pb:
            self.succ[x].discard(b)
            if x != a:
                self.succ[x].add(a)
        for y in sb:
            self.pred[y].discard(b)
            if y != a:
                self.pred[y].add(a)
        self.pred[a] = (self.pred[a] | pb) - {a, b}
        self.succ[a] = (self.succ[a] | sb) - {a, b}
        if b in self.lossy:
            self.lossy.discard(b)
            self.lossy.add(a)

    def topo(self) -> list[int]:
        """Units in a topological order (ties by smallest member position)."""
        key = {u: min(m) for u, m in self.members.items()}
        out = priority_topological_order({u: len(p) for u, p in self.pred.items()}, self.succ, key.__getitem__)
        assert len(out) == len(self.pred), "unit graph has a cycle"
        return out

    def restrict(self, units: Sequence[int]) -> "Units":
        keep = set(units)
        return Units({u: list(self.members[u]) for u in units}, {u: self.weight[u] for u in units},
                      {u: self.pred[u] & keep for u in units}, {u: self.succ[u] & keep for u in units})


def zero_merges(U: Units) -> int:
    """Merge zero-weight units into their only predecessor / successor; lossless for compute."""
    merged = 0
    changed = True
    while changed:
        changed = False
        for u in U.topo():
            if u not in U.weight or U.weight[u] != 0.0:
                continue
            if len(U.pred[u]) == 1:
                (p,) = U.pred[u]
                U.merge(p, u)
            elif len(U.succ[u]) == 1:
                (s,) = U.succ[u]
                U.merge(s, u)
            else:
                continue
            merged += 1
            changed = True
    return merged


def _series_merges(U: Units, theta: float) -> int:
    """Merge runs u -> v (u's only successor v, v's only predecessor u) while the unit weighs <= theta."""
    merged = 0
    for v in U.topo():
        if v not in U.pred or len(U.pred[v]) != 1:
            continue
        (u,) = U.pred[v]
        if len(U.succ[u]) != 1 or U.weight[u] + U.weight[v] > theta:
            continue
        if U.weight[u] > 0 and U.weight[v] > 0:
            U.lossy.add(u)
        U.merge(u, v)
        merged += 1
    return merged


def forced_splits(U: Units) -> list[list[int]]:
    """Split a unit DAG at forced cuts: prefixes of a topological order whose
    every unit is an ancestor of every unit after it."""
    order = U.topo()
    pos = {u: i for i, u in enumerate(order)}
    n = len(order)
    desc = [0] * n
    for i in range(n - 1, -1, -1):
        d = 0
        for v in U.succ[order[i]]:
            d |= desc[pos[v]] | (1 << pos[v])
        desc[i] = d
    full = (1 << n) - 1
    acc = full
    blocks, start = [], 0
    for i in range(n - 1):
        acc &= desc[i]
        rest = full ^ ((1 << (i + 1)) - 1)
        if acc & rest == rest:
            blocks.append(order[start:i + 1])
            start = i + 1
            acc = full
    blocks.append(order[start:])
    return blocks


def _ideals(U: Units, order: list[int], cap: int) -> list[int] | None:
    """All down-sets of the unit DAG as bit masks over ``order`` positions, or None beyond ``cap``."""
    pos = {u: i for i, u in enumerate(order)}
    pm = [0] * len(order)
    for u in order:
        for p in U.pred[u]:
            pm[pos[u]] |= 1 << pos[p]
    # quick reject: the units ready after each prefix form an antichain A, and 2^|A| <= #down-sets
    missing = [len(U.pred[u]) for u in order]
    ready = sum(1 for m in missing if m == 0)
    for u in order:
        ready -= 1
        for v in U.succ[u]:
            missing[pos[v]] -= 1
            ready += missing[pos[v]] == 0
        if ready >= 63 or (1 << ready) > cap:
            return None
    succs = [[pos[v] for v in U.succ[u]] for u in order]
    ready0 = sum(1 << i for i, u in enumerate(order) if not U.pred[u])
    seen = {0}
    frontier = [(0, ready0)]
    while frontier:
        nxt = []
        for d, ready in frontier:
            r = ready
            while r:
                low = r & -r
                r ^= low
                e = d | low
                if e in seen:
                    continue
                seen.add(e)
                if len(seen) > cap:
                    return None
                new_ready = ready ^ low
                for j in succs[low.bit_length() - 1]:
                    if (pm[j] & ~e) == 0:
                        new_ready |= 1 << j
                nxt.append((e, new_ready))
        frontier = nxt
    return sorted(seen, key=lambda m: (bin(m).count("1"), m))


def _width(U: Units, units: Sequence[int]) -> int:
    """Width (largest antichain) of ``units`` under the unit DAG's order (Dilworth: n - max matching)."""
    units = list(units)
    if len(units) <= 1:
        return len(units)
    order = U.topo()
    pos = {u: i for i, u in enumerate(order)}
    desc = {u: 0 for u in order}
    for u in reversed(order):
        d = 0
        for v in U.succ[u]:
            d |= desc[v] | (1 << pos[v])
        desc[u] = d
    idx = {u: i for i, u in enumerate(units)}
    adj = [[idx[v] for v in units if (desc[u] >> pos[v]) & 1] for u in units]
    match_r = [-1] * len(units)

    def augment(s: int) -> bool:  # iterative DFS for an augmenting path
        stack = [(s, iter(adj[s]))]
        path: list[tuple[int, int]] = []
        seen = {s}
        while stack:
            x, it = stack[-1]
            for y in it:
                if match_r[y] == -1:
                    path.append((x, y))
                    for a, b in path:
                        match_r[b] = a
                    return True
                z = match_r[y]
                if z not in seen:
                    seen.add(z)
                    path.append((x, y))
                    stack.append((z, iter(adj[z])))
                    break
            else:
                stack.pop()
                if path:
                    path.pop()
        return False

    matching = sum(1 for s in range(len(units)) if augment(s))
    return len(units) - matching


def block_family(sub: Units, cap: int, depth: int = 0):
    """Down-set families of a block (maybe split further): list of (nodes, masks, bound, theta, kind),
    kind one of "exact", "series" (bounded contraction), "relaxed" (split at a chosen cut), "fixed"."""
    nodes = sorted(m for ms in sub.members.values() for m in ms)
    order = sub.topo()
    ideals = _ideals(sub, order, cap)
    if ideals is not None:
        return [(nodes, _to_node_masks(sub, order, ideals, nodes), 0.0, 0.0, "exact")]
    total = sum(sub.weight.values())
    positive = [x for x in sub.weight.values() if x > 0]
    theta = (min(positive) if positive else 0.0) * 2
    theta = max(theta, total / 1024)
    while True:
        U = sub.copy()
        _series_merges(U, theta)
        out = []
        ok = True
        for bu in forced_splits(U):
            s2 = U.restrict(bu)
            s2.lossy = U.lossy & set(bu)
            o2 = s2.topo()
            ids = _ideals(s2, o2, cap)
            if ids is None:
                ok = False
                break
            n2 = sorted(m for ms in s2.members.values() for m in ms)
            lossy = sorted(s2.lossy)
            if lossy:
                wd = _width(s2, lossy)
                blk_bound = float(sum(sorted((s2.weight[u] for u in lossy), reverse=True)[:wd]))
            else:
                blk_bound = 0.0
            out.append((n2, _to_node_masks(s2, o2, ids, n2), blk_bound, theta, "series" if lossy else "exact"))
        if ok:
            return out
        if theta >= total:
            return _relaxed_split(sub, cap, depth)
        theta = min(theta * 2, total)


def _relaxed_split(sub: Units, cap: int, depth: int = 0):
    """Split a block that is too wide at the narrowest prefix near its middle (fewest live units).

    The family then holds only down-sets comparable with that prefix (plus
    the default-order prefixes), so the loss has no a-priori bound (``inf``).
    A block of one unit, or a recursion too deep, keeps the default order only.
    """
    order = sub.topo()
    nodes = sorted(m for ms in sub.members.values() for m in ms)
    if len(order) < 2 or depth > 40:
        masks = [(1 << k) - 1 for k in range(len(nodes) + 1)]
        return [(nodes, masks, math.inf, 0.0, "fixed")]
    pos = {u: i for i, u in enumerate(order)}
    last_use = [max((pos[v] for v in sub.succ[u]), default=i) for i, u in enumerate(order)]
    live = []
    for i in range(len(order) - 1):
        live.append(sum(1 for j in range(i + 1) if last_use[j] > i))
    lo, hi = len(order) // 4, max(len(order) // 4 + 1, (3 * len(order)) // 4)
    cand = range(max(0, lo), min(len(order) - 1, hi))
    mid = (len(order) - 2) / 2
    k = min(cand, key=lambda i: (live[i], abs(i - mid))) if len(cand) else (len(order) - 2) // 2
    out = []
    for part in (order[: k + 1], order[k + 1:]):
        for n2, m2, _b2, t2, kind in block_family(sub.restrict(part), cap, depth + 1):
            out.append((n2, m2, math.inf, t2, "fixed" if kind == "fixed" else "relaxed"))
    return out


def _to_node_masks(U: Units, order: list[int], ideals: list[int], nodes: list[int]) -> list[int]:
    """Unit-ideal masks -> masks over the block's nodes (sorted positions), plus default-order prefixes."""
    local = {p: i for i, p in enumerate(nodes)}
    umask = [sum(1 << local[m] for m in U.members[u]) for u in order]
    out = set()
    for d in ideals:
        m, i = 0, 0
        while d:
            if d & 1:
                m |= umask[i]
            d >>= 1
            i += 1
        out.add(m)
    # prefixes of the default order (nodes are sorted by default position, so prefixes are down-sets)
    out.update((1 << k) - 1 for k in range(len(nodes) + 1))
    return sorted(out, key=lambda m: (bin(m).count("1"), m))


def words(masks: list[int], nbits: int) -> np.ndarray:
    nw = max(1, (nbits + 63) // 64)
    arr = np.zeros((len(masks), nw), dtype=np.uint64)
    lim = (1 << 64) - 1
    for i, m in enumerate(masks):
        for k in range(nw):
            arr[i, k] = (m >> (64 * k)) & lim
    return arr
