"""The versions of every stage for ``dp`` with ``activations="auto"``: its policy vectors worth keeping.

A stage ``i..j`` with a policy per layer (keep, recompute, offload) matters to the DP of
:mod:`workbench.planners.dp.auto` through seven numbers: its extra backward time R (the forward of every recomputed
layer), its offloaded bytes X, its activation bytes per in-flight mini-batch S, its excesses Ef and Eb, the policies
of its first and last layers and its resident bytes (static + X, and the tied copies: policy-free). They are built
layer by layer from :func:`workbench.model.activations.policy_terms`: extending a stage by layer j+1 with policy q
adds ``act[p_j, q, j+1]`` to S and turns the forwards' excess Ef (the largest ``fwd_l - sum of act after l``) and
the backwards' excess Eb (the largest ``bwd_l + sum of (grad - act) after l``: under ``zero_grad none`` the later
layers' gradients exist) into ``max(Ef - gone, fwd)`` and ``max(Eb - gone + grad, bwd)``, gone the new layer's
activations and offloaded copy (without gradients made in the backward both fall alike and their larger one decides:
both are set to it). Among the versions of one *group* (the same first and last policy) one that is no worse in
(R, X, S, Ef, Eb) is no worse in every extension and at every in-flight count k (memory is ``k (S + head + tail) +
static + X + max(E, step - S - X - tail + in)``, E = max(Ef, Eb), non-decreasing in S for k >= 1), so the others are
dropped: exact pruning.

**A budget that grows with the graph.** On arbitrary layers the undominated versions can grow as 3^n with the
stage's length, and a chain has L^2 / 2 stages. So every group keeps at most ``cap`` versions, with ``cap`` chosen
so that all stages' versions together stay within :data:`ROW_BUDGET` rows (:func:`group_cap`; the work then grows
with the number of stages, not with the policy vectors). A group over its cap is *thinned* on a grid over (R, X):
per cell the version least in (S, Ef, Eb) stays, and a **relaxation row** takes the place of the cell's others: the
least R, X, S, Ef and Eb over them, each separately. A relaxation row is no policy vector, but it is no worse than
any version it stands for, in every extension (R, X, S add up; the excesses' updates are monotone in each) and at
every k; so the DP over the real rows gives a plan, and the same DP with the relaxation rows too gives a lower bound
on the best plan over every policy vector (:mod:`workbench.planners.dp.auto`). Without a thinned group the versions
are exact.

Policy vectors are kept as a tree (:class:`PolicyTree`: each version's parent version one layer
shorter and its last policy), so a version costs a few numbers, not a vector of its length.

Two more prunings keep only stages that can matter: a stage whose compute alone is above ``max_load`` (a period some
plan reaches) never helps, and a version whose memory at the least in-flight count a stage starting at layer i can
have at that period (``k_lo[i]``) does not fit never does (its memory at k only grows as the stage grows, so the
stage stops there).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(3)), input_bytes=10)
>>> v = stage_versions(ch, Target.of(2, memory=1000, memory_model="paper"))
>>> v.exact, int(v.real.sum()) > 0, v.policies(int(np.flatnonzero(v.real & (v.i == 0) & (v.j == 2))[0]))
(True, True, (0, 0, 0))
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from workbench.model.activations import POLICIES, PolicyTerms, policy_terms
from workbench.model.chain import Chain
from workbench.model.memory import stage_created, stage_step, stage_ties
from workbench.model.target import Target
from workbench.model.tolerances import MEMORY_SLACK
from workbench.planners.dp.policy_tree import PolicyTree

__all__ = ["Versions", "PolicyTree", "OverBudget", "stage_versions", "group_cap", "stage_ends", "ROW_BUDGET",
           "VERSION_CAP", "MIN_CAP", "WORK_BUDGET"]

_N = len(POLICIES)
_RC, _OFF = POLICIES.index("recompute"), POLICIES.index("offload")
#: all stages' versions together (rows: real and relaxation) at most about this many
ROW_BUDGET = 500_000
#: versions kept per group at most (and the cap of the exact pairwise dominance filter)
VERSION_CAP = 1500
#: versions kept per group at least, whatever the budget
MIN_CAP = 4
#: pairwise comparisons of versions (over every extension step) at most, about 1 s of numpy per 10^8
WORK_BUDGET = 1e9


class OverBudget(RuntimeError):
    """The exact attempt of :func:`stage_versions` went over its row or work budget."""


@dataclass
class Versions:
    """Every kept version of every stage, one row each (arrays of equal length).

    ``i``, ``j``: the stage; ``cls``: which incoming context (policy of layer i-1) it belongs to;
    ``end``: its last layer's policy; ``FB``: forward + backward time with recomputation;
    ``host``: its host round trip 2X/h (``Platform.host_time``); ``A``, ``static``, ``stash``, ``extra``: its memory
    terms (``k A + static + (k-1) stash + extra``); ``node``: its node in ``tree`` (-1: a relaxation row, module
    docstring). ``exact``: no group was thinned (every row is real, nothing dropped but dominated versions).
    """

    i: np.ndarray
    j: np.ndarray
    cls: np.ndarray
    end: np.ndarray
    FB: np.ndarray
    host: np.ndarray
    A: np.ndarray
    static: np.ndarray
    stash: np.ndarray
    extra: np.ndarray
    node: np.ndarray
    cls_of: np.ndarray     # (L, N): the class of each incoming policy at each start
    tree: PolicyTree
    exact: bool
    cap: int

    def memory(self, k: np.ndarray) -> np.ndarray:
        return k * self.A + self.static + (k - 1) * self.stash + self.extra

    @property
    def real(self) -> np.ndarray:
        """Rows that are policy vectors (not relaxation rows)."""
        return self.node >= 0

    def policies(self, row: int) -> tuple[int, ...]:
        """The policy vector (indices into ``POLICIES``) of real row ``row``."""
        return self.tree.vector(int(self.node[row]))

    def subset(self, rows: np.ndarray) -> "Versions":
        """These rows only (a boolean mask or indices)."""
        cols = {k: getattr(self, k)[rows] for k in ("i", "j", "cls", "end", "FB", "host", "A", "static", "stash",
                                                     "extra", "node")}
        return Versions(**cols, cls_of=self.cls_of, tree=self.tree, exact=self.exact, cap=self.cap)


def _classes(pt: PolicyTerms) -> np.ndarray:
    """(L, N): for each start layer, which incoming policies give the same first-layer terms."""
    L = pt.act.shape[2]
    out = np.zeros((L, _N), dtype=int)
    for i in range(1, L):
        seen: list[tuple] = []
        for p in range(_N):
            sig = (tuple(pt.act[p, :, i]), tuple(pt.head[p, :, i]), tuple(pt.fwd[p, :, i]), tuple(pt.bwd[p, :, i]))
            if sig not in seen:
                seen.append(sig)
            out[i, p] = seen.index(sig)
    return out


def stage_ends(chain: Chain, max_load: float, ends: Mapping[int, Sequence[int]] | None = None) -> dict[int, list[int]]:
    """Per stage start, the stage ends worth a version: those in ``ends`` (every layer when None) whose
    stage's compute F + B is at most ``max_load``.

    >>> from workbench.model.chain import Chain, Layer
    >>> stage_ends(Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0) for i in range(3))), 4.0)
    {0: [0, 1], 1: [1, 2], 2: [2]}
    """
    L = len(chain)
    pre = np.concatenate([[0.0], np.cumsum(chain.forward + chain.backward)])
    lim = max_load * (1 + 1e-9)
    out: dict[int, list[int]] = {}
    for i in (range(L) if ends is None else sorted(ends)):
        cand = range(i, L) if ends is None else sorted(e for e in ends[i] if e >= i)
        out[i] = [j for j in cand if pre[j + 1] - pre[i] <= lim]
    return out


def group_cap(ends: Mapping[int, Sequence[int]], classes: np.ndarray, budget: int | None = None) -> int:
    """Versions per group so that every stage's real and relaxation rows fit ``budget`` rows (each (start,
    end, incoming class) has up to N^2 groups of up to ``cap`` real and ``cap`` relaxation rows), and so that
    the pairwise dominance tests of all extension steps (each about N^2 (N cap)^2 comparisons) stay within
    :data:`WORK_BUDGET`.

    >>> group_cap({0: [0, 1], 1: [1]}, np.zeros((2, 3), dtype=int), budget=1000)
    18
    """
    counts = {i: len(set(classes[i].tolist())) for i in ends}
    cells = sum(len(e) * counts[i] for i, e in ends.items()) * _N * _N
    steps = sum((e[-1] - i + 1) * counts[i] for i, e in ends.items() if e)
    budget = ROW_BUDGET if budget is None else budget
    by_work = math.isqrt(int(WORK_BUDGET / max(steps * _N ** 4, 1)))
    return int(min(VERSION_CAP, max(MIN_CAP, min(budget // max(2 * cells, 1), by_work))))


class _Flat:
    """The versions of one stage start while the stage grows, every group in one set of arrays: real rows
    (R, X, S, Ef, Eb, their first and last policies and tree nodes) and relaxation rows (``v``: R, X, S, Ef,
    Eb, first, last). ``H[first]``: the stage's head bytes per in-flight mini-batch under its first layer's
    policy."""

    __slots__ = ("R", "X", "S", "E", "B", "first", "end", "node", "v", "H")

    def __init__(self, R, X, S, E, B, first, end, node, v, H) -> None:
        self.R, self.X, self.S, self.E, self.B, self.first, self.end, self.node, self.v, self.H = (
            R, X, S, E, B, first, end, node, v, H)

    def take(self, ok: np.ndarray, vok: np.ndarray) -> "_Flat":
        return _Flat(self.R[ok], self.X[ok], self.S[ok], self.E[ok], self.B[ok], self.first[ok], self.end[ok],
                     self.node[ok], tuple(a[vok] for a in self.v), self.H)

    def __len__(self) -> int:
        return len(self.R) + len(self.v[0])


def _no_rows() -> tuple[np.ndarray, ...]:
    return (*(np.zeros(0) for _ in range(5)), np.zeros(0, np.int64), np.zeros(0, np.int64))


def _dedup(gid: np.ndarray, R: np.ndarray, X: np.ndarray, S: np.ndarray, E: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Indices of the versions that differ in (group, R, X, S) up to float noise, the least (E, B) of each
    (when E and B differ, only exact duplicates of both collapse)."""
    n = len(R)
    key = [np.round(v / (float(np.max(np.abs(v))) or 1.0), 12) for v in (R, X, S)] if n else [R, X, S]
    order = np.lexsort((B, E, key[2], key[1], key[0], gid))
    first = np.ones(n, dtype=bool)
    if n > 1:
        first[1:] = np.any([k[order][1:] != k[order][:-1] for k in (gid, *key)], axis=0)
        if not np.array_equal(E, B):
            first[1:] |= np.any([k[order][1:] != k[order][:-1] for k in (E, B)], axis=0)
    return order[first]


