"""Bounds for the plan ILP and the searches around it: per-layer terms, in-flight caps, memory bounds.

Every bound here holds for every plan, contiguous or general: the MILP
(:mod:`workbench.planners.ilp.model`) uses them for its big-M values and its
period range, the phases of :mod:`workbench.planners.ilp.phases` to refuse
hopeless instances before building a model, the cover search and the
stage-path bound for their per-layer arrays.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 10, 4) for i in range(2)))
>>> least_memory_bound(ch, Target.of(2, memory_model="paper"))[0]      # one layer: 4 saved + 10 stashed + 10
14.0
"""

from __future__ import annotations

import math

import numpy as np

from workbench.bisection import bisect
from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.plan import lower_bound
from workbench.model.target import Target
from workbench.model.tolerances import BOUND_SEARCH, COUNT_SLACK, MEMORY_SLACK

__all__ = ["memory_terms", "chain_arrays", "k_bounds", "memory_period_bound", "least_memory_bound"]


def memory_terms(chain: Chain, platform: Target) -> tuple[np.ndarray, np.ndarray]:
    """Per layer ``(a, w0)``: a stage holding k mini-batches needs ``sum_l k a_l + w0_l`` bytes
    plus its boundary terms and its device's extra (:func:`workbench.model.memory_bands.linear_terms`;
    paper model: ``a = saved + [stash] W``, ``w0 = (phi - [stash]) W``).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain((Layer("l", 1.0, 1.0, weight_bytes=10, saved_bytes=4),))
    >>> [float(v[0]) for v in memory_terms(ch, Target.of(1, weights="stash", memory_model="paper"))]   # a = 4 + 10
    [14.0, 0.0]
    >>> [float(v[0]) for v in memory_terms(ch, Target.of(1, weights="single", memory_model="paper"))]  # a = 4, w0 = 10
    [4.0, 10.0]
    """
    lin = linear_terms(layer_terms(chain, platform))
    return np.asarray(lin.a, dtype=float), np.asarray(lin.w0, dtype=float)


def chain_arrays(chain: Chain, platform: Target) -> tuple[np.ndarray, ...]:
    """Per layer ``(comp, down, c, a, w0)``: its compute F + B, the compute from it to the end
    of the chain and back, the transfer time of the cut after it (0 after the last), and its
    rule-7 terms (:func:`memory_terms`).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain((Layer("x", 1.0, 2.0, 0, 4), Layer("y", 1.0, 1.0, 0, 0)))
    >>> [v.tolist() for v in chain_arrays(ch, Target.of(2, bandwidth=2.0, memory_model="paper"))[:3]]
    [[3.0, 2.0], [5.0, 2.0], [2.0, 0.0]]
    """
    L = len(chain)
    comp = np.asarray(chain.forward + chain.backward, dtype=float)
    down = np.cumsum(comp[::-1])[::-1]
    c = np.array([platform.comm_time(chain.cut(l)) if l < L - 1 else 0.0 for l in range(L)])
    a, w0 = memory_terms(chain, platform)
    return comp, down, c, a, w0


def k_bounds(chain: Chain, platform: Target, t_ub: float | None = None,
             terms: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Upper bounds on every layer's in-flight count.

    From the waits being shorter than a period: a window spans at most
    ``ceil(total time / T_lb) + 2 (#cuts) + 1`` periods; and from memory: one
    layer's share of its stage's memory already fits in M (``terms``: per-layer ``(a, w0)``, by
    default :func:`memory_terms`; with activation policies, the least any policy gives).
    """
    L = len(chain)
    lb = lower_bound(chain, platform)
    comm = sum(platform.comm_time(chain.cut(l)) for l in range(L - 1))
    total = chain.total_compute + 2 * comm
    struct = math.ceil(total / lb + COUNT_SLACK) + 2 * min(L - 1, 2 * platform.devices) + 2
    km = np.full(L, float(struct))
    M = platform.memory_limit
    if math.isfinite(M):
        a, w0 = terms if terms is not None else memory_terms(chain, platform)
        for l in range(L):
            if a[l] > 0:
                km[l] = min(km[l], math.floor((M - w0[l]) / a[l] * (1 + MEMORY_SLACK)))
    return np.maximum(km, 1.0)


def memory_period_bound(chain: Chain, platform: Target, terms: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """The least T with ``sum_l (ceil(D_l / T) (A_l + [stash] W_l) + (phi - [stash]) W_l) <= P M``.

    ``D_l`` is the compute from layer l to the end of the chain and back: layer l's stage
    holds ``k >= D_l / T`` mini-batches whatever the allocation, so every layer costs
    at least that much memory, and all devices together hold P M. A lower bound on the
    period of any plan, contiguous or general (0 without a memory limit). Also at least
    ``max_l D_l / kmax_l``, with ``kmax_l`` the most copies of layer l alone a device holds.
    """
    M = platform.memory_limit
    if not math.isfinite(M):
        return 0.0
    a, w0 = terms if terms is not None else memory_terms(chain, platform)
    down = np.cumsum((chain.forward + chain.backward)[::-1])[::-1]
    cap = platform.devices * M

    def need(T: float) -> float:
        return float(np.sum(np.maximum(1.0, np.ceil(down / T - COUNT_SLACK)) * a + w0))

    hi = float(down[0]) * (1 + COUNT_SLACK)  # every k = 1
    if need(hi) > cap * (1 + MEMORY_SLACK):
        return math.inf
    # one layer alone: k_l <= (M - w0_l) / a_l on its device, so T >= D_l / k_l
    single = 0.0
    for l in range(len(chain)):
        if a[l] > 0:
            kmax = math.floor((M - w0[l]) / a[l] * (1 + BOUND_SEARCH))
            if kmax < 1:
                return math.inf
            single = max(single, float(down[l]) / kmax)
    # need() is a step function of T: bisect to relative precision (lo: the period known not to fit)
    lo, _ = bisect(0.0, hi, lambda T: need(T) <= cap * (1 + BOUND_SEARCH), rel=BOUND_SEARCH, max_steps=200)
    return max(lo, single)


def least_memory_bound(chain: Chain, platform: Target) -> tuple[float, str]:
    """A lower bound on the memory per device any allocation needs (every k = 1), and why."""
    lin = linear_terms(layer_terms(chain, platform))
    foot = lin.a + lin.w0                      # each layer with one mini-batch in flight, no boundary terms
    big = int(np.argmax(foot))
    per_layer = float(foot[big])
    avg = float(foot.sum() / platform.devices)
    why = (f"layer {chain[big].name!r} alone needs {per_layer:.6g} bytes (one mini-batch in flight); "
           f"all layers together need {foot.sum():.6g} bytes, {avg:.6g} per device")
    return max(per_layer, avg), why
