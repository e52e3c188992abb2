"""Planners: every method maps (chain, platform) to a :class:`~workbench.model.plan.Plan`.

Each planner is a function ``fn(chain, platform, *, allocation="contiguous",
time_limit=None, **options) -> Plan``; an option a method has no use for is
ignored. :func:`plan` dispatches by name and re-checks what the planner
returns with :func:`workbench.verify.check.check`: a plan the checker rejects is
never reported ``optimal`` (its status becomes ``feasible``, a note and
``extra["violations"]`` say why). Options every method accepts:
``progress`` (a callable that receives one line per phase of long work;
default: quiet) and ``deterministic`` (work budgets instead of wall-clock
ones where a method has any, see :mod:`workbench.planners.budget`).

>>> sorted(PLANNERS)[:3]
['1f1b', 'brute', 'dp']
>>> sorted(GENERAL_METHODS)
['brute', 'ilp']
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from workbench.methods import METHODS as _REGISTRY
from workbench.methods import method as _method
from workbench.methods import names as _names
from workbench.model.activations import apply_policies, describe, is_keep, policy_vector
from workbench.model.chain import Chain
from workbench.model.plan import Plan, infeasible_plan, lower_bound
from workbench.model.target import Target
from workbench.planners.baselines import plan_parameters, plan_torchgpipe, plan_uniform
from workbench.planners.brute import plan_brute
from workbench.planners.dp import auto_on_chain, plan_dp
from workbench.planners.fixed_policies import FLUSHED, plan_with_policies
from workbench.planners.flushed import plan_1f1b, plan_gpipe
from workbench.planners.ilp import plan_ilp
from workbench.planners.mcap import plan_mcap
from workbench.planners.partition import place
from workbench.planners.pipedream import plan_pipedream
from workbench.planners.torch_schedules import TORCH_PLANNERS
from workbench.schedules.builder import Scheduler
from workbench.verify.check import check

__all__ = ["PLANNERS", "GENERAL_METHODS", "AUTO_METHODS", "plan", "get_planner", "recheck", "platform_links"]

#: method name (the registry, :mod:`workbench.methods`) -> its planner function, ``plan_<name>``
PLANNERS: dict[str, Callable[..., Plan]] = {
    fn.__name__.removeprefix("plan_"): fn
    for fn in (plan_dp, plan_pipedream, plan_mcap, plan_uniform, plan_parameters, plan_torchgpipe, plan_gpipe,
               plan_1f1b, plan_brute, plan_ilp)} | TORCH_PLANNERS
assert set(PLANNERS) == {m.name for m in _REGISTRY}, "every registered method has its plan_<name> here"

#: the methods that search general (non-contiguous) allocations; the others plan contiguous ones only
GENERAL_METHODS: frozenset[str] = frozenset(m.name for m in _REGISTRY if "general" in m.allocations)


def get_planner(method: str) -> Callable[..., Plan]:
    """The planner function of ``method`` (a ``ValueError`` naming the choices for an unknown one)."""
    return PLANNERS[_method(method).name]


def recheck(result: Plan, chain: Chain, platform: Target) -> Plan:
    """``result`` as it may be reported: if :func:`workbench.verify.check.check` rejects a feasible plan,
    its status ``optimal`` or ``timeout`` becomes ``feasible`` (gap dropped) with a note, and
    ``extra["violations"]`` lists what the checker found.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.plan import make_plan
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 4) for i in range(2)))
    >>> lying = make_plan(ch, Target.of(2), 1.0, [0, 1], [0.0, 1.0], [4.0, 2.0], status="optimal")  # period < load
    >>> p = recheck(lying, ch, Target.of(2))
    >>> p.status, p.extra["violations"][0][:40]
    ('feasible', 'rule 5 (overlap): device 0 load 3.000 s ')
    """
    if not result.feasible:
        return result
    bad = check(result, chain, platform)
    if not bad:
        return result
    status = "feasible" if result.status in ("optimal", "timeout") else result.status
    note = (f"the checker rejects this plan ({len(bad)} violation(s), first: {bad[0]}); "
            f"not reported {result.status}")
    return result.with_(status=status, gap=None if status != result.status else result.gap,
                        notes=tuple(result.notes) + (note,),
                        extra={**result.extra, "violations": [str(v) for v in bad]})


#: methods that choose every layer's activation policy themselves (``activations="auto"``)
AUTO_METHODS = _names(auto_activations=True)


def plan(chain: Chain, platform: Target, method: str = "dp", *, allocation: str = "contiguous",
         time_limit: float | None = None, activations: str | Sequence[str] | None = None, **options: Any) -> Plan:
    """Plan ``chain`` on ``platform`` with ``method``, re-checked (:func:`recheck`); fills ``solve_seconds``
    when the planner did not.

    ``activations`` (docs/model.md, "Activation policies"): ``keep`` (default), ``recompute``,
    ``offload`` or one policy per layer: the method plans the effective chain
    (:func:`workbench.model.activations.apply_policies`) and the plan records the policies; ``auto``:
    :data:`AUTO_METHODS` choose per layer themselves, the other periodic methods keep their
    partition (chosen as without a memory limit) and get the best policies and period for it
    (:func:`workbench.planners.dp.auto.auto_on_chain` on that partition).
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    fn = get_planner(method)
    t0 = time.perf_counter()
    if _method(method).torch_schedule and activations not in (None, "keep") and not is_keep(
            policy_vector(activations, len(chain)) if activations != "auto" else ("auto",)):
        raise ValueError(f"method {method!r} (torch's schedule) runs every layer with its activations kept; "
                         f"activations {activations!r} is not available for it")
    if activations in (None, "keep"):
        result = fn(chain, platform, allocation=allocation, time_limit=time_limit, **options)
    elif activations == "auto":
        result = _plan_auto(chain, platform, method, fn, allocation, time_limit, options)
    else:
        result = plan_with_policies(chain, platform, fn, method, activations, allocation=allocation,
                                    time_limit=time_limit, **options)
    if not result.solve_seconds:
        result = result.with_(solve_seconds=time.perf_counter() - t0)
    if "offload" in result.activations:   # check and simulate read the host link the plan was made for
        result = result.with_(setup={**result.setup, "host_bandwidth": platform.host_bandwidth})
    if platform.gpu or platform.multi_node:   # and the GPU and nodes it was made for
        result = result.with_(setup={**result.setup, **platform_links(platform)})
    return recheck(result, chain, platform)