def _undominated(gid, R, X, S, E, B, idx: np.ndarray) -> np.ndarray:
    """The rows of ``idx`` that no row of ``idx`` in the same group dominates in (R, X, S, E, B)."""
    if len(idx) <= 640:     # one matrix, the groups masked: fewer numpy calls than a loop over the groups
        g, r, x, s, e, b = gid[idx], R[idx], X[idx], S[idx], E[idx], B[idx]
        le = ((g[None, :] == g[:, None]) & (r[None, :] <= r[:, None]) & (x[None, :] <= x[:, None])
              & (s[None, :] <= s[:, None]) & (e[None, :] <= e[:, None]) & (b[None, :] <= b[:, None]))
        lt = ((r[None, :] < r[:, None]) | (x[None, :] < x[:, None]) | (s[None, :] < s[:, None])
              | (e[None, :] < e[:, None]) | (b[None, :] < b[:, None]))
        return idx[~np.any(le & lt, axis=1)]
    out = []
    order = idx[np.argsort(gid[idx], kind="stable")]
    g = gid[order]
    cuts = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1], [True]]))
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        rows = order[lo:hi]
        vals = [v[rows] for v in (R, X, S, E, B)]
        keep = np.ones(len(rows), dtype=bool)
        for a in range(0, len(rows), 512):
            z = min(a + 512, len(rows))
            le = np.all([v[None, :] <= v[a:z, None] for v in vals], axis=0)
            lt = np.any([v[None, :] < v[a:z, None] for v in vals], axis=0)
            keep[a:z] = ~np.any(le & lt, axis=1)
        out.append(rows[keep])
    return np.concatenate(out) if out else idx


