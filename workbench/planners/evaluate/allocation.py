"""One allocation's stage data, the bounds on its period, and the closed form of contiguous ones.

A planner that scores allocations (brute force, the ILP's searches) first
turns an assignment of layers to devices into an :class:`Allocation`:
its stages (maximal runs, :func:`workbench.model.plan.stages_of`), their compute,
boundary costs, memory per in-flight mini-batch and the rest
(:mod:`workbench.model.memory`), and bounds that need no schedule.

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
    difference constraints ``x_j - x_i >= a + beta*T`` feasible
    (:mod:`workbench.planners.evaluate.orders` searches them).

Why the search is finite (lemma, used for bounds: :func:`k_cap`)
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

Contiguous allocations: a closed form (:func:`contiguous_period`)
    Each device holds one stage, so the only pair is (f_s, b_s), and with
    q = k_s - 1 the smallest window given T satisfies
    ``w_s = max(F_s + 2c_s + B_s + w_{s+1}, (k_s-1)T + F_s + B_s) <= k_s T``.
    Unrolled, this is ``T >= P_{s,j} / (k_s - k_j + 1)`` for all s <= j, with
    ``P_{s,j} = sum_{i=s}^{j-1}(F_i + 2c_i + B_i) + F_j + B_j`` and k
    non-increasing along the chain; plus the link costs. So T*(allocation) is
    the minimum, over the non-increasing k vectors that fit in memory, of a
    maximum of ratios: exact, and fast.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> al = allocation_of(Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(4))), Target.of(2), (0, 0, 1, 1))
>>> contiguous_period(al, Target.of(2))
(6.0, (2, 1))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from workbench.model.activations import stage_host_time
from workbench.model.chain import Chain
from workbench.model.memory import device_extra, layer_terms, stage_memory
from workbench.model.plan import stages_of
from workbench.model.target import Target
from workbench.model.tolerances import COUNT_SLACK, MEMORY_SLACK

__all__ = ["Allocation", "allocation_of", "k_cap", "kmax_memory", "resident_budget", "memory_ok", "least_counts",
           "paths_fit", "memory_floor", "contiguous_period", "contiguous_schedule"]


@dataclass(frozen=True)
class Allocation:
    """Stage data of one allocation (stages in chain order): what :mod:`workbench.planners.evaluate.orders` and
    :func:`contiguous_period` need, from :func:`allocation_of`."""

    assignment: tuple[int, ...]
    runs: list[tuple[int, int]]
    dev: list[int]
    F: list[float]
    B: list[float]
    ka: list[float]         # memory per in-flight mini-batch of stage s (workbench.model.memory: A + stash)
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


def allocation_of(chain: Chain, platform: Target, assignment: Sequence[int]) -> Allocation:
    """The stage data of ``assignment`` (one device per layer).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> al = allocation_of(Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3))), Target.of(2), (0, 1, 0))
    >>> al.runs, al.devices, al.static_lb       # device 0 holds stages 0 and 2: load 6
    ([(0, 0), (1, 1), (2, 2)], [[0, 2], [1]], 6.0)
    """
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
    dev = [assignment[a] for a, _ in runs]
    c = [platform.comm_time(cut[b], dev[s], dev[s + 1]) if s < S - 1 else 0.0 for s, (_, b) in enumerate(runs)]
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
    return Allocation(assignment, runs, dev, F, B, ka, kc, c, path, static, path[0], devices, extra, x)


def k_cap(al: Allocation, T: float) -> int:
    """No valid plan needs an in-flight count above this (lemma in the module docstring)."""
    return int(math.ceil(al.total_path / T)) + 2 * al.S if T > 0 else 1


def kmax_memory(al: Allocation, s: int, budget: float, cap: int) -> int:
    """Largest k <= cap with stage s's memory ``k ka + kc`` <= budget (0 if even k = 1 does not fit)."""
    lim = budget * (1 + MEMORY_SLACK) if math.isfinite(budget) else math.inf
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


def resident_budget(al: Allocation, platform: Target, device: int) -> float:
    """What device ``device``'s stages may hold in resident bytes (its limit less its extra)."""
    return platform.memory_of(device) - al.extra[device]


def memory_ok(al: Allocation, platform: Target, ks: Sequence[int], stages: Sequence[int]) -> bool:
    if not stages:
        return True
    M = platform.memory_of(al.dev[stages[0]])
    if not math.isfinite(M):
        return True
    mem = sum(k * al.ka[s] + al.kc[s] for s, k in zip(stages, ks)) + al.extra[al.dev[stages[0]]]
    return mem <= M * (1 + MEMORY_SLACK)


