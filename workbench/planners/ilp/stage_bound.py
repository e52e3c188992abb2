"""A lower bound on the period of every plan (contiguous or general) from the stages' paths.

Every plan cuts the chain into stages (maximal runs of layers on one device).
A stage ``[i..j]`` holds ``k >= ceil(w / T)`` mini-batches, where its window
``w`` is at least its *path*: the compute from layer i to the end of the chain
and back, plus both transfers of every cut from j on (brute force's
``path``); more exactly, at least the window of the contiguous recurrence on the
same stages, ``w_s >= max(r, (ceil(r / T) - 1) T + F_s + B_s)`` with
``r = F_s + B_s + 2 c_s + w_{s+1}`` (precedence, rules 2-4, and the stage's own
forward and backward apart modulo T, rule 5: whatever else its device runs, they
are on one device), which is non-decreasing in ``w_{s+1}``. So whatever the
devices, at period T:

* each stage's compute ``F + B <= T`` and each cut's transfer ``c <= T``
  (rules 5 and 6);
* each stage alone fits a device: ``k A + W0 <= M`` (rule 7, :mod:`workbench.model.memory`'s
  resident terms; a device's transient excess is left out, which keeps the bound valid);
* all stages together fit all devices: ``sum_s (k_s A_s + W0_s) <= P M``.

:func:`stage_path_bound` finds, by a dynamic program over the chain from its
end (a Pareto front of (transfers downstream, memory) per stage start), the
least total memory over all stage partitions, and bisects on T for the least
period at which it fits. Unlike the per-layer bound
(:func:`workbench.planners.ilp.bounds.memory_period_bound`), it sees that cuts
are not free: a cut lengthens every window upstream of it, and on networks
whose activations are large next to the link (resnet50 at 12 GB/s) that is
what bounds the period; and, through the delays of rule 5, that a stage whose
own work fills much of the period lengthens the windows upstream of it (vgg16 and
gnmt from PipeDream on 8 devices: gaps of 9-14 % down to 0.1-1.6 %). The windows'
excess over the compute is rounded *down* to a grid of T / 256 in the fronts,
which keeps the bound valid.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0, saved_bytes=10) for i in range(4)), input_bytes=0)
>>> round(stage_path_bound(ch, Target.of(2, memory=50, memory_model="paper")), 3)   # 4 layers of 10 bytes, 2 x 50 bytes
4.0
"""

from __future__ import annotations

import math
import time

import numpy as np

from workbench.bisection import bisect
from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.plan import lower_bound
from workbench.model.target import Target
from workbench.model.tolerances import LOAD_SLACK, MEMORY_SLACK, STAGE_BOUND_PRECISION, START_PERIOD, ceil_counts
from workbench.planners.ilp.bounds import chain_arrays

__all__ = ["stage_path_bound", "least_stage_memory", "stage_partition"]

GRID = 256  # transfer sums in the fronts are rounded down to multiples of T / GRID


def least_stage_memory(chain: Chain, platform: Target, T: float) -> float:
    """The least total memory of any stage partition valid at period T (inf if none), as
    described in the module docstring (a relaxation: devices pooled)."""
    return _stage_memory(chain, platform)(T)


def stage_partition(chain: Chain, platform: Target, T: float) -> list[tuple[int, int, float, float]]:
    """A stage partition of :func:`least_stage_memory` at period T: per stage (first, last, its memory in the
    relaxation, its compute F + B); [] if none fits.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0, saved_bytes=10) for i in range(4)), input_bytes=0)
    >>> [s[:2] for s in stage_partition(ch, Target.of(2, memory=50, memory_model="paper"), 4.0)]   # free cuts
    [(0, 0), (1, 1), (2, 2), (3, 3)]
    """
    return _stage_memory(chain, platform)(T, partition=True)[1]


