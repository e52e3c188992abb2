"""Planners: every method maps (chain, platform) to a :class:`~workbench.plan.Plan`.

Each planner is a function ``fn(chain, platform, *, allocation="contiguous",
time_limit=None, **options) -> Plan``; an option a method has no use for is
ignored. :func:`plan` dispatches by name.

>>> sorted(METHODS)[:3]
['1f1b', 'brute', 'dp']
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

from ..chain import Chain, Platform
from ..plan import Plan

__all__ = ["METHODS", "plan", "get_planner"]

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


def get_planner(method: str) -> Callable[..., Plan]:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(sorted(METHODS))}")
    module, func = METHODS[method].split(":")
    return getattr(importlib.import_module(module), func)


def plan(chain: Chain, platform: Platform, method: str = "dp", *, allocation: str = "contiguous",
         time_limit: float | None = None, **options: Any) -> Plan:
    """Plan ``chain`` on ``platform`` with ``method``; fills ``solve_seconds`` when the planner did not."""
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    fn = get_planner(method)
    t0 = time.perf_counter()
    result = fn(chain, platform, allocation=allocation, time_limit=time_limit, **options)
    if not result.solve_seconds:
        result = result.with_(solve_seconds=time.perf_counter() - t0)
    return result
