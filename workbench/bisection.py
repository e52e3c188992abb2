"""The three searches for a least value that the planners share.

* :func:`bisect` halves a bracket ``[lo, hi]`` of a monotone predicate (false
  at ``lo``, true at ``hi``) until it is within a relative precision; it works
  on floats and, element-wise, on numpy arrays of brackets.
* :func:`least_feasible` is for a *probe* that, at a period T, returns a
  structure valid at T (a partition, an allocation's orders) or None, where
  feasibility is monotone in T, and an *exact* re-timing giving the least
  period of a structure (<= the T it was found at). Steps alternate a probe
  just below the incumbent (infeasible there: the incumbent is optimal up to
  the precision) and bisection; every structure found lowers the incumbent
  to its own exact period, so the result is a period actually reached.
* :func:`least_bottleneck` is the exact version for a probe ``find(V)`` that
  returns a structure whose value (a bottleneck over a finite set) is at most
  V, or None: the least value is one of finitely many floats, so a probe at
  the float just below the incumbent settles it.

>>> bisect(0.0, 8.0, lambda T: T >= 3.0, rel=1e-3)[1] >= 3.0
True
>>> least_feasible(1.0, 100.0, lambda T: "x" if T >= 3.0 else None, lambda s: 3.0)
Found(period=3.0, structure='x', lower=2.999999997, complete=True)
>>> least_bottleneck("all", 9.0, lambda V: "x" if V >= 4.0 else None, lambda s: 4.0)
(4.0, 'x')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from workbench.model.tolerances import PERIOD_SEARCH

__all__ = ["bisect", "least_feasible", "least_bottleneck", "Found"]

Bound = TypeVar("Bound", float, np.ndarray)


def bisect(lo: Bound, hi: Bound, fits: Callable[[Bound], Any], *, rel: float,
           max_steps: int | None = None) -> tuple[Bound, Bound]:
    """The bracket ``(lo, hi)`` after halving it at ``(lo + hi) / 2`` until ``hi - lo <= rel * hi``
    (every element, for arrays) or ``max_steps`` halvings; ``fits(mid)`` (a bool, or a bool array)
    says which end moves. ``fits`` must be false at ``lo`` and true at ``hi``.

    >>> bisect(0.0, 1.0, lambda T: T >= 0.3, rel=0.01)
    (0.298828125, 0.30078125)
    >>> lo, hi = bisect(np.zeros(2), np.ones(2), lambda T: T >= np.array([0.25, 0.5]), rel=0.1)
    >>> hi.tolist()
    [0.25, 0.5]
    """
    scalar = not isinstance(lo, np.ndarray)
    steps = 0
    while (hi - lo > rel * hi) if scalar else bool(np.any(hi - lo > rel * hi)):
        if max_steps is not None and steps >= max_steps:
            break
        mid = (lo + hi) / 2
        ok = fits(mid)
        if scalar:
            if ok:
                hi = mid
            else:
                lo = mid
        else:
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
        steps += 1
    return lo, hi


@dataclass(frozen=True)
class Found:
    """What :func:`least_feasible` found: the least ``period`` reached and its ``structure``;
    ``lower``, a period proven infeasible (or the starting lower bound); ``complete``: the bracket
    closed (``period`` is optimal up to the search's precision), False when stopped early."""

    period: float
    structure: Any
    lower: float
    complete: bool


def least_feasible(t0: float, hi: float, probe: Callable[[float], Any], exact: Callable[[Any], float], *,
                   rel: float = PERIOD_SEARCH, stop: Callable[[float, float], bool] | None = None,
                   steps: Sequence[float] = (), start: tuple[Any, float] | None = None) -> Found | None:
    """The least period at which ``probe`` finds a structure, searched from ``t0`` (a lower bound) with
    ``hi`` (a period every feasible instance meets); None when the probe finds nothing at ``hi``.

    ``probe(T)`` is a structure valid at T or None, monotone in T; ``exact(structure)`` is that
    structure's own least period (<= the probe's T). ``steps``: increasing periods between ``t0`` and
    ``hi`` to probe, in order, before ``hi`` (when probes far above the optimum cost more: the first
    feasible one starts the bisection). ``start``: a structure known already and its exact period (the probe
    at ``hi`` is then not needed). ``stop(lo, hi)``, asked after every probe, ends the search early
    (``complete=False``); so does a ``TimeoutError`` from ``probe`` once a structure is known (before
    that it propagates).

    >>> least_feasible(1.0, 100.0, lambda T: "x" if T >= 3.0 else None, lambda s: 3.0).period
    3.0
    """
    known = start[0] if start is not None else None
    if known is not None:
        hi = min(hi, start[1])
    lo, best = t0, None
    try:
        first = probe(t0)
        if first is not None:
            return Found(t0, first, t0, True)
        for T in steps:
            if not lo < T < hi:
                continue
            best = probe(T)
            if best is not None:
                break
            lo = T
    except TimeoutError:
        if known is None:
            raise
        return Found(hi, known, lo, False)
    if best is None and known is not None:
        best = known
    elif best is None:
        best = probe(hi)
    if best is None:
        return None
    hi = min(hi, exact(best))
    # Invariant: infeasible at lo, feasible (exactly, via ``exact``) at hi. Steps alternate:
    # a *descent* probe just below hi (infeasible there: hi is the optimum up to rel; else the
    # new structure's exact period lowers hi), and a bisection probe (keeps the count logarithmic).
    descent = True
    while hi - lo > rel * hi:
        if stop is not None and stop(lo, hi):
            return Found(hi, best, lo, False)
        if descent:
            mid = hi * (1 - rel)
        else:
            mid = math.sqrt(lo * hi) if lo > 0 and hi / lo > 4 else 0.5 * (lo + hi)
        descent = not descent
        try:
            res = probe(mid)
        except TimeoutError:
            return Found(hi, best, lo, False)
        if res is None:
            lo = mid
        else:
            # the structure found at mid is valid at its own exact least period <= mid
            period = exact(res)
            if period >= hi:        # cannot happen beyond rounding; keep the search finite
                break
            hi, best = period, res
    return Found(hi, best, lo, True)


Structure = TypeVar("Structure")


def least_bottleneck(start: Structure, value: float, find: Callable[[float], Structure | None],
                     value_of: Callable[[Structure], float]) -> tuple[float, Structure]:
    """The least value of a structure and one reaching it, exactly: from ``start`` (of ``value``),
    probes alternate the float just below the incumbent's value (nothing there: the incumbent is
    optimal) and the middle of the bracket (nothing there: it is a lower end). ``find(V)`` is a
    structure of value at most V or None (monotone in V); ``value_of`` a structure's own value.

    >>> least_bottleneck([9], 9.0, lambda V: [int(V)] if V >= 3 else None, lambda s: float(s[0]))
    (3.0, [3])
    """
    best, hi, lo, descent = start, value, 0.0, True
    while True:
        V = float(np.nextafter(hi, -math.inf)) if descent else 0.5 * (lo + hi)
        found = find(V) if (descent or V > lo) else None
        if found is None:
            if descent:
                return hi, best
            lo = V
        else:
            best, hi = found, value_of(found)
        descent = not descent
