"""Brute force: the exact optimal periodic plan of a tiny instance (method ``brute``).

The exact optimum of a small instance: it enumerates *every* allocation and,
for each, finds the exact smallest period of a valid periodic schedule
(docs/model.md, "Plan", rules 1-8). Nothing here is a heuristic; every
pruning step is a proven bound. (The tests check it, and the other planners,
against an oracle of their own, ``tests/oracle.py``.)

Allocations
    contiguous: one interval of layers per device; identical devices make the
    labels irrelevant, so these are the compositions of the chain into at most
    P parts (labelled 0, 1, ... in chain order).
    general: every map layer -> device up to relabelling of the devices, i.e.
    the set partitions of the layers into at most P blocks (restricted growth
    strings). Stages are the maximal runs (:func:`workbench.model.plan.stages_of`).

Each allocation is scored by the per-allocation evaluator
(:mod:`workbench.planners.evaluate.period`): a closed form for contiguous ones, a
certified search over orders modulo T for general ones, so every period is
T* <= T <= T* (1 + 1e-9), T* the allocation's optimum. The contiguous
optimum is the first incumbent; general allocations are visited in order of
a lower bound (loads, links, memory) and skipped when the bound reaches the
incumbent.

Sizes: contiguous up to ~10 layers x 4 devices in well under a second;
general up to 8 layers x 3 devices in about a second or less on average.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
>>> plan_brute(chain, Target.of(3, memory_model="paper")).period
3.0
>>> plan_brute(chain, Target.of(2, memory_model="paper"), allocation="general").period
6.0
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Iterator

from workbench.model.activations import POLICIES, apply_policies, is_keep
from workbench.model.chain import Chain
from workbench.model.plan import Plan, infeasible_plan, lower_bound, make_plan
from workbench.model.target import Target
from workbench.model.tolerances import PERIOD_SEARCH, TIE
from workbench.planners.evaluate.allocation import allocation_of, contiguous_period, contiguous_schedule, memory_floor
from workbench.planners.evaluate.orders import general_period
from workbench.planners.fixed_policies import plan_with_policies

__all__ = ["plan_brute", "contiguous_allocations", "general_allocations", "clear_cache"]

# ----------------------------------------------------------------------------
# allocations
# ----------------------------------------------------------------------------
def contiguous_allocations(n_layers: int, devices: int) -> Iterator[tuple[int, ...]]:
    """Every composition of the chain into at most ``devices`` parts, devices 0, 1, ... in chain order.

    >>> list(contiguous_allocations(3, 2))
    [(0, 0, 0), (0, 1, 1), (0, 0, 1)]
    """
    for parts in range(1, min(devices, n_layers) + 1):
        for cuts in itertools.combinations(range(1, n_layers), parts - 1):
            bounds = (0,) + cuts + (n_layers,)
            yield tuple(p for p in range(parts) for _ in range(bounds[p + 1] - bounds[p]))


def general_allocations(n_layers: int, devices: int) -> Iterator[tuple[int, ...]]:
    """Every layer -> device map up to relabelling: restricted growth strings with labels < ``devices``.

    >>> list(general_allocations(3, 2))
    [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    """
    def rec(prefix: list[int], used: int) -> Iterator[tuple[int, ...]]:
        if len(prefix) == n_layers:
            yield tuple(prefix)
            return
        for d in range(min(used + 1, devices)):
            prefix.append(d)
            yield from rec(prefix, max(used, d + 1))
            prefix.pop()

    yield from rec([], 0)


# ----------------------------------------------------------------------------
# the planner
# ----------------------------------------------------------------------------
_CACHE: dict[Any, Plan] = {}


def clear_cache() -> None:
    _CACHE.clear()


def _plan_auto(chain: Chain, platform: Target, allocation: str, time_limit: float | None, max_layers: int
               ) -> Plan:
    """Every policy vector (3^L of them), each planned exhaustively; the best (fewest non-keep
    layers among equal periods, then the first in keep < recompute < offload order)."""
    t0 = time.perf_counter()
    best: Plan | None = None
    best_key = None
    for vec in itertools.product(POLICIES, repeat=len(chain)):
        left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            break
        p = plan_brute(apply_policies(chain, vec), platform, allocation=allocation, time_limit=left,
                       max_layers=max_layers, cache=False)
        if not p.feasible:
            continue
        key = (p.period, sum(v != "keep" for v in vec))
        if best is None or key[0] < best_key[0] * (1 - TIE) or (key[0] <= best_key[0] * (1 + TIE)
                                                                   and key[1] < best_key[1]):
            best, best_key = p.with_(activations=() if is_keep(vec) else vec), key
    elapsed = time.perf_counter() - t0
    if best is None:
        return infeasible_plan(chain, platform, "brute", "no allocation and activation policies fit in memory",
                               allocation=allocation, solve_seconds=elapsed)
    return best.with_(lower_bound=lower_bound(chain, platform), solve_seconds=elapsed)


_Best = tuple[float, tuple[int, ...], list[float], list[float]]   # (period, assignment, forward, backward starts)


def plan_brute(chain: Chain, platform: Target, *, allocation: str = "contiguous",
               time_limit: float | None = None, max_layers: int = 10, cache: bool = True,
               activations: str | None = None, **options: Any) -> Plan:
    """Exact optimal periodic plan by exhaustive search (tiny instances only).

    ``allocation``: ``"contiguous"`` or ``"general"``. Refuses chains longer
    than ``max_layers``. ``time_limit`` (seconds): when exceeded, the best
    plan found so far is returned with status ``"timeout"``. ``cache``:
    re-use the answer for an identical (chain, platform, allocation).
    ``activations="auto"``: also every activation policy vector (3^L times the work);
    one policy for all layers: :func:`workbench.planners.plan`.
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    L = len(chain)
    if activations == "auto":
        if L > max_layers:
            raise ValueError(f"brute force refuses a chain of {L} layers (max_layers={max_layers})")
        return _plan_auto(chain, platform, allocation, time_limit, max_layers)
    if activations not in (None, "keep"):
        return plan_with_policies(chain, platform, plan_brute, "brute", activations, allocation=allocation,
                                  time_limit=time_limit, max_layers=max_layers, cache=cache)
    if L > max_layers:
        raise ValueError(
            f"brute force is exhaustive and refuses a chain of {L} layers (max_layers={max_layers}); "
            f"coarsen the chain (Chain.coarsen) or use the dp / ilp methods")
    key = _cache_key(chain, platform, allocation) if cache else None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit else None
    best = _best_contiguous(chain, platform)
    timed_out = False
    if allocation == "general":
        best, timed_out = _best_general(chain, platform, best, deadline)
    result = _brute_plan(chain, platform, allocation, best, timed_out, time.perf_counter() - t0)
    if key is not None and not timed_out:
        _CACHE[key] = result
    return result


def _cache_key(chain: Chain, platform: Target, allocation: str) -> Any:
    """The cache key of an instance, or None when some field is unhashable (then no cache). A chain's equality
    leaves its meta out, which the memory model reads (tied parameters, the runtime constant, the device): the
    key holds it."""
    key = (chain, tuple(sorted((str(k), str(v)) for k, v in (chain.meta or {}).items())), platform, allocation)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _best_contiguous(chain: Chain, platform: Target) -> _Best | None:
    """The best contiguous allocation, each scored by its closed form (None: none fits in memory)."""
    best: _Best | None = None
    for asg in contiguous_allocations(len(chain), platform.devices):
        al = allocation_of(chain, platform, asg)
        r = contiguous_period(al, platform)
        if r is not None and (best is None or r[0] < best[0]):
            f, b = contiguous_schedule(al, r[0], r[1])
            best = (r[0], asg, f, b)
    return best


def _best_general(chain: Chain, platform: Target, best: _Best | None, deadline: float | None
                  ) -> tuple[_Best | None, bool]:
    """Improve ``best`` over the non-contiguous allocations, visited in order of their lower bound and
    stopped once the bound reaches the incumbent; returns the best and whether the deadline passed."""
    allocs = [a for a in (allocation_of(chain, platform, g) for g in general_allocations(len(chain), platform.devices))
              if not a.contiguous]
    bounds = [max(a.static_lb, memory_floor(a, platform)) for a in allocs]
    for i in sorted(range(len(allocs)), key=lambda i: bounds[i]):
        upper = best[0] if best is not None else math.inf
        if not bounds[i] < upper / (1 + PERIOD_SEARCH):
            if best is not None:
                break
            continue
        try:
            r = general_period(allocs[i], platform, upper, deadline)
        except TimeoutError:
            return best, True
        if r is not None and (best is None or r[0] < best[0]):
            best = (r[0], allocs[i].assignment, r[1], r[2])
        if deadline is not None and time.perf_counter() > deadline:
            return best, True
    return best, False


def _brute_plan(chain: Chain, platform: Target, allocation: str, best: _Best | None, timed_out: bool,
                elapsed: float) -> Plan:
    """The plan of the best allocation found (``timeout`` when the search was cut short), or why none."""
    if best is None:
        why = ("no allocation fits in memory" if not timed_out else "time limit reached before any plan was found")
        result = infeasible_plan(chain, platform, "brute", why, allocation=allocation, solve_seconds=elapsed)
        return result.with_(status="timeout") if timed_out else result
    T, asg, f, b = best
    return make_plan(chain, platform, T, asg, f, b, method="brute", allocation=allocation,
                     status="timeout" if timed_out else "optimal", gap=None if timed_out else 0.0,
                     solve_seconds=elapsed)
