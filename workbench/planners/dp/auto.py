"""``dp`` with ``activations="auto"``: the exact contiguous plan that also chooses every layer's
activation policy (keep, recompute or offload; docs/model.md, "Activation policies").

The memory DP of :mod:`workbench.planners.dp.contiguous` keeps, per suffix of the chain, the least window
of its first stage, because every stage upstream only gains from a smaller downstream window.
With policies a stage ``i..j`` has many versions, one per policy vector, and three things
couple it to its neighbours: its first layer's activations and peak depend on the policy of
layer i-1 (storage shared across the boundary while layer i-1 keeps its saved output), and
the stage downstream depends in the same way on the policy of layer j. So the state becomes
``D[q][i][p]``: the least window of a q-stage suffix starting at layer i when layer i-1 has
policy p; the recurrence tries every first stage ``i..j`` and every version of it, and reads
``D[q-1][j+1][policy of j]``. It stays exact for the same reason as without policies: a
version's window, in-flight count and memory are non-decreasing in the downstream window.

A version of stage ``i..j`` matters through seven numbers: its extra backward time R (the
forward of every recomputed layer), its offloaded bytes X (the host round trip 2X/h sits in the
gap between its forward and its backward, rule 8), its activation bytes per in-flight
mini-batch A, its resident bytes (static + X, and the tied copies: policy-free), its stash, its
excess (k-independent) and the policy of its last layer. They are built layer by layer from
:func:`workbench.model.activations.policy_terms`: extending a stage by layer j+1 with policy q adds
``act[p_j, q, j+1]`` to the activations and turns the running excesses, the forwards' Ef (the
largest ``fwd_l - sum of act after l``) and the backwards' Eb (the largest ``bwd_l + sum of
(grad - act) after l``: under ``zero_grad none`` the later layers' gradients exist), into
``max(Ef - gone, fwd)`` and ``max(Eb - gone + grad, bwd)``, gone the new layer's activations and offloaded
copy (without gradients made in the backward both
fall alike and their larger one, E, decides). Among versions with the same
first and last policy, one that is no worse in (R, X, activations, Ef, Eb) is no worse in every
extension and at every k (memory is ``k (S + head + tail) + static + buffers + X + max(E, step - S - tail + in)``,
non-decreasing in S for k >= 1), so the others are dropped: exact pruning. On chains of
identical blocks (the GPT family) the surviving versions number about n^2 per stage (how
many layers recompute and how many offload); on arbitrary layers they can grow as 3^n, which
is why this is for chains of tens of layers.

At a period T a version of a non-last stage with downstream window ``w`` has
``raw = F + B + R + 2c + w``, ``k = ceil(raw / T)`` and window ``raw``, or
``(k-1) T + F + B + R + 2X/h`` when the gap must grow (modulo T it must hold the round trip
and leave the forward and backward apart); the last stage has window ``F + B + R + 2X/h``.
Versions with ``F + B + R + 2X/h > T`` or memory above M at their k are out. The least
period is searched as in ``dp`` (:func:`workbench.bisection.least_feasible`), each
probe's answer re-timed exactly on its effective chain.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(4)), input_bytes=10)
>>> T, bounds, pol, _ = auto_on_chain(ch, Platform(2, memory=300, memory_model="paper", host_bandwidth=100))
>>> T, bounds, pol              # keep alone needs a period of 9 s under 300 bytes
(7.0, [(0, 1), (2, 3)], ('keep', 'recompute', 'keep', 'keep'))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from workbench.bisection import least_feasible
from workbench.model.activations import POLICIES, PolicyTerms, apply_policies, policy_terms
from workbench.model.chain import Chain, Platform
from workbench.model.memory import stage_created, stage_step, stage_ties
from workbench.model.tolerances import CEIL_SLACK, MEMORY_SLACK, TINY, ceil_counts
from workbench.model.units import format_bytes
from workbench.planners.partition import SuffixLinks, bottleneck_partition, place, unconstrained_period
from workbench.verify.schedule import Scheduler

__all__ = ["auto_on_chain", "stage_versions", "Versions", "VERSION_CAP", "INEXACT"]

_N = len(POLICIES)
_RC, _OFF = POLICIES.index("recompute"), POLICIES.index("offload")
_EXACT_FILTER = 4000     # pairwise dominance filter up to this many versions per group
#: versions kept per group at most: beyond it the least by a combined score are kept and the
#: result is no longer proven optimal (chains of identical blocks never get near it)
VERSION_CAP = 1500


@dataclass
class Versions:
    """Every kept version of every stage, one row each (arrays of equal length).

    ``i``, ``j``: the stage; ``cls``: which incoming context (policy of layer i-1) it belongs to;
    ``end``: its last layer's policy; ``FB``: forward + backward time with recomputation;
    ``host``: its host round trip 2X/h; ``A``, ``static``, ``stash``, ``extra``: its memory terms
    (``k A + static + (k-1) stash + extra``); ``policies``: its policy vector. Versions that cannot
    fit the memory limit even with one mini-batch in flight are left out.
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
    policies: list
    cls_of: np.ndarray     # (L, N): the class of each incoming policy at each start
    exact: bool            # False when some stage had more than VERSION_CAP versions (thinned)

    def memory(self, k: np.ndarray) -> np.ndarray:
        return k * self.A + self.static + (k - 1) * self.stash + self.extra