def platform_links(platform: Target) -> dict[str, Any]:
    """What a plan records of its platform's GPU and nodes (``memory_setup``; check and simulate default to it).

    >>> platform_links(Target.of(16, devices_per_node=8, gpu="h100-sxm"))["devices_per_node"]
    8
    """
    out: dict[str, Any] = {"bandwidth": platform.bandwidth}
    if platform.gpu:
        out["gpu"] = platform.gpu
    if platform.multi_node:
        out.update(devices_per_node=platform.devices_per_node, node_bandwidth=platform.node_bandwidth)
    return out


def _plan_auto(chain: Chain, platform: Target, method: str, fn: Callable[..., Plan], allocation: str,
               time_limit: float | None, options: dict) -> Plan:
    """``activations="auto"``: natively, or the method's partition with the best policies for it."""
    if method in AUTO_METHODS:
        return fn(chain, platform, allocation=allocation, time_limit=time_limit, activations="auto", **options)
    if method in FLUSHED:
        raise ValueError(f"method {method!r} (a flushed schedule) does not choose activation policies; "
                         f"activations 'auto' works with {', '.join(AUTO_METHODS)} and the periodic baselines")
    t0 = time.perf_counter()
    base = fn(chain, platform.with_(memory=float("inf")), allocation=allocation, time_limit=time_limit, **options)
    if not base.feasible:
        return base.with_(memory_limit=platform.memory_limit)
    bounds = [(s.first, s.last) for s in base.stages]
    deadline = t0 + time_limit if time_limit is not None else None
    try:
        a = auto_on_chain(chain, platform, allowed=bounds, deadline=deadline)
    except TimeoutError:
        return infeasible_plan(chain, platform, method, "time limit reached before the policies for its partition "
                               "were searched", solve_seconds=time.perf_counter() - t0).with_(status="timeout")
    T, found, pol, why = a.period, a.bounds, a.policies, a.why
    note = f"{method}'s partition (chosen without a memory limit), activation policies chosen for it"
    if found is not None and why:
        note += f" ({why})"
    if found is None:
        p = infeasible_plan(chain, platform, method, why, notes=(note,), solve_seconds=time.perf_counter() - t0)
        return p if a.complete else p.with_(status="timeout")
    eff = apply_policies(chain, pol)
    plan_ = Scheduler(eff, platform, place(found, platform)).plan(
        T, method=method, allocation="contiguous", notes=base.notes + (note, f"activations: {describe(pol)}"))
    return plan_.with_(activations=() if is_keep(pol) else pol, lower_bound=lower_bound(chain, platform),
                       solve_seconds=time.perf_counter() - t0, extra={**base.extra, **plan_.extra})