def _pareto(gid, R, X, S, E, B) -> np.ndarray:
    """Indices of the versions no version of their group dominates (all smaller-is-better); groups too large
    for the pairwise test (more than :data:`VERSION_CAP` after merging equal ones) keep all their versions
    (the grid thins them)."""
    idx = _dedup(gid, R, X, S, E, B)
    if len(idx) <= 1:
        return idx
    ug, counts = np.unique(gid[idx], return_counts=True)
    big = set(ug[counts > VERSION_CAP].tolist())
    small = idx[~np.isin(gid[idx], list(big))] if big else idx
    out = [_undominated(gid, R, X, S, E, B, small)] if len(small) else []
    out += [idx[gid[idx] == u] for u in big]
    return np.sort(np.concatenate(out)) if out else idx


def _group_cells(gid: np.ndarray, R: np.ndarray, X: np.ndarray, cap: int) -> np.ndarray:
    """Per row, a cell of a grid of at most ``cap`` cells over its group's (R, X) range (a square grid when
    both vary, a line when one does), numbered uniquely across groups."""
    ug, inv = np.unique(gid, return_inverse=True)
    stats = []
    for v in (R, X):
        lo = np.full(len(ug), np.inf)
        hi = np.full(len(ug), -np.inf)
        np.minimum.at(lo, inv, v)
        np.maximum.at(hi, inv, v)
        stats.append((lo, hi - lo))
    (r0, rs), (x0, xs) = stats
    both = (rs > 0) & (xs > 0)
    side = max(1, math.isqrt(cap))
    g1 = np.where(both, side, np.where(rs > 0, cap, 1))
    g2 = np.where(both, side, np.where(xs > 0, cap, 1))
    w1 = np.where(rs > 0, rs / g1, 1.0) * (1 + 1e-12)
    w2 = np.where(xs > 0, xs / g2, 1.0) * (1 + 1e-12)
    c1 = np.clip(((R - r0[inv]) / w1[inv]).astype(np.int64), 0, g1[inv] - 1)
    c2 = np.clip(((X - x0[inv]) / w2[inv]).astype(np.int64), 0, g2[inv] - 1)
    return gid.astype(np.int64) * (cap + 1) ** 2 + c1 * (cap + 1) + c2


