"""Balance heuristics that ignore memory: ``uniform``, ``parameters``, ``torchgpipe``.

Each picks a contiguous partition by its own criterion, then puts the
periodic schedule on top (:func:`schedule_on_top`: ``best_schedule`` from
:mod:`workbench.schedules.builder`, the least period whose schedule fits memory).

**When the partition does not fit in memory** at any period, the plan is
still returned: the schedule at the least period with memory ignored,
status ``"feasible"``, ``plan.fits`` False and a note
``"does not fit: needs X, limit Y (over by Z)"`` (X is the peak of that
plan; the note also gives the least this partition needs, one mini-batch
in flight per stage). A benchmark can then report by how much a baseline
misses the limit.

* ``uniform``: equal layer counts (sizes differ by at most one), as
  DeepSpeed's ``partition_method="uniform"``.
* ``parameters``: balance parameter bytes, as DeepSpeed's
  ``partition_method="parameters"``: the least possible heaviest part
  (DeepSpeed finds it by bisection; here exactly, by
  :func:`~workbench.planners.partition.bottleneck_partition`), then parts packed
  greedily from the left up to that bound.
* ``torchgpipe``: torchgpipe's balance by time, the block-partition
  heuristic of Bárány and Grinberg ("Block partitions of sequences",
  arXiv:1308.2452) on per-layer forward+backward times.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1 + 10 * (i == 0), 1) for i in range(4)))
>>> plan_uniform(ch, Target.of(2, memory_model="paper")).assignment
(0, 0, 1, 1)
>>> plan_parameters(ch, Target.of(2, memory_model="paper")).assignment
(0, 1, 1, 1)
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from workbench.model.chain import Chain
from workbench.model.memory import device_memory, layer_terms
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.tolerances import LAST_BITS, TIE
from workbench.model.units import format_bytes
from workbench.planners.partition import bottleneck_partition, bounds_to_assignment
from workbench.schedules.builder import best_schedule

__all__ = [
    "plan_uniform", "plan_parameters", "plan_torchgpipe", "schedule_on_top",
    "uniform_partition", "parameters_partition", "block_partition",
]


# ----------------------------------------------------------------------------
# the schedule on top, and the "does not fit" report
# ----------------------------------------------------------------------------
def _best_schedule(chain: Chain, platform: Target, bounds: Sequence[tuple[int, int]], method: str) -> Plan:
    """The least-period schedule of the partition ``bounds`` that fits in memory (or why none does)."""
    return best_schedule(chain, platform, bounds_to_assignment(bounds), method=method)


def schedule_on_top(chain: Chain, platform: Target, bounds: Sequence[tuple[int, int]], method: str, *,
                    notes: Sequence[str] = (), t_start: float | None = None) -> Plan:
    """The least-period schedule of a contiguous partition; if it cannot fit, the memory-blind one.

    The fallback plan keeps ``memory_limit`` = the platform's, so ``plan.fits``
    is False, and says by how much it is over.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 100, 1) for i in range(2)))
    >>> p = schedule_on_top(ch, Target.of(2, memory=50, memory_model="paper"), [(0, 0), (1, 1)], "x")
    >>> p.fits, p.notes[-1].startswith("does not fit")
    (False, True)
    """
    t0 = time.perf_counter() if t_start is None else t_start
    bounds = [tuple(b) for b in bounds]
    plan = _best_schedule(chain, platform, bounds, method)
    if not plan.feasible:
        free = platform.with_(memory=math.inf)
        plan = _best_schedule(chain, free, bounds, method)
        if not plan.feasible:          # only without a finite period (cannot happen for compute >= 0)
            return plan.with_(notes=tuple(notes) + plan.notes, solve_seconds=time.perf_counter() - t0)
        need = plan.peak_memory
        one = _k1_peak(chain, platform, bounds)
        over = need - platform.memory_limit
        plan = plan.with_(memory_limit=platform.memory_limit, notes=tuple(notes) + (
            f"does not fit: needs {format_bytes(need)}, limit {format_bytes(platform.memory_limit)} "
            f"(over by {format_bytes(over)}); this partition needs at least {format_bytes(one)} "
            f"even with one mini-batch in flight per stage",))
    else:
        plan = plan.with_(notes=tuple(notes) + tuple(plan.notes))
    return plan.with_(method=method, status="feasible", solve_seconds=time.perf_counter() - t0)


def _k1_peak(chain: Chain, platform: Target, bounds: Sequence[tuple[int, int]]) -> float:
    """The largest device memory of a contiguous partition with one mini-batch in flight per stage."""
    terms = layer_terms(chain, platform)
    return max(device_memory(terms, [(a, b, 1)]) for a, b in bounds)


# ----------------------------------------------------------------------------
# partitions
# ----------------------------------------------------------------------------
def uniform_partition(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` items in ``min(n, parts)`` runs whose sizes differ by at most one (larger first).

    >>> uniform_partition(7, 3)
    [(0, 2), (3, 4), (5, 6)]
    """
    k = min(n, parts)
    q, r = divmod(n, k)
    out, start = [], 0
    for s in range(k):
        size = q + (s < r)
        out.append((start, start + size - 1))
        start += size
    return out


