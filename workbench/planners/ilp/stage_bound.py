"""A lower bound on the period of every plan (contiguous or general) from the stages' paths.

Every plan cuts the chain into stages (maximal runs of layers on one device).
A stage ``[i..j]`` holds ``k >= ceil(w / T)`` mini-batches, where its window
``w`` is at least its *path*: the compute from layer i to the end of the chain
and back, plus both transfers of every cut from j on (brute force's
``path``). So whatever the devices, at period T:

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
what bounds the period. Transfers are rounded *down* to a grid of T / 256 in the
fronts, which keeps the bound valid.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0, saved_bytes=10) for i in range(4)), input_bytes=0)
>>> round(stage_path_bound(ch, Platform(2, memory=50, memory_model="paper")), 3)   # 4 layers of 10 bytes, 2 x 50 bytes
4.0
"""

from __future__ import annotations

import math
import time

import numpy as np

from workbench.bisection import bisect
from workbench.model.chain import Chain, Platform
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.plan import lower_bound
from workbench.model.tolerances import LOAD_SLACK, MEMORY_SLACK, STAGE_BOUND_PRECISION, START_PERIOD, ceil_counts
from workbench.planners.ilp.bounds import chain_arrays

__all__ = ["stage_path_bound", "least_stage_memory"]

GRID = 256  # transfer sums in the fronts are rounded down to multiples of T / GRID


def least_stage_memory(chain: Chain, platform: Platform, T: float) -> float:
    """The least total memory of any stage partition valid at period T (inf if none), as
    described in the module docstring (a relaxation: devices pooled)."""
    return _stage_memory(chain, platform)(T)


def _stage_memory(chain: Chain, platform: Platform, deadline=None):
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
    M = platform.memory
    tol = 1 + LOAD_SLACK   # times against T, and bytes against M (MEMORY_SLACK: the same)

    def least(T: float) -> float:
        step = T / GRID
        # fronts[i]: (C, mem) pairs, C ascending and mem strictly decreasing, for the stages
        # covering layers i..L-1 (C: twice the transfers of the cuts from i - 1's stage end on)
        fronts: list[tuple[np.ndarray, np.ndarray] | None] = [None] * (L + 1)
        fronts[L] = (np.zeros(1), np.zeros(1))
        for i in range(L - 1, -1, -1):
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError("stage path bound: time limit")
            Cs, mems = [], []
            for j in range(i, L):
                if pre[j + 1] - pre[i] > T * tol:
                    break
                if j < L - 1 and c[j] > T * tol:
                    continue
                nxt = fronts[j + 1]
                if nxt is None:
                    continue
                C = nxt[0] + c2[j]
                k = ceil_counts((down[i] + C) / T)
                smem = (k * (apre[j + 1] - apre[i] + head[i] + tail[j]) + (wpre[j + 1] - wpre[i])
                        + lin.buf_head[i] + lin.buf_tail[j])
                ok = smem <= M * tol
                if ok.any():
                    Cs.append(C[ok])
                    mems.append(nxt[1][ok] + smem[ok])
            if not Cs:
                continue
            C = np.floor(np.concatenate(Cs) / step) * step
            mem = np.concatenate(mems)
            order = np.lexsort((mem, C))
            C, mem = C[order], mem[order]
            keep = mem < np.minimum.accumulate(np.concatenate([[math.inf], mem[:-1]]))
            fronts[i] = (C[keep], mem[keep])
        return float(fronts[0][1].min()) if fronts[0] is not None else math.inf

    return least


def stage_path_bound(chain: Chain, platform: Platform, hi: float | None = None, *, rel: float = STAGE_BOUND_PRECISION,
                     deadline=None) -> float:
    """The least period (to relative precision ``rel``, rounded down) at which some stage
    partition fits the pooled memory of the devices; at least :func:`workbench.model.plan.lower_bound`.
    ``hi``: a period known to be feasible (e.g. a plan's), which caps the search. Past
    ``deadline`` (a ``perf_counter`` time, polled once per layer and step) it returns the
    largest period known not to fit so far: still a lower bound, less tight."""
    lb = lower_bound(chain, platform)
    if not math.isfinite(platform.memory):
        return lb
    state = {"lo": lb}
    try:
        return _bisect(chain, platform, lb, hi, rel, deadline, state)
    except TimeoutError:
        return state["lo"]


def _bisect(chain: Chain, platform: Platform, lb: float, hi: float | None, rel: float, deadline, state: dict) -> float:
    """stage_path_bound's search; ``state["lo"]`` always holds a period known not to fit (or ``lb``)."""
    cap = platform.devices * platform.memory * (1 + MEMORY_SLACK)
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