def least_counts(al: Allocation, T: float) -> list[int]:
    """Per stage, the least in-flight count at period T: ceil(path_s / T) (no window is shorter than
    its path)."""
    return [max(1, int(math.ceil(al.path[s] / T - COUNT_SLACK))) for s in range(al.S)]


def paths_fit(al: Allocation, platform: Target, T: float) -> bool:
    """Necessary for a period <= T: every device fits its stages at :func:`least_counts` (memory only
    grows as T falls). The first test of :func:`_feasible_at`, cheap enough to run on its own."""
    if not math.isfinite(platform.memory_limit):
        return T > 0
    if T <= 0:
        return False
    kmin = least_counts(al, T)
    return all(memory_ok(al, platform, [kmin[s] for s in stages], stages) for stages in al.devices if stages)


def memory_floor(al: Allocation, platform: Target) -> float:
    """T >= path_s / k_s for the largest k_s memory allows (each stage alone on its device)."""
    lb = 0.0
    for s in range(al.S):
        k = kmax_memory(al, s, resident_budget(al, platform, al.dev[s]), 10**9)
        if k == 0:
            return math.inf
        lb = max(lb, al.path[s] / k)
    return lb


# ----------------------------------------------------------------------------
# contiguous: closed form
# ----------------------------------------------------------------------------
def contiguous_period(al: Allocation, platform: Target) -> tuple[float, tuple[int, ...]] | None:
    """Exact least period of a contiguous allocation and the in-flight vector reaching it.

    The least period is the least of the candidate values (``static_lb`` and every ``P[s, j] / m``)
    at which some non-increasing k vector within memory meets every ``T >= P[s, j] / (k_s - k_j + 1)``:
    a bisection over the sorted candidates, each step the pointwise least such vector
    (:func:`_least_counts_at`), which also has the fewest mini-batches in flight. About S^2 log(S^2 K)
    operations where enumerating the vectors took C(K + S - 1, S) (millions for 9 stages).
    """
    S = al.S
    lb = al.static_lb
    cap = k_cap(al, lb) if lb > 0 else 1
    kmax = [kmax_memory(al, s, resident_budget(al, platform, al.dev[s]), cap) for s in range(S)]
    if min(kmax) < 1:
        return None
    P = _window_paths(al)
    top = max(kmax)
    pairs = np.array([P[s][j] for s in range(S) for j in range(s + 1, S)], dtype=float)
    ratios = (pairs[:, None] / np.arange(1, top + 1, dtype=float)[None, :]).ravel()
    cands = np.unique(np.concatenate(([lb], ratios[ratios >= lb])))
    lo, hi = 0, len(cands) - 1
    if _least_counts_at(P, kmax, float(cands[hi])) is None:
        return None
    while lo < hi:   # the least candidate at which a vector fits (feasibility is monotone in T)
        mid = (lo + hi) // 2
        if _least_counts_at(P, kmax, float(cands[mid])) is None:
            lo = mid + 1
        else:
            hi = mid
    ks = _least_counts_at(P, kmax, float(cands[lo]))
    assert ks is not None
    T = max([lb] + [P[s][j] / (ks[s] - ks[j] + 1) for s in range(S) for j in range(s + 1, S)])
    return float(T), ks


def _window_paths(al: Allocation) -> list[list[float]]:
    """``P[s][j]`` for s <= j: the compute and transfers from stage s's forward to its backward through stage j."""
    S = al.S
    P = [[0.0] * S for _ in range(S)]
    for s in range(S):
        acc = 0.0
        for j in range(s, S):
            P[s][j] = acc + al.F[j] + al.B[j] + 2 * al.x[j]   # stage j's gap holds its host round trip
            acc += al.F[j] + al.B[j] + 2 * al.c[j]
    return P


def _least_counts_at(P: list[list[float]], kmax: Sequence[int], T: float) -> tuple[int, ...] | None:
    """The pointwise least non-increasing k (each within ``kmax``) with ``P[s][j] / (k_s - k_j + 1) <= T``
    for every s < j, from the last stage back; None if it exceeds ``kmax`` somewhere."""
    S = len(kmax)
    ks = [0] * S
    for s in range(S - 1, -1, -1):
        k = ks[s + 1] if s + 1 < S else 1
        for j in range(s + 1, S):
            p = P[s][j]
            if p <= 0:
                continue
            if T <= 0:
                return None
            m = max(1, math.ceil(p / T))
            while p / m > T:
                m += 1
            while m > 1 and p / (m - 1) <= T:
                m -= 1
            k = max(k, ks[j] + m - 1)
        if k > kmax[s]:
            return None
        ks[s] = k
    return tuple(ks)


def contiguous_schedule(al: Allocation, T: float, ks: Sequence[int]) -> tuple[list[float], list[float]]:
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