def parameters_partition(weights: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """DeepSpeed-style parameter balance: least heaviest part, then left-greedy packing.

    Empty parts are dropped (fewer stages than devices).

    >>> parameters_partition([5, 1, 1, 1, 1, 1], 2)
    [(0, 0), (1, 5)]
    """
    w = np.asarray(weights, dtype=float)
    n = len(w)
    pre = np.concatenate([[0.0], np.cumsum(w)])
    cost = pre[1:][None, :] - pre[:-1][:, None]
    bound, _ = bottleneck_partition(cost, parts)
    tol = bound * TIE
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:
        # furthest end with sum(start..end) <= bound, leaving enough parts for the rest is not
        # needed: the bound is feasible, so greedy-furthest covers the chain in <= parts runs.
        end = int(np.searchsorted(pre, pre[start] + bound + tol, side="right")) - 2
        end = max(end, start)
        out.append((start, end))
        start = end + 1
    return out


def block_partition(costs: Sequence[float], parts: int, *, max_moves: int | None = None) -> list[tuple[int, int]]:
    """Bárány-Grinberg block partition (the heuristic behind torchgpipe's balance by time).

    Costs are normalised to [0, 1] ((x - min) / (max - min)). Start from
    equal-count blocks; repeat: take a heaviest block B_p; while the heaviest
    weight M exceeds the lightest m by more than 1 (the largest normalised
    item), take the lightest block B_q closest to p and move one item into
    it from its neighbour B_h on the side of B_p (the last item of B_{q-1}
    if p < q, the first of B_{q+1} if q < p); when h = p, re-pick the
    heaviest block. It ends with M <= m + max item, a guarantee of the paper.

    >>> block_partition([1, 1, 1, 1, 8, 1, 1, 1], 2)
    [(0, 3), (4, 7)]
    >>> block_partition([9, 1, 1, 1, 1, 1], 2)   # normalised [1, 0, ...]: already within M <= m + 1
    [(0, 2), (3, 5)]
    """
    n = len(costs)
    k = min(n, parts)
    x = np.asarray(costs, dtype=float)
    span = x.max() - x.min()
    x = (x - x.min()) / span if span > 0 else np.zeros(n)
    pre = np.concatenate([[0.0], np.cumsum(x)])
    # ends[b] = one past the last item of block b; equal-count start as torchgpipe does
    ends = [n // k * (b + 1) for b in range(k - 1)] + [n]

    def size(b: int) -> float:
        return float(pre[ends[b]] - pre[ends[b - 1] if b > 0 else 0])

    limit = max_moves if max_moves is not None else 4 * n * n * k + 100
    moves = 0
    while moves < limit:
        sizes = [size(b) for b in range(k)]
        p = int(np.argmax(sizes))
        big = sizes[p]
        while moves < limit:
            sizes = [size(b) for b in range(k)]
            small = min(sizes)
            if big <= small + 1 + TIE:
                return _blocks(ends)
            # the lightest block closest to p
            q = min((b for b in range(k) if sizes[b] <= small + LAST_BITS), key=lambda b: (abs(b - p), b))
            if p < q:
                h = q - 1
                ends[h] -= 1          # last item of B_{q-1} moves into B_q
            else:
                h = q + 1
                ends[q] += 1          # first item of B_{q+1} moves into B_q
            moves += 1
            if h == p:
                break
            big = size(p)
    return _blocks(ends)


def _blocks(ends: list[int]) -> list[tuple[int, int]]:
    """Block ends -> (first, last) runs, empty blocks dropped."""
    starts = [0] + ends[:-1]
    return [(a, b - 1) for a, b in zip(starts, ends) if b > a]


# ----------------------------------------------------------------------------
# planners
# ----------------------------------------------------------------------------
def _general_note(allocation: str) -> list[str]:
    return ["contiguous heuristic: allocation 'general' ignored"] if allocation == "general" else []


def plan_uniform(chain: Chain, platform: Target, *, allocation: str = "contiguous",
                 time_limit: float | None = None, **options: Any) -> Plan:
    """Equal layer counts per device, then the periodic schedule (see the module docstring)."""
    t0 = time.perf_counter()
    bounds = uniform_partition(len(chain), platform.devices)
    return schedule_on_top(chain, platform, bounds, "uniform", notes=_general_note(allocation), t_start=t0)


def plan_parameters(chain: Chain, platform: Target, *, allocation: str = "contiguous",
                    time_limit: float | None = None, **options: Any) -> Plan:
    """Balance parameter bytes (DeepSpeed ``parameters``), then the periodic schedule.

    Chains without parameters fall back to equal layer counts (noted).
    """
    t0 = time.perf_counter()
    notes = _general_note(allocation)
    if float(chain.weights.sum()) <= 0:
        notes.append("no parameters to balance: equal layer counts")
        bounds = uniform_partition(len(chain), platform.devices)
    else:
        bounds = parameters_partition(chain.weights, platform.devices)
    return schedule_on_top(chain, platform, bounds, "parameters", notes=notes, t_start=t0)


def plan_torchgpipe(chain: Chain, platform: Target, *, allocation: str = "contiguous",
                    time_limit: float | None = None, **options: Any) -> Plan:
    """torchgpipe's balance by time (block partition of forward+backward times), then the schedule."""
    t0 = time.perf_counter()
    bounds = block_partition(chain.forward + chain.backward, platform.devices)
    return schedule_on_top(chain, platform, bounds, "torchgpipe", notes=_general_note(allocation), t_start=t0)