def _select(gid, R, X, S, E, B, v, cap: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The real versions kept (indices) and the relaxation rows (R, X, S, Ef, Eb, group) (module docstring):
    all undominated ones of a group when they are at most ``cap``; else per grid cell the least in (S, Ef,
    Eb), the others folded into the cell's relaxation row with the incoming relaxation rows ``v`` of that
    group."""
    idx = _pareto(gid, R, X, S, E, B)
    vR, vX, vS, vE, vB, vg = v
    ug, counts = np.unique(gid[idx], return_counts=True)
    over = ug[counts > cap]
    if not len(over) and not len(vR):
        return idx, (vR, vX, vS, vE, vB, vg)
    thin = np.isin(gid[idx], over)
    kept, rest = idx[~thin], idx[thin]
    allg = np.concatenate([gid[idx], vg])
    cells = _group_cells(allg, np.concatenate([R[idx], vR]), np.concatenate([X[idx], vX]), cap)
    rc, vc = cells[:len(idx)][thin], cells[len(idx):]
    if len(rest):
        order = np.lexsort((B[rest], E[rest], S[rest], rc))
        first = np.ones(len(order), dtype=bool)
        first[1:] = rc[order][1:] != rc[order][:-1]
        kept = np.sort(np.concatenate([kept, rest[order[first]]]))
        fold = order[~first]
        vR, vX, vS, vE, vB = (np.concatenate([a[rest[fold]], b])
                              for a, b in ((R, vR), (X, vX), (S, vS), (E, vE), (B, vB)))
        vg, vc = np.concatenate([gid[rest[fold]], vg]), np.concatenate([rc[fold], vc])
    if not len(vR):
        return kept, (vR, vX, vS, vE, vB, vg)
    order = np.argsort(vc, kind="stable")
    cs = vc[order]
    heads = np.flatnonzero(np.concatenate([[True], cs[1:] != cs[:-1]]))
    rows = [np.minimum.reduceat(a[order], heads) for a in (vR, vX, vS, vE, vB)] + [vg[order][heads]]
    return kept, _not_beaten(rows, gid[kept], [a[kept] for a in (R, X, S, E, B)])


def _not_beaten(rows: list[np.ndarray], g, kept: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The relaxation rows that no kept version of their group is at least as good as (such a row stands
    for nothing that version does not beat); ``kept``: the kept versions' (R, X, S, Ef, Eb)."""
    vg = rows[-1]
    if not len(g) or len(vg) * len(g) > 20_000:     # a saving of rows, not needed for validity: only when cheap
        return tuple(rows)
    beaten = np.any(np.all([k[None, :] <= v[:, None] for k, v in zip(kept, rows)], axis=0)
                    & (g[None, :] == vg[:, None]), axis=1)
    return tuple(a[~beaten] for a in rows)


def _start(pt: PolicyTerms, F: np.ndarray, i: int, pp: int, tree: PolicyTree) -> _Flat:
    """The one-layer versions of a stage starting at layer i after a layer of policy ``pp``."""
    q = np.arange(_N)
    node = tree.add(np.full(_N, -1), q)
    E, B = pt.fwd[pp, :, i].astype(float), pt.bwd[pp, :, i].astype(float)
    if not np.any(pt.keep.grad > 0):        # both excesses fall alike: their larger one decides
        E = B = np.maximum(E, B)
    return _Flat(np.where(q == _RC, F[i], 0.0), pt.offloaded[:, i].astype(float), pt.act[pp, :, i].astype(float),
                 E, B, q.copy(), q.copy(), node, _no_rows(), pt.head[pp, :, i].astype(float))


def _extend(st: _Flat, pt: PolicyTerms, F: np.ndarray, j: int, cap: int, tree: PolicyTree) -> tuple[_Flat, bool]:
    """Every version of stage i..j-1 extended by layer j under each policy, pruned (module docstring);
    and whether relaxation rows remain."""
    dr = np.where(np.arange(_N) == _RC, F[j], 0.0)
    dx = pt.offloaded[:, j]
    grad = float(pt.keep.grad[j])       # what layer j's backward makes: the earlier layers' backwards run with it
    merged = not np.any(pt.keep.grad > 0)

    def grow(R, X, S, E, B, first, end):
        n = len(R)
        a = pt.act[end, :, j].T.ravel()     # policy-major: q = 0, 1, 2
        fw, bw = pt.fwd[end, :, j].T.ravel(), pt.bwd[end, :, j].T.ravel()
        q = np.repeat(np.arange(_N), n)
        gone = a + dx[q]            # layer j's activations and offloaded copy: not there for i..j-1's
        E2 = np.maximum(np.tile(E, _N) - gone, fw)
        B2 = np.maximum(np.tile(B, _N) - gone + grad, bw)
        if merged:
            E2 = B2 = np.maximum(E2, B2)
        return (np.tile(R, _N) + dr[q], np.tile(X, _N) + dx[q], np.tile(S, _N) + a, E2, B2, np.tile(first, _N), q)

    R, X, S, E, B, first, end = grow(st.R, st.X, st.S, st.E, st.B, st.first, st.end)
    parent = np.tile(st.node, _N)
    vR, vX, vS, vE, vB, vfirst, vend = grow(*st.v)
    gid = first * _N + end
    kept, v = _select(gid, R, X, S, E, B, (vR, vX, vS, vE, vB, vfirst * _N + vend), cap)
    vg = v[5]
    nodes = tree.add(parent[kept], end[kept])
    return (_Flat(R[kept], X[kept], S[kept], E[kept], B[kept], first[kept], end[kept], nodes,
                  (v[0], v[1], v[2], v[3], v[4], vg // _N, vg % _N), st.H), bool(len(v[0])))


def _fit(st: _Flat, base: float, stash: float, k_lo: int, limit: float) -> _Flat:
    """The versions whose memory at ``k_lo`` mini-batches in flight (``k_lo (S + H) + X + max(Ef, Eb, 0)`` plus
    the stage's static bytes and ``(k_lo - 1) stash``) fits: it only grows as the stage grows, so the
    others never fit."""
    if not math.isfinite(limit):
        return st
    room = limit - base - (k_lo - 1) * stash
    ok = k_lo * (st.S + st.H[st.first]) + st.X + np.maximum(np.maximum(st.E, st.B), 0.0) <= room
    vR, vX, vS, vE, vB, vf, _ = st.v
    vok = k_lo * (vS + st.H[vf]) + vX + np.maximum(np.maximum(vE, vB), 0.0) <= room
    return st.take(ok, vok)


def stage_versions(chain: Chain, platform: Target, ends: Mapping[int, Sequence[int]] | None = None, *,
                   max_load: float = math.inf, k_lo: np.ndarray | None = None, row_budget: int | None = None,
                   deadline: float | None = None, strict: bool = False, memory_only: bool = False) -> Versions:
    """The versions of every stage (only the (start, ends) of ``ends`` when given, e.g. one partition's
    stages or block boundaries), within ``row_budget`` rows (module docstring). ``max_load``: stages with
    more compute never help; ``k_lo[i]``: the least in-flight count of a stage starting at layer i (default
    1). Raises ``TimeoutError`` past ``deadline`` (a ``perf_counter`` time, polled per stage).

    ``strict``: the exact attempt: every group keeps up to :data:`VERSION_CAP` versions, and
    :class:`OverBudget` is raised as soon as the rows pass ``row_budget`` or the pairwise tests pass
    :data:`WORK_BUDGET` (most chains of tens of identical blocks fit: their versions are few).

    ``memory_only``: versions for the memory at one mini-batch in flight alone, which recomputation time does not
    change and offloaded bytes change as activations do (``memory(1)`` exact; times and ``memory(k > 1)`` not): with
    R and X gone from the comparison, far fewer versions are undominated."""
    pt = policy_terms(chain, platform)
    L = len(chain)
    F = chain.forward
    if memory_only:
        pt, F = replace(pt, act=pt.act + pt.offloaded[None], offloaded=np.zeros_like(pt.offloaded)), np.zeros(L)
    keep = pt.keep
    cls_of = _classes(pt)
    host_time = platform.host_time
    todo = stage_ends(chain, max_load, ends)
    budget = ROW_BUDGET if row_budget is None else row_budget
    cap = VERSION_CAP if strict else group_cap(todo, cls_of, budget)
    used = [0, 0.0]        # rows emitted, pairwise comparisons made
    kl = np.ones(L, dtype=int) if k_lo is None else np.maximum(np.asarray(k_lo, dtype=int), 1)
    pF = np.concatenate([[0.0], np.cumsum(F)])
    pB = np.concatenate([[0.0], np.cumsum(chain.backward)])
    pS = np.concatenate([[0.0], np.cumsum(keep.static)])
    pW = np.concatenate([[0.0], np.cumsum(keep.stash)])
    rows: dict[str, list] = {k: [] for k in ("i", "j", "cls", "end", "FB", "host", "A", "static", "stash", "extra",
                                             "node")}
    tree = PolicyTree()
    exact = True
    limit = platform.memory_limit * (1 + MEMORY_SLACK)
    for i, want in todo.items():
        if not want:
            continue
        wanted = set(want)
        for c in sorted(set(cls_of[i])):
            pp = int(np.flatnonzero(cls_of[i] == c)[0])
            st = _start(pt, F, i, pp, tree)
            for j in range(i, want[-1] + 1):
                if deadline is not None and time.perf_counter() > deadline:
                    raise TimeoutError("dp auto: time limit while building stage versions")
                if j > i:
                    if strict:
                        used[1] += (_N * len(st)) ** 2 / _N
                        if used[1] > WORK_BUDGET:
                            raise OverBudget(f"more than {WORK_BUDGET:.0e} version comparisons")
                    st, relaxed = _extend(st, pt, F, j, cap, tree)
                    exact = exact and not relaxed
                ties = stage_ties(keep, i, j)
                static0 = float(pS[j + 1] - pS[i]) + ties.static
                stash = float(pW[j + 1] - pW[i]) + ties.stash
                # the receive buffer at the stage's start is fixed by i (the one at its end is not monotone in j)
                st = _fit(st, static0 + keep.const + keep.buf_in[i], stash, int(kl[i]), limit)
                if not len(st):
                    break
                if j in wanted:
                    _emit(rows, st, pt, keep, i, j, c, static0, stash, float(pF[j + 1] - pF[i] + pB[j + 1] - pB[i]),
                          host_time)
                    used[0] += len(st)
                    if strict and used[0] > budget:
                        raise OverBudget(f"more than {budget} version rows")
    arr = {k: np.concatenate(v) if v else np.zeros(0) for k, v in rows.items()}
    return Versions(arr["i"].astype(int), arr["j"].astype(int), arr["cls"].astype(int), arr["end"].astype(int),
                    arr["FB"], arr["host"], arr["A"], arr["static"], arr["stash"], arr["extra"],
                    arr["node"].astype(np.int64), cls_of, tree, exact, cap)


def _emit(rows: dict, st: _Flat, pt: PolicyTerms, keep, i: int, j: int, c: int, static0: float, stash: float,
          fb: float, host_time: Callable[[np.ndarray], np.ndarray]) -> None:
    """Append the rows of stage i..j (class c): its real versions and relaxation rows."""
    step = stage_step(keep, i, j) + stage_created(keep, i, j) - stage_ties(keep, i, j).recv
    vR, vX, vS, vE, vB, vf, ve = st.v
    R, X, S, E, B = (np.concatenate([a, b]) for a, b in ((st.R, vR), (st.X, vX), (st.S, vS), (st.E, vE),
                                                         (st.B, vB)))
    E = np.maximum(E, B)
    first, end = np.concatenate([st.first, vf]), np.concatenate([st.end, ve])
    n = len(R)
    tail = pt.tail[end, j]
    rows["i"].append(np.full(n, i))
    rows["j"].append(np.full(n, j))
    rows["cls"].append(np.full(n, c))
    rows["end"].append(end)
    rows["FB"].append(fb + R)
    rows["host"].append(2 * host_time(X))
    rows["A"].append(S + st.H[first] + tail)
    rows["static"].append(static0 + X + keep.buf_in[i] + keep.buf_out[j])
    rows["stash"].append(np.full(n, stash))
    rows["extra"].append(np.maximum(np.maximum(E, step - S - X - tail + keep.grad_sent[i]), 0.0) + keep.const)
    rows["node"].append(np.concatenate([st.node, np.full(len(vR), -1)]))
