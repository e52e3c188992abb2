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
from typing import Any, Callable, Sequence

from ..chain import Chain, Platform
from ..plan import Plan

__all__ = ["METHODS", "AUTO_METHODS", "plan", "get_planner"]

# method name -> "module:function"
METHODS: dict[str, str] = {
    "dp": "workbench.planners.dp:plan_dp",
    "pipedream": "workbench.planners.pipedream:plan_pipedream",
    "mcap": "workbench.planners.mcap:plan_mcap",
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


#: methods that choose every layer's activation policy themselves (``activations="auto"``)
AUTO_METHODS = ("dp", "brute", "ilp")
#: flushed schedules simulate their memory; they take keep or recompute for every layer
_FLUSHED = ("gpipe", "1f1b")


def plan(chain: Chain, platform: Platform, method: str = "dp", *, allocation: str = "contiguous",
         time_limit: float | None = None, activations: str | Sequence[str] | None = None, **options: Any) -> Plan:
    """Plan ``chain`` on ``platform`` with ``method``; fills ``solve_seconds`` when the planner did not.

    ``activations`` (docs/model.md, "Activation policies"): ``keep`` (default), ``recompute``,
    ``offload`` or one policy per layer: the method plans the effective chain
    (:func:`workbench.activations.apply_policies`) and the plan records the policies; ``auto``:
    :data:`AUTO_METHODS` choose per layer themselves, the other periodic methods keep their
    partition (chosen as without a memory limit) and get the best policies and period for it
    (:func:`workbench.planners.dp_auto.auto_on_chain` on that partition).
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    fn = get_planner(method)
    t0 = time.perf_counter()
    if activations in (None, "keep"):
        result = fn(chain, platform, allocation=allocation, time_limit=time_limit, **options)
    elif activations == "auto":
        result = _plan_auto(chain, platform, method, fn, allocation, time_limit, options)
    else:
        result = _plan_fixed(chain, platform, method, fn, allocation, time_limit, activations, options)
    if not result.solve_seconds:
        result = result.with_(solve_seconds=time.perf_counter() - t0)
    if "offload" in result.activations:   # check and simulate read the host link the plan was made for
        result = result.with_(setup={**result.setup, "host_bandwidth": platform.host_bandwidth})
    return result


def _plan_fixed(chain: Chain, platform: Platform, method: str, fn: Callable[..., Plan], allocation: str,
                time_limit: float | None, activations: str | Sequence[str], options: dict) -> Plan:
    """One given policy per layer: plan the effective chain, record the policies and the chain's own bound."""
    from ..activations import apply_policies, is_keep, policy_vector
    from ..plan import lower_bound

    pol = policy_vector(activations, len(chain))
    if is_keep(pol):
        return fn(chain, platform, allocation=allocation, time_limit=time_limit, **options)
    if method in _FLUSHED and "offload" in pol:
        raise ValueError(f"method {method!r} (a flushed schedule) takes keep or recompute; offload needs a periodic "
                         "plan (the host link is scheduled there, rule 8)")
    result = fn(apply_policies(chain, pol), platform, allocation=allocation, time_limit=time_limit, **options)
    return result.with_(activations=pol, lower_bound=lower_bound(chain, platform))


def _plan_auto(chain: Chain, platform: Platform, method: str, fn: Callable[..., Plan], allocation: str,
               time_limit: float | None, options: dict) -> Plan:
    """``activations="auto"``: natively, or the method's partition with the best policies for it."""
    if method in AUTO_METHODS:
        return fn(chain, platform, allocation=allocation, time_limit=time_limit, activations="auto", **options)
    if method in _FLUSHED:
        raise ValueError(f"method {method!r} (a flushed schedule) does not choose activation policies; "
                         f"activations 'auto' works with {', '.join(AUTO_METHODS)} and the periodic baselines")
    from ..activations import apply_policies, describe, is_keep
    from ..plan import infeasible_plan, lower_bound
    from ..schedule import Scheduler
    from .dp import bounds_to_assignment
    from .dp_auto import auto_on_chain

    t0 = time.perf_counter()
    base = fn(chain, platform.with_(memory=float("inf")), allocation=allocation, time_limit=time_limit, **options)
    if not base.feasible:
        return base.with_(memory_limit=platform.memory)
    bounds = [(s.first, s.last) for s in base.stages]
    T, found, pol, why = auto_on_chain(chain, platform, allowed=bounds)
    note = f"{method}'s partition (chosen without a memory limit), activation policies chosen for it"
    if found is not None and why:
        note += f" ({why})"
    if found is None:
        return infeasible_plan(chain, platform, method, why, notes=(note,), solve_seconds=time.perf_counter() - t0)
    eff = apply_policies(chain, pol)
    plan_ = Scheduler(eff, platform, bounds_to_assignment(found)).plan(
        T, method=method, allocation="contiguous", notes=base.notes + (note, f"activations: {describe(pol)}"))
    return plan_.with_(activations=() if is_keep(pol) else pol, lower_bound=lower_bound(chain, platform),
                       solve_seconds=time.perf_counter() - t0, extra={**base.extra, **plan_.extra})
