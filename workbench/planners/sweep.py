"""Plan a chain at several memory limits, robustly: the one sweep the ILP notebook, the studies and the
experiments share.

* :func:`solve` plans once through :func:`workbench.planners.plan` (re-checked,
  ``solve_seconds`` filled); a method that is not there (not in the registry,
  ``NotImplementedError``) raises :class:`Unavailable`.
* :func:`attempt` never raises: it returns the plan, or a :class:`Failure`
  (``unavailable``, or ``error`` with the message), so a sweep never stops on
  one bad solve.
* :func:`sweep` plans at each memory limit, smallest first; with
  ``warm_start`` a method that takes one (the registry's ``warm_start``)
  starts each level from the last plan that was feasible (a plan that fits a
  smaller limit fits a larger one).
* :func:`sweep_memory`: several methods at several limits, as one table
  (throughput against memory).
* :func:`plan_row` and :func:`run_method` turn one result into the tidy columns
  of the studies' tables.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)), input_bytes=10)
>>> [(M, p.status) for M, p in sweep(ch, Target.of(2, memory_model="paper"), [1000, 200], "dp")]
[(200.0, 'infeasible'), (1000.0, 'optimal')]
>>> run_method(ch, Target.of(2, memory_model="paper"), "nosuch")["status"]
'unavailable'
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from workbench.methods import method as registered
from workbench.model.chain import Chain
from workbench.model.plan import Plan, lower_bound
from workbench.model.target import Target
from workbench.model.units import parse_size
from workbench.planners import plan as run_planner

__all__ = ["Unavailable", "Failure", "solve", "attempt", "sweep", "sweep_memory", "plan_row", "run_method",
           "UNAVAILABLE"]

#: the status of a row whose method is not there
UNAVAILABLE = "unavailable"


class Unavailable(Exception):
    """The method is not there: not in the registry, or not implemented for this input. (A registered
    method whose module fails to import is a broken install, and that error is raised as it is.)"""


@dataclass(frozen=True)
class Failure:
    """A solve that gave no plan: ``status`` ``unavailable`` or ``error``, ``note`` the reason."""

    status: str
    note: str
    seconds: float


def solve(chain: Chain, platform: Target, method: str, *, allocation: str = "contiguous",
          time_limit: float | None = None, **options: Any) -> Plan:
    """:func:`workbench.planners.plan`, raising :class:`Unavailable` for a method that is not there."""
    try:
        registered(method)
    except ValueError as e:
        raise Unavailable(f"{type(e).__name__}: {e}") from e
    try:
        return run_planner(chain, platform, method, allocation=allocation, time_limit=time_limit, **options)
    except NotImplementedError as e:
        raise Unavailable(f"NotImplementedError: {e}") from e


def attempt(chain: Chain, platform: Target, method: str, *, allocation: str = "contiguous",
            time_limit: float | None = None, **options: Any) -> Plan | Failure:
    """:func:`solve`, with whatever goes wrong recorded as a :class:`Failure` instead of raised."""
    t0 = time.perf_counter()
    try:
        return solve(chain, platform, method, allocation=allocation, time_limit=time_limit, **options)
    except Unavailable as e:
        return Failure(UNAVAILABLE, str(e), time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - recorded, not hidden
        return Failure("error", f"{type(e).__name__}: {e}", time.perf_counter() - t0)


def sweep(chain: Chain, platform: Target, memories: Sequence[float | str], method: str, *,
          allocation: str = "contiguous", time_limit: float | None = None, warm_start: bool = False,
          robust: bool = False, **options: Any) -> list[tuple[float, Plan | Failure]]:
    """``(limit, result)`` for each memory limit (bytes or ``"16GiB"``), smallest first.

    ``robust``: each result comes from :func:`attempt` (a :class:`Failure` where
    a solve fails) instead of :func:`solve` (which raises).
    ``warm_start``: a method that takes one gets the last feasible plan (``True``
    on the first level: its own warm start).
    """
    takes_warm_start = warm_start and registered(method).warm_start
    prev: Plan | None = None
    out: list[tuple[float, Plan | Failure]] = []
    for M in sorted(parse_size(m, what="memory") for m in memories):
        opts = dict(options)
        if takes_warm_start:
            opts["warm_start"] = prev if prev is not None else True
        run = attempt if robust else solve
        result = run(chain, platform.with_(memory=M), method, allocation=allocation, time_limit=time_limit, **opts)
        if isinstance(result, Plan) and result.feasible:
            prev = result
        out.append((M, result))
    return out


def plan_row(plan: Plan | Failure, chain: Chain, platform: Target) -> dict[str, Any]:
    """The tidy columns of one result (period, throughput, ratio to the bound, memory, status, time-out)."""
    lb = lower_bound(chain, platform)
    if isinstance(plan, Failure):
        return {"status": plan.status, "feasible": False, "fits": False, "period": math.nan, "throughput": 0.0,
                "lower_bound": lb, "ratio": math.nan, "normalised_throughput": 0.0, "peak_memory": math.nan,
                "memory_per_device": "", "gap": math.nan, "seconds": plan.seconds, "n_stages": 0,
                "plan_allocation": "", "note": plan.note[:300], "timed_out": False, "may_vary": False}
    feas = plan.feasible
    return {
        "status": plan.status,
        "feasible": feas,
        "fits": plan.fits,
        "period": plan.period if feas else math.nan,
        "throughput": plan.throughput if feas else 0.0,
        "lower_bound": lb,
        "ratio": plan.period / lb if feas and lb > 0 else math.nan,
        "normalised_throughput": (lb / plan.period) if feas and plan.period > 0 else 0.0,
        "peak_memory": plan.peak_memory if feas else math.nan,
        "memory_per_device": ";".join(f"{m:.6g}" for m in plan.memory) if feas else "",
        "gap": plan.gap if plan.gap is not None else math.nan,
        "seconds": float(plan.solve_seconds),
        "n_stages": len(plan.stages),
        "plan_allocation": plan.allocation,
        "note": " | ".join(plan.notes)[:300],
        "timed_out": plan.status == "timeout",
        "may_vary": bool(plan.extra.get("may_vary", False)),    # the safety net stopped a phase (its own column:
    }                                                           # the note is cut at 300 characters)


def run_method(chain: Chain, platform: Target, method: str, *, allocation: str = "contiguous",
               time_limit: float | None = None, **options: Any) -> dict[str, Any]:
    """Plan with ``method`` (:func:`attempt`) and return :func:`plan_row`'s columns plus ``method``/``allocation``.

    A method that is not there gives ``status="unavailable"``; any other error
    ``status="error"`` with the message in ``note``. ``timed_out`` is True when
    the planner reports ``"timeout"``.
    """
    result = attempt(chain, platform, method, allocation=allocation, time_limit=time_limit, **options)
    return {"method": method, "allocation": allocation, **plan_row(result, chain, platform)}


def sweep_memory(chain: Chain, platform: Target, memories: Sequence[float | str], *,
                 methods: Sequence[str] = ("ilp",), allocation: str = "contiguous",
                 time_limit: float | None = None, **options: Any):
    """Throughput against the memory limit: one solve per (memory level, method), as a DataFrame.

    Columns: memory, method, allocation, status, period, throughput, gap, solve_seconds,
    peak_memory. Levels are solved from the smallest up; the ILP re-uses the plan of the
    previous level as a warm start (a plan that fits a smaller limit fits a larger one).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)), input_bytes=10)
    >>> df = sweep_memory(ch, Target.of(2, memory_model="paper"), [200, 1000, 10_000])
    >>> list(df["status"])
    ['infeasible', 'optimal', 'optimal']
    """
    # the ILP's options go to the ILP; each method starts from its last feasible plan where it takes one
    runs = [sweep(chain, platform, memories, method, allocation=allocation, time_limit=time_limit, warm_start=True,
                  **(options if method == "ilp" else {})) for method in methods]
    rows = []
    for level in zip(*runs):
        for method, (M, p) in zip(methods, level):
            rows.append({"memory": M, "method": method, "allocation": allocation, "status": p.status,
                         "period": p.period, "throughput": p.throughput, "gap": p.gap,
                         "solve_seconds": p.solve_seconds,
                         "peak_memory": p.peak_memory if p.feasible else float("nan")})
    return pd.DataFrame(rows)
