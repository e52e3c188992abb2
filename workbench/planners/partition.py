"""Contiguous partitions of a chain into stages, and the bottleneck (chains-on-chains) DP.

A contiguous partition is a list of stages ``(first, last)`` (0-based,
inclusive) covering the chain in order; stage s goes on device s
(:func:`bounds_to_assignment`). On a platform of several nodes, ``dp`` places
the S stages on the *last* S devices (:func:`place`), so that the stage that
starts a q-stage suffix is on device P - q whatever S is: its boundary's link
(:class:`SuffixLinks`) is then known to a DP over suffixes. The *bottleneck* of a partition under a stage
cost is its largest stage cost; :func:`bottleneck_partition` minimises it over
partitions into at most P stages for any cost matrix (O(L^2 P)), and
:func:`unconstrained_period` does so for the cost of docs/model.md's
unconstrained contiguous period, ``max(F + B, c_j)`` of stage ``i..j``
(c_j: the boundary cost after it, 0 after the last layer), without a matrix:

**Greedy feasibility.** With N(s) the fewest stages of cost <= V covering
layers s..L-1, N is non-increasing in s (cut a cover of s..L-1 at s' > s: the
first stage only loses layers, its end and boundary stay). So from each
stage start the farthest admissible end is best, and "is there a partition
with bottleneck <= V" is a walk of at most P stages, each a binary search
(``F + B`` of ``i..j`` grows with j). **Exact value.** The optimum is the
cost of some stage, so the search keeps ``hi`` = the bottleneck of a
partition actually found (a stage cost) and ``lo`` < optimum, alternating a
probe at the largest float below ``hi`` (no partition there: ``hi`` is the
optimum, bit for bit the matrix DP's value) with bisection.

>>> bounds_to_assignment([(0, 1), (2, 2)])
(0, 0, 1)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from workbench.bisection import least_bottleneck
from workbench.model.chain import Chain
from workbench.model.target import Target

__all__ = ["bounds_to_assignment", "suffix_bounds", "bottleneck_partition", "boundary_costs",
           "unconstrained_period", "StageSums", "place", "SuffixLinks"]


def bounds_to_assignment(bounds: Sequence[tuple[int, int]], first: int = 0) -> tuple[int, ...]:
    """Stage s of ``bounds`` goes on device ``first + s``.

    >>> bounds_to_assignment([(0, 1), (2, 2)])
    (0, 0, 1)
    """
    out: list[int] = []
    for s, (a, b) in enumerate(bounds):
        out.extend([first + s] * (b - a + 1))
    return tuple(out)


def place(bounds: Sequence[tuple[int, int]], platform: Target) -> tuple[int, ...]:
    """The devices ``dp`` gives a contiguous partition: stage s on device s on one node; on several nodes
    the last ``len(bounds)`` devices, in order (module docstring).

    >>> place([(0, 1), (2, 2)], Target.of(4)), place([(0, 1), (2, 2)], Target.of(4, devices_per_node=2))
    ((0, 0, 1), (2, 2, 3))
    """
    return bounds_to_assignment(bounds, platform.devices - len(bounds) if platform.multi_node else 0)


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


def boundary_costs(chain: Chain, platform: Target, src: int | None = None, dst: int | None = None) -> np.ndarray:
    """c_j: the boundary cost after layer j (docs/model.md, "Plan"), 0 after the last layer; on the link
    from device ``src`` to ``dst`` (not given: the link within a node).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> boundary_costs(Chain((Layer("a", 1, 1, 0, 8), Layer("b", 1, 1, 0, 8))), Target.of(2, bandwidth=4.0)).tolist()
    [2.0, 0.0]
    """
    L = len(chain)
    c = np.array([platform.comm_time(chain.cut(j), src, dst) for j in range(L)], dtype=float)
    c[L - 1] = 0.0
    return c


class SuffixLinks:
    """The boundary costs a DP over suffixes needs (module docstring): :meth:`after` ``(q)`` is c_j for
    the stage that starts a q-stage suffix (on device P - q, its boundary to device P - q + 1);
    ``least`` and ``most`` bound every link's costs (the same array on one node).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain((Layer("a", 1, 1, 0, 8), Layer("b", 1, 1, 0, 8)))
    >>> links = SuffixLinks(ch, Target.of(4, bandwidth=8.0, devices_per_node=2, node_bandwidth=2.0))
    >>> links.after(3).tolist(), links.after(2).tolist()     # device 1 -> 2 crosses nodes, 2 -> 3 does not
    ([4.0, 0.0], [1.0, 0.0])
    """

    def __init__(self, chain: Chain, platform: Target) -> None:
        self.platform = platform
        self.least = boundary_costs(chain, platform)
        if platform.multi_node:      # the first pipeline rank on another node than rank 0's
            n = next(d for d in range(1, platform.devices) if platform.node_of(d) != platform.node_of(0))
            self._between = boundary_costs(chain, platform, 0, n)
            self.most = np.maximum(self.least, self._between)
        else:
            self._between = self.most = self.least

    def after(self, q: int) -> np.ndarray:
        d = self.platform.devices - q
        return self._between if self.platform.node_of(d) != self.platform.node_of(d + 1) else self.least


class StageSums:
    """L x L matrices of stage sums for every stage ``i..j`` (upper triangle; O(L^2) memory: for the
    planners that take every pair, e.g. PipeDream's): ``F``, ``B``, ``FB``, ``A`` (the profile's saved
    bytes), ``W`` (weights), and ``c`` (:func:`boundary_costs`).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> StageSums(Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 4, 0) for i in range(3))), Target.of(2)).FB[0].tolist()
    [3.0, 6.0, 9.0]
    """

    def __init__(self, chain: Chain, platform: Target) -> None:
        L = len(chain)
        p = chain._prefix
        self.L = L
        self.upper = np.arange(L)[None, :] >= np.arange(L)[:, None]
        span = lambda a: a[1:][None, :] - a[:-1][:, None]  # noqa: E731  a[j+1] - a[i]
        self.F = span(p["f"])
        self.B = span(p["b"])
        self.A = span(p["a"])
        self.W = span(p["w"])
        self.FB = self.F + self.B
        self.c = boundary_costs(chain, platform)


class _StageCost:
    """``max(F + B, c_j)`` of stage ``i..j``, F + B as ``(pf[j+1] - pf[i]) + (pb[j+1] - pb[i])``
    (the float the matrix DP sums), and the greedy walk of the module docstring."""

    def __init__(self, chain: Chain, c: np.ndarray) -> None:
        p = chain._prefix
        self.pf, self.pb, self.c = p["f"], p["b"], c
        self.L = len(chain)

    def fb(self, i: int, j: int) -> float:
        return float((self.pf[j + 1] - self.pf[i]) + (self.pb[j + 1] - self.pb[i]))

    def walk(self, V: float, P: int) -> list[tuple[int, int]] | None:
        """A partition into at most P stages of cost <= V (farthest ends first), or None."""
        L = self.L
        idx = np.arange(L)
        ok_end = np.maximum.accumulate(np.where(self.c <= V, idx, -1))   # last admissible end <= j
        bounds: list[tuple[int, int]] = []
        i = 0
        while i < L:
            if len(bounds) == P or self.fb(i, i) > V:
                return None
            lo, hi = i, L - 1                      # largest j with F + B of i..j <= V
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.fb(i, mid) <= V:
                    lo = mid
                else:
                    hi = mid - 1
            j = lo if lo == L - 1 else int(ok_end[lo])
            if j < i:
                return None
            bounds.append((i, j))
            i = j + 1
        return bounds

    def bottleneck(self, bounds: Sequence[tuple[int, int]]) -> float:
        return max(max(self.fb(i, j), float(self.c[j])) for i, j in bounds)


def unconstrained_period(chain: Chain, platform: Target, c: np.ndarray | None = None
                         ) -> tuple[float, list[tuple[int, int]]]:
    """The optimal contiguous period without a memory limit (the bottleneck of ``max(F + B, c_j)`` over
    partitions into at most P stages), and a partition reaching it. Exact; O(P log L) per probe.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(4)))
    >>> unconstrained_period(ch, Target.of(3))
    (6.0, [(0, 1), (2, 3)])
    """
    cost = _StageCost(chain, boundary_costs(chain, platform) if c is None else c)
    start = [(0, len(chain) - 1)]
    return least_bottleneck(start, cost.bottleneck(start), lambda V: cost.walk(V, platform.devices), cost.bottleneck)