def _stage_memory(chain: Chain, platform: Target, deadline=None):
    """``least_stage_memory`` as a function of T, the chain's arrays computed once; it raises
    ``TimeoutError`` once ``time.perf_counter() > deadline`` (polled once per layer)."""
    L = len(chain)
    comp, down, c, a, w0 = chain_arrays(chain, platform)
    lin = linear_terms(layer_terms(chain, platform))
    head, tail = lin.head, lin.tail        # exact per stage; the excess is left out (a relaxation)
    pre = np.concatenate([[0.0], np.cumsum(comp)])
    c2 = 2 * c
    apre = np.concatenate([[0.0], np.cumsum(a)])
    wpre = np.concatenate([[0.0], np.cumsum(w0)])
    M = platform.memory_limit
    tol = 1 + LOAD_SLACK   # times against T, and bytes against M (MEMORY_SLACK: the same)

    def least(T: float, partition: bool = False):
        step = T / GRID
        # fronts[i]: (C, mem, stage end, entry of the front after it, the stage's memory) for the stages
        # covering layers i..L-1, C ascending and mem strictly decreasing (C: the least window of the stage
        # starting at i less the compute from i to the end and back: both transfers of every cut downstream,
        # and the delays of rule 5)
        fronts: list[tuple[np.ndarray, ...] | None] = [None] * (L + 1)
        fronts[L] = (np.zeros(1), np.zeros(1), np.zeros(1, int), np.zeros(1, int), np.zeros(1))
        for i in range(L - 1, -1, -1):
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError("stage path bound: time limit")
            # every stage i..j (its compute within T, its cut's transfer too) with every front entry after it
            last = int(np.searchsorted(pre, pre[i] + T * tol, side="right")) - 2     # the last j within T
            parts = [(j, fronts[j + 1]) for j in range(i, min(last, L - 1) + 1)
                     if fronts[j + 1] is not None and (j == L - 1 or c[j] <= T * tol)]
            if not parts:
                continue
            J = np.concatenate([np.full(len(f[0]), j) for j, f in parts])
            entry = np.concatenate([np.arange(len(f[0])) for _, f in parts])
            C = np.concatenate([f[0] for _, f in parts]) + c2[J]   # the least raw window, less the compute down
            below = np.concatenate([f[1] for _, f in parts])
            k = ceil_counts((down[i] + C) / T)
            smem = (k * (apre[J + 1] - apre[i] + head[i] + tail[J]) + (wpre[J + 1] - wpre[i])
                    + lin.buf_head[i] + lin.buf_tail[J])
            ok = smem <= M * tol
            if not ok.any():
                continue
            # the stage's own forward and backward do not overlap modulo T (rule 5): the window is at least
            # (k - 1) T + its F + B, which lengthens every window upstream
            own = (k[ok] - 1) * T + (pre[J[ok] + 1] - pre[i]) - down[i]
            C = np.floor(np.maximum(C[ok], own) / step) * step
            mem = below[ok] + smem[ok]
            order = np.lexsort((mem, C))
            keep = mem[order] < np.minimum.accumulate(np.concatenate([[math.inf], mem[order][:-1]]))
            pick = order[keep]
            fronts[i] = (C[pick], mem[pick], J[ok][pick], entry[ok][pick], smem[ok][pick])
        if fronts[0] is None:
            return math.inf if not partition else (math.inf, [])
        best = int(np.argmin(fronts[0][1]))
        if not partition:
            return float(fronts[0][1][best])
        stages, i, at = [], 0, best
        while i < L:
            f = fronts[i]
            j = int(f[2][at])
            stages.append((i, j, float(f[4][at]), float(pre[j + 1] - pre[i])))
            i, at = j + 1, int(f[3][at])
        return float(fronts[0][1][best]), stages

    return least


def stage_path_bound(chain: Chain, platform: Target, hi: float | None = None, *, rel: float = STAGE_BOUND_PRECISION,
                     deadline=None) -> float:
    """The least period (to relative precision ``rel``, rounded down) at which some stage
    partition fits the pooled memory of the devices; at least :func:`workbench.model.plan.lower_bound`.
    ``hi``: a period known to be feasible (e.g. a plan's), which caps the search. Past
    ``deadline`` (a ``perf_counter`` time, polled once per layer and step) it returns the
    largest period known not to fit so far: still a lower bound, less tight."""
    lb = lower_bound(chain, platform)
    if not math.isfinite(platform.memory_limit):
        return lb
    state = {"lo": lb}
    try:
        return _bisect(chain, platform, lb, hi, rel, deadline, state)
    except TimeoutError:
        return state["lo"]


def _bisect(chain: Chain, platform: Target, lb: float, hi: float | None, rel: float, deadline, state: dict) -> float:
    """stage_path_bound's search; ``state["lo"]`` always holds a period known not to fit (or ``lb``)."""
    cap = platform.devices * platform.memory_limit * (1 + MEMORY_SLACK)
    least = _stage_memory(chain, platform, deadline)

    def fits(T: float) -> bool:
        return least(T) <= cap

    lo = lb
    if fits(lo):
        return lb
    if hi is None or not math.isfinite(hi):
        hi = max(lo, START_PERIOD) * 2
        while not fits(hi):
            lo, hi = hi, hi * 2
            state["lo"] = lo
            if hi > 1e6 * max(lb, START_PERIOD):
                return math.inf
    elif not fits(hi):
        return lo  # hi is a plan's period, where the relaxation must fit: never here
    def fits_noted(T: float) -> bool:       # a period that does not fit is the bound so far
        ok = fits(T)
        if not ok:
            state["lo"] = T
        return ok

    return bisect(lo, hi, fits_noted, rel=rel)[0]