def _pareto(*cols: np.ndarray) -> np.ndarray:
    """Indices of the versions no other version dominates in ``cols`` (R, X, S, then the running
    excesses; all smaller-is-better)."""
    n = len(cols[0])
    if n <= 1:
        return np.arange(n)
    key = [np.round(v / (float(np.max(np.abs(v))) or 1.0), 12) for v in cols[:3]]   # equal up to float noise
    order = np.lexsort(tuple(reversed(cols[3:])) + (key[2], key[1], key[0]))
    ks = [v[order] for v in key] + [v[order] for v in cols[3:]]
    first = np.ones(n, dtype=bool)
    first[1:] = np.any([k[1:] != k[:-1] for k in ks[:3]], axis=0)
    if len(cols) > 4:           # several excesses: only exact duplicates of all of them collapse here
        first[1:] |= np.any([k[1:] != k[:-1] for k in ks[3:]], axis=0)
    idx = order[first]                      # per identical (R, X, S): the least excess
    if len(idx) > _EXACT_FILTER:
        idx = _thin(cols, idx, _EXACT_FILTER)
    if len(idx) <= 1:
        return idx
    vals = [v[idx] for v in cols]
    keep = np.ones(len(idx), dtype=bool)
    for a in range(0, len(idx), 512):
        b = min(a + 512, len(idx))
        le = np.all([v[None, :] <= v[a:b, None] for v in vals], axis=0)
        lt = np.any([v[None, :] < v[a:b, None] for v in vals], axis=0)
        keep[a:b] = ~np.any(le & lt, axis=1)
    return idx[keep]


