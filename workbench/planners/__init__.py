"""Planners: every method maps (chain, platform) to a :class:`~workbench.plan.Plan`.

Each planner is a function ``fn(chain, platform, *, allocation="contiguous",
time_limit=None, **options) -> Plan``; an option a method has no use for is
ignored. :func:`plan` dispatches by name and re-checks what the planner
returns with :func:`workbench.check.check`: a plan the checker rejects is
never reported ``optimal`` (its status becomes ``feasible``, a note and
``extra["violations"]`` say why). Options every method accepts:
``progress`` (a callable that receives one line per phase of long work;
default: quiet) and ``deterministic`` (work budgets instead of wall-clock
ones where a method has any, see :mod:`workbench.planners.budget`).

>>> sorted(METHODS)[:3]
['1f1b', 'brute', 'dp']
>>> sorted(GENERAL_METHODS)
['brute', 'ilp']
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

from ..chain import Chain, Platform
from ..plan import Plan

__all__ = ["METHODS", "GENERAL_METHODS", "plan", "get_planner", "recheck"]

# method name -> "module:function"
METHODS: dict[str, str] = {
    "dp": "workbench.planners.dp:plan_dp",
    "pipedream": "workbench.planners.pipedream:plan_pipedream",
    "uniform": "workbench.planners.baselines:plan_uniform",
    "parameters": "workbench.planners.baselines:plan_parameters",
    "torchgpipe": "workbench.planners.baselines:plan_torchgpipe",
    "gpipe": "workbench.planners.flushed:plan_gpipe",
    "1f1b": "workbench.planners.flushed:plan_1f1b",
    "brute": "workbench.planners.brute:plan_brute",
    "ilp": "workbench.planners.ilp:plan_ilp",
}

#: the methods that search general (non-contiguous) allocations; the others plan contiguous ones only
GENERAL_METHODS: frozenset[str] = frozenset({"ilp", "brute"})


def get_planner(method: str) -> Callable[..., Plan]:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(sorted(METHODS))}")
    module, func = METHODS[method].split(":")
    return getattr(importlib.import_module(module), func)


def recheck(result: Plan, chain: Chain, platform: Platform) -> Plan:
    """``result`` as it may be reported: if :func:`workbench.check.check` rejects a feasible plan,
    its status ``optimal`` or ``timeout`` becomes ``feasible`` (gap dropped) with a note, and
    ``extra["violations"]`` lists what the checker found.

    >>> from workbench.chain import Chain, Layer, Platform
    >>> from workbench.plan import make_plan
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 4) for i in range(2)))
    >>> lying = make_plan(ch, Platform(2), 1.0, [0, 1], [0.0, 1.0], [4.0, 2.0], status="optimal")  # period < load
    >>> p = recheck(lying, ch, Platform(2))
    >>> p.status, p.extra["violations"][0][:40]
    ('feasible', 'rule 5 (overlap): device 0 load 3.000 s ')
    """
    if not result.feasible:
        return result
    from ..check import check

    bad = check(result, chain, platform)
    if not bad:
        return result
    status = "feasible" if result.status in ("optimal", "timeout") else result.status
    note = (f"the checker rejects this plan ({len(bad)} violation(s), first: {bad[0]}); "
            f"not reported {result.status}")
    return result.with_(status=status, gap=None if status != result.status else result.gap,
                        notes=tuple(result.notes) + (note,),
                        extra={**result.extra, "violations": [str(v) for v in bad]})


def plan(chain: Chain, platform: Platform, method: str = "dp", *, allocation: str = "contiguous",
         time_limit: float | None = None, **options: Any) -> Plan:
    """Plan ``chain`` on ``platform`` with ``method``, re-checked (:func:`recheck`); fills
    ``solve_seconds`` when the planner did not."""
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    fn = get_planner(method)
    t0 = time.perf_counter()
    result = fn(chain, platform, allocation=allocation, time_limit=time_limit, **options)
    if not result.solve_seconds:
        result = result.with_(solve_seconds=time.perf_counter() - t0)
    return recheck(result, chain, platform)
