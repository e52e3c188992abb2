"""The general schedule builder with offloaded activations: host-link transfers placed with the
operations (docs/model.md, "Activation policies", rule 8).

:class:`workbench.schedules.builder.Scheduler` builds general allocations by placing each operation, in
the order of one mini-batch's dependency chain, at the earliest time its device is free modulo
T (``asap``). With offloaded activations a forward also needs its transfer out free on the
device's host link right after it, and a backward its transfer back right before it and a gap
of at least the round trip after its stage's own forward. Each constraint maps a candidate start
to the earliest one it accepts; :func:`settle` applies them in turn until none moves it.

>>> settle(10.0, 1.0, [lambda t: max(t, 3.0), lambda t: t if t >= 4.0 else 4.0])
4.0
"""

from __future__ import annotations

import math
from typing import Sequence

from workbench.model.tolerances import SLOT_FIT
from workbench.model.units import format_seconds

__all__ = ["NoSchedule", "earliest", "settle", "general_offload"]


class NoSchedule(ValueError):
    """No schedule was found for this allocation and period; the message says why (raised by the
    builders of :mod:`workbench.schedules.builder`, which exports it)."""


def earliest(arcs: list[tuple[float, float]], r: float, d: float, T: float) -> float | None:
    """Earliest t >= r with [t, t+d) disjoint modulo T from the arcs (start mod T, length); None when no gap
    of the period holds d.

    >>> earliest([(0.0, 2.0), (5.0, 1.0)], 1.0, 2.0, 10.0), earliest([(0.0, 9.5)], 0.0, 1.0, 10.0)
    (2.0, None)
    """
    if d <= 0 or not arcs:
        return r
    eps = SLOT_FIT * T
    arcs = sorted(arcs)
    best: float | None = None
    n = len(arcs)
    for i in range(n):
        gs = arcs[i][0] + arcs[i][1]
        ge = arcs[i + 1][0] if i + 1 < n else arcs[0][0] + T
        hi = ge - d
        if hi < gs - eps:
            continue
        j = math.ceil((r - hi - eps) / T)
        t = max(r, gs + j * T)
        if best is None or t < best:
            best = t
    return best


def settle(T: float, r: float, moves) -> float | None:
    """The least t >= r that every move leaves in place (each maps t to the earliest t' >= t that
    satisfies one constraint, or None); None when they do not settle within a few periods."""
    t = r
    for _ in range(64):
        t0 = t
        for move in moves:
            t = move(t)
            if t is None or t > r + 4 * T * len(moves):
                return None
        if t <= t0 + SLOT_FIT * T:
            return t0
    return None


def general_offload(F: Sequence[float], B: Sequence[float], c: Sequence[float], dev: Sequence[int],
                    x: Sequence[float], T: float) -> tuple[list[float], list[float]]:
    """``asap`` with offloaded activations: each forward also needs its transfer out free on the host
    link right after it, each backward its transfer back right before it and a gap of at least the
    round trip after its own forward (rule 8). Per stage: forward and backward seconds ``F``, ``B``, the
    transfer ``c`` to the next stage, its device and ``x``, the seconds of its offloaded bytes each way."""
    S = len(F)
    eps = SLOT_FIT * T
    arcs: dict[int, list[tuple[float, float]]] = {p: [] for p in set(dev)}
    link: dict[int, list[tuple[float, float]]] = {p: [] for p in set(dev)}
    f = [0.0] * S
    b = [0.0] * S

    def compute(p: int, d: float):
        return lambda t: earliest(arcs[p], t, d, T)

    def host(p: int, offset: float, d: float):
        def move(t: float) -> float | None:
            if d <= 0:
                return t
            u = earliest(link[p], t + offset, d, T)
            return None if u is None else u - offset
        return move

    def gap(s: int):
        def move(t: float) -> float:
            g = (t - f[s] - F[s]) % T
            return t if g >= 2 * x[s] - eps or g > T - eps else t + 2 * x[s] - g
        return move

    def place(s: int, r: float, length: float, offset: float, what: str, moves) -> float:
        """The earliest start >= r every move accepts; books the operation and its transfer (at t + offset)."""
        t = settle(T, r, moves)
        if t is None:
            raise NoSchedule(f"no free slot on device {dev[s]} (or its host link) for the {what} of stage {s} "
                             f"in the period {format_seconds(T)}")
        if length > 0:
            arcs[dev[s]].append((t % T, length))
        if x[s] > 0:
            link[dev[s]].append(((t + offset) % T, x[s]))
        return t

    r = 0.0
    for s in range(S):
        f[s] = place(s, r, F[s], F[s], "forward", [compute(dev[s], F[s]), host(dev[s], F[s], x[s])])
        r = f[s] + F[s] + c[s]
    r = f[S - 1] + F[S - 1]
    for s in range(S - 1, -1, -1):
        b[s] = place(s, r, B[s], -x[s], "backward", [compute(dev[s], B[s]), gap(s), host(dev[s], -x[s], x[s])])
        if s > 0:
            r = b[s] + B[s] + c[s - 1]
    return f, b