def _thin(cols, idx: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` versions of ``idx`` with the least sum of ranges-normalised ``cols``, and each
    coordinate's least: a heuristic that gives up exactness (callers flag it)."""
    cols = [v[idx] for v in cols]
    score = sum((v - v.min()) / (np.ptp(v) or 1.0) for v in cols)
    pick = set(np.argsort(score, kind="stable")[: n - 4].tolist()) | {int(np.argmin(v)) for v in cols}
    return idx[np.array(sorted(pick))]


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


def stage_versions(chain: Chain, platform: Platform, allowed: Sequence[tuple[int, int]] | None = None) -> Versions:
    """The pruned versions of every stage (only the stages in ``allowed`` when given)."""
    pt = policy_terms(chain, platform)
    keep = pt.keep
    L = len(chain)
    F = chain.forward
    cls_of = _classes(pt)
    h = platform.host_bandwidth
    ends: dict[int, set[int]] = {}
    if allowed is not None:
        for a, b in allowed:
            ends.setdefault(a, set()).add(b)
    pF = np.concatenate([[0.0], np.cumsum(F)])
    pB = np.concatenate([[0.0], np.cumsum(chain.backward)])
    rows: dict[str, list] = {k: [] for k in ("i", "j", "cls", "end", "FB", "host", "A", "static", "stash", "extra")}
    pols: list = []
    exact = True
    limit = platform.memory * (1 + MEMORY_SLACK)
    for i in range(L):
        if allowed is not None and i not in ends:
            continue
        last_j = L - 1 if allowed is None else max(ends[i])
        for c in sorted(set(cls_of[i])):
            pp = int(np.flatnonzero(cls_of[i] == c)[0])
            # groups keyed by (first policy, last policy): arrays R, X, S, Ef, Eb, H and policy tuples
            groups: dict[tuple[int, int], list] = {}
            for q in range(_N):
                groups[(q, q)] = [np.array([F[i] if q == _RC else 0.0]), np.array([pt.offloaded[q, i]]),
                                  np.array([pt.act[pp, q, i]]), np.array([pt.fwd[pp, q, i]]),
                                  np.array([pt.bwd[pp, q, i]]), float(pt.head[pp, q, i]), [(q,)]]
            for j in range(i, last_j + 1):
                if j > i:
                    groups, thinned = _extend(groups, pt, F, j)
                    exact = exact and not thinned
                ties = stage_ties(keep, i, j)
                static0 = float(np.sum(keep.static[i:j + 1])) + ties.static
                # the receive buffer at the stage's start is fixed by i (the one at its end is not monotone in j)
                groups = _within(groups, static0 + keep.const + keep.buf_in[i], limit)
                if not groups:
                    break
                if allowed is not None and j not in ends[i]:
                    continue
                stash = float(np.sum(keep.stash[i:j + 1])) + ties.stash
                step = stage_step(keep, i, j) + stage_created(keep, i, j) - ties.recv
                fb = float(pF[j + 1] - pF[i] + pB[j + 1] - pB[i])
                for (first, end), (R, X, S, Ef, Eb, H, pv) in groups.items():
                    tail = float(pt.tail[end, j])
                    n = len(R)
                    rows["i"].append(np.full(n, i))
                    rows["j"].append(np.full(n, j))
                    rows["cls"].append(np.full(n, c))
                    rows["end"].append(np.full(n, end))
                    rows["FB"].append(fb + R)
                    rows["host"].append(2 * X / h)
                    rows["A"].append(S + H + tail)
                    rows["static"].append(static0 + X + keep.buf_in[i] + keep.buf_out[j])
                    rows["stash"].append(np.full(n, stash))
                    E = np.maximum(Ef, Eb)
                    rows["extra"].append(np.maximum(np.maximum(E, step - S - X - tail + keep.buf_in[i]), 0.0)
                                         + keep.const)
                    pols.extend(pv)
    arr = {k: np.concatenate(v) if v else np.zeros(0) for k, v in rows.items()}
    return Versions(arr["i"].astype(int), arr["j"].astype(int), arr["cls"].astype(int), arr["end"].astype(int),
                    arr["FB"], arr["host"], arr["A"], arr["static"], arr["stash"], arr["extra"], pols, cls_of, exact)


def _within(groups: dict, base: float, limit: float) -> dict:
    """The versions whose least memory (one mini-batch in flight) can still fit: ``S + H + X +
    max(Ef, Eb, 0)`` plus the stage's static bytes and runtime constant only grows as the stage grows
    (``k S + E`` does not fall when a layer is added), so the others never fit."""
    if not math.isfinite(limit):
        return groups
    out = {}
    for key, (R, X, S, Ef, Eb, H, pv) in groups.items():
        ok = np.flatnonzero(S + H + X + np.maximum(np.maximum(Ef, Eb), 0.0) + base <= limit)
        if len(ok):
            out[key] = [R[ok], X[ok], S[ok], Ef[ok], Eb[ok], H, [pv[t] for t in ok]]
    return out


def _extend(groups: dict, pt: PolicyTerms, F: np.ndarray, j: int) -> tuple[dict, bool]:
    """Every version of stage i..j-1 extended by layer j under each policy, pruned (module docstring);
    and whether a group had to be thinned (exactness given up)."""
    merged: dict[tuple[int, int], list] = {}
    thinned = False
    grad = pt.keep.grad[j]      # what layer j's backward makes: the earlier layers' backwards run with it
    for (first, end), (R, X, S, Ef, Eb, H, pv) in groups.items():
        for q in range(_N):
            a = pt.act[end, q, j]
            gone = a + pt.offloaded[q, j]      # layer j's activations and offloaded copy: not there for i..j-1's
            item = merged.setdefault((first, q), [[], [], [], [], [], H, []])
            item[0].append(R + (F[j] if q == _RC else 0.0))
            item[1].append(X + pt.offloaded[q, j])
            item[2].append(S + a)
            item[3].append(np.maximum(Ef - gone, pt.fwd[end, q, j]))
            item[4].append(np.maximum(Eb - gone + grad, pt.bwd[end, q, j]))
            item[6].append([p + (q,) for p in pv])
    out: dict[tuple[int, int], list] = {}
    for key, (Rs, Xs, Ss, Efs, Ebs, H, pvs) in merged.items():
        R, X, S, Ef, Eb = (np.concatenate(v) for v in (Rs, Xs, Ss, Efs, Ebs))
        flat = [p for block in pvs for p in block]
        # without gradients made in the backward both excesses fall alike: their larger one decides
        cols = (R, X, S, Ef, Eb) if np.any(pt.keep.grad > 0) else (R, X, S, np.maximum(Ef, Eb))
        idx = _pareto(*cols)
        if len(idx) > VERSION_CAP:
            idx = _thin(cols, idx, VERSION_CAP)
            thinned = True
        out[key] = [R[idx], X[idx], S[idx], Ef[idx], Eb[idx], H, [flat[t] for t in idx]]
    return out, thinned


def _probe(v: Versions, chain: Chain, platform: Platform, T: float, links: SuffixLinks):
    """The memory DP at period T over the versions: (bounds, policies) of the least first window, or None."""
    L = len(chain)
    tolT = T * (1 + CEIL_SLACK)
    M = platform.memory * (1 + MEMORY_SLACK)
    fits_T = v.FB + v.host <= tolT
    grp = v.i * _N + v.cls
    D_prev = None
    best: list[tuple[float, int, np.ndarray]] = []   # per q: (D[q][0][0], q, argrow table)
    for q in range(1, min(platform.devices, L) + 1):
        if q == 1:
            ok = fits_T & (v.j == L - 1)
            window = v.FB + v.host
            ok &= v.memory(np.ones_like(window)) <= M
        else:
            c = links.after(q)
            down = np.where(v.j < L - 1, D_prev[np.minimum(v.j + 1, L - 1), v.end], np.inf)
            ok = fits_T & np.isfinite(down) & (c[v.j] <= tolT)
            raw = v.FB + 2 * c[v.j] + np.where(ok, down, 0.0)
            k = ceil_counts(raw / T)
            window = np.where(raw - (k - 1) * T < v.FB + v.host, (k - 1) * T + v.FB + v.host, raw)
            ok &= v.memory(k) <= M
        if not ok.any():
            break
        Dc = np.full(L * _N, np.inf)
        np.minimum.at(Dc, grp[ok], window[ok])
        arg = np.full(L * _N, -1)
        hit = np.flatnonzero(ok & (window == Dc[grp]))
        first_of, at = np.unique(grp[hit], return_index=True)
        arg[first_of] = hit[at]
        D = Dc.reshape(L, _N)[np.arange(L)[:, None], v.cls_of]        # (L, N): by incoming policy
        best.append((float(D[0, 0]), q, arg))
        D_prev = D
    if not best or not any(math.isfinite(b[0]) for b in best):
        return None
    _, q, _ = min(best, key=lambda b: (b[0], b[1]))
    bounds: list[tuple[int, int]] = []
    policies: list[int] = []
    i, pp = 0, 0
    for qq in range(q, 0, -1):
        row = int(best[qq - 1][2][i * _N + v.cls_of[i, pp]])
        bounds.append((i, int(v.j[row])))
        policies.extend(v.policies[row])
        i, pp = int(v.j[row]) + 1, int(v.end[row])
    return bounds, tuple(POLICIES[p] for p in policies)


def _least_memory(v: Versions, L: int, P: int) -> float:
    """A lower bound on the memory any contiguous plan needs with policies chosen (every k = 1)."""
    least = np.full((L, L), np.inf)
    np.minimum.at(least, (v.i, v.j), v.memory(np.ones_like(v.A)))
    return bottleneck_partition(least, P)[0]


INEXACT = (f"not proven optimal: a stage had more than {VERSION_CAP} undominated activation-policy versions "
           "(thinned by a heuristic)")


def auto_on_chain(chain: Chain, platform: Platform, allowed: Sequence[tuple[int, int]] | None = None
                  ) -> tuple[float, list[tuple[int, int]] | None, tuple[str, ...] | None, str]:
    """(period, bounds, policies, note): the best contiguous plan with per-layer policies (only the
    stages in ``allowed`` when given, e.g. one partition's). The note says why there is none, or
    :data:`INEXACT` when versions were thinned; "" for a proven optimum."""
    v = stage_versions(chain, platform, allowed)
    links = SuffixLinks(chain, platform)
    c = links.most
    t0 = max(unconstrained_period(chain, platform, links.least)[0], TINY)
    host_all = 2 * sum(platform.host_time(float(np.sum(l))) for l in policy_terms(chain, platform).offloaded[_OFF:])
    hi = (t0 + 2 * float(np.sum(chain.forward)) + float(np.sum(chain.backward)) + 2 * float(c.sum()) + host_all) * 1.01

    def exact(found) -> float:
        bounds, pol = found
        best = Scheduler(apply_policies(chain, pol), platform, place(bounds, platform)).best()
        return best.period if best.feasible else math.inf

    found = least_feasible(t0, hi, lambda T: _probe(v, chain, platform, T, links), exact)
    if found is None:
        need = _least_memory(v, len(chain), platform.devices) if len(v.A) else math.inf
        return math.inf, None, None, (
            f"no contiguous plan fits in {format_bytes(platform.memory)} per device even with recompute and "
            f"offload chosen per layer: the least memory one needs on {platform.devices} devices is "
            f"{format_bytes(need)} (one mini-batch in flight per stage)")
    bounds, pol = found.structure
    return found.period, bounds, pol, "" if v.exact else INEXACT
