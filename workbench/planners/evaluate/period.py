"""The per-allocation evaluator the planners use: the exact least period of one allocation.

Brute force scores every allocation with it, the ILP's local, guided and
cover searches the allocations they visit. Contiguous allocations (one
stage per device) have a closed form
(:func:`workbench.planners.evaluate.allocation.contiguous_period`); general ones a
certified search over orders modulo T (:mod:`workbench.planners.evaluate.orders`).
:func:`path_period` is the cheap lower bound the guided search walks on.

The tests check these against an exhaustive oracle of their own
(``tests/oracle.py``), which shares no code with this package but the model
types and the checker.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
>>> allocation_period(chain, Target.of(2), (0, 0, 1))[0], allocation_period(chain, Target.of(2), (0, 1, 0))[0]
(6.0, 6.0)
>>> allocation_best(chain, Target.of(2), (0, 1, 0), upper=6.0) is None      # not below 6
True
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from workbench.bisection import bisect
from workbench.model.chain import Chain
from workbench.model.target import Target
from workbench.model.tolerances import PERIOD_SEARCH
from workbench.planners.budget import charge
from workbench.planners.evaluate.allocation import (
    Allocation,
    allocation_of,
    contiguous_period,
    contiguous_schedule,
    paths_fit,
)
from workbench.planners.evaluate.orders import general_period

__all__ = ["allocation_period", "allocation_best", "path_period", "normalise"]


def normalise(assignment: Sequence[int]) -> tuple[int, ...]:
    """Relabel devices in first-use order (identical devices).

    >>> normalise((2, 2, 0, 1, 0))
    (0, 0, 1, 2, 1)
    """
    m: dict[int, int] = {}
    out = []
    for a in assignment:
        d = m.get(a)
        if d is None:
            d = m[a] = len(m)
        out.append(d)
    return tuple(out)


def allocation_period(chain: Chain, platform: Target, assignment: Sequence[int], *,
                      exact_general: bool = False) -> tuple[float, list[float], list[float]] | None:
    """Least period of one allocation and stage start times reaching it, or None if nothing fits.

    Contiguous-style allocations (one stage per device) use the closed form
    unless ``exact_general``, which forces the general search (tests compare
    the two).
    """
    al = allocation_of(chain, platform, assignment)
    if al.contiguous and not exact_general:
        return _contiguous(al, platform)
    return general_period(al, platform, math.inf)


def _contiguous(al: Allocation, platform: Target) -> tuple[float, list[float], list[float]] | None:
    """The closed form of a contiguous-style allocation: its least period and start times, or None."""
    r = contiguous_period(al, platform)
    if r is None:
        return None
    T, ks = r
    f, b = contiguous_schedule(al, T, ks)
    return T, f, b


def allocation_best(chain: Chain, platform: Target, assignment: Sequence[int], upper: float = math.inf,
                    deadline: Any = None) -> tuple[float, list[float], list[float]] | None:
    """Least period of ``assignment`` if below ``upper``: (T, fwd starts, bwd starts) per stage, else None.
    ``deadline``: a ``perf_counter`` time or a :class:`~workbench.planners.budget.WorkDeadline` (charged
    for the evaluation); past it the general search raises ``TimeoutError``."""
    charge(deadline)
    al = allocation_of(chain, platform, assignment)
    if al.contiguous:
        r = _contiguous(al, platform)
        return r if (r is not None and r[0] < upper) else None
    return general_period(al, platform, upper, deadline)


def path_period(chain: Chain, platform: Target, assignment: Sequence[int], upper: float = math.inf) -> float:
    """The least period of ``assignment`` if no stage ever waited: every device load, link load and
    operation fits T, and every device fits its stages with ``k_s = ceil(path_s / T)`` in flight
    (``path_s``: the stage's compute to the end of the chain and back, plus both transfers of
    every cut from it on). A lower bound on the exact period (:func:`allocation_best`), equal to it
    when the stages' operations interleave on their devices without waits; ``inf`` when it is not
    below ``upper`` (nothing fits at ``upper``) or nothing fits at all. It costs one pass over the
    stages per bisection step (about 0.1 ms on resnet50's 177 layers against 1-100 ms for the exact
    period).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0, saved_bytes=10) for i in range(4)), input_bytes=0)
    >>> # loads 4 and 4; device 0 holds k = 2
    >>> path_period(ch, Target.of(2, memory=50, memory_model="paper"), (0, 0, 1, 1))
    4.0
    """
    al = allocation_of(chain, platform, assignment)
    lo = al.static_lb
    if not lo < upper:
        return math.inf
    if paths_fit(al, platform, lo):
        return lo
    hi = min(upper, max(lo, al.total_path))   # at T >= every path each k is 1
    if not paths_fit(al, platform, hi):
        return math.inf
    return bisect(lo, hi, lambda T: paths_fit(al, platform, T), rel=PERIOD_SEARCH)[1]
