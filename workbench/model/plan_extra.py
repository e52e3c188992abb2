"""The schema of ``Plan.extra``: what a plan may record beyond docs/model.md's core fields.

``Plan.extra`` is written to the plan JSON as ``"extra"`` (docs/model.md,
"JSON"). Every key a planner or a command writes is declared in
:class:`PlanExtra` with its type; :func:`extra_problems` checks a record
against it (the tests run every planner through it). The ILP records its
search in ``solve`` (:class:`SolveRecord`): one :class:`PhaseRecord` per
phase it ran, which phase found the plan it returned and which proved the
bound its gap is measured against.

>>> rec = phase_record("cover", 0.5, 2.0, 1.5, "improved the incumbent")
>>> rec["period"], extra_problems({"solve": {"phases": [rec], "found_by": "cover", "bound_by": "cover"}})
(2.0, [])
>>> extra_problems({"solve": {"phases": []}, "colour": "red"})
["extra.solve: missing 'bound_by'", "extra.solve: missing 'found_by'", "extra: unknown key 'colour'"]
"""

from __future__ import annotations

import math
from typing import Any, Mapping, TypedDict, get_type_hints

__all__ = ["PhaseRecord", "SolveRecord", "HalfBlocks", "PlanExtra", "phase_record", "extra_problems"]


class PhaseRecord(TypedDict):
    """One phase of a planner's search, in the order they ran."""

    phase: str            #: its name: incumbent, stage_bound, local_search, cover, milp, block_ilp, ...
    seconds: float        #: wall-clock seconds it took
    period: float | None  #: the best plan's period after it (None: no plan yet)
    bound: float | None   #: the proven lower bound on the period after it (None: none yet)
    outcome: str          #: what it did, in a few words


class SolveRecord(TypedDict):
    """How a planner (the ILP) reached its plan: its phases, and which found the plan and proved the bound."""

    phases: list[PhaseRecord]
    found_by: str | None  #: the phase whose plan was returned (None: no plan)
    bound_by: str | None  #: the phase that proved the bound the gap is measured against (None: no bound)


class HalfBlocks(TypedDict):
    """The coarsened ILP's solve on half as many blocks (:mod:`workbench.planners.ilp.coarse`)."""

    blocks: int
    status: str
    period: float | None


class PlanExtra(TypedDict, total=False):
    """Every key ``Plan.extra`` may hold. Planners and commands add only these."""

    solve: SolveRecord                 #: the ILP's phases (docs/model.md, "Planners")
    violations: list[str]              #: what the checker found wrong (the plan is then not optimal)
    builder: str                       #: the schedule builder that placed the operations (asap or packed)
    least_memory_bound: float          #: the ILP's bound on the memory any plan needs (infeasible plans)
    termination: str                   #: HiGHS's termination condition
    deterministic: bool                #: work budgets were used and no wall clock stopped a phase
    may_vary: bool                     #: work budgets were used and the wall-clock safety net stopped a phase: a
    #:                                    rerun may plan differently (its notes say so: planners.budget.MAY_VARY)
    blocks: int                        #: the coarsened ILP: blocks solved on, ...
    groups: list[list[int]]            #: ... each block's first and last layer, ...
    coarse_period: float | None        #: ... the block ILP's period, ...
    coarse_status: str                 #: ... its status, ...
    coarse_gap: float | None           #: ... its gap, ...
    largest_block: float               #: ... the compute of the heaviest block (seconds), ...
    expanded_rejected: str             #: ... why the checker rejected the expanded block plan, ...
    half_blocks: HalfBlocks            #: ... the solve on half the blocks, ...
    fine_lower_bound: float            #: ... and the bound on the fine chain the gap is measured against
    pipedream_estimate: float          #: PipeDream's own estimate of its slowest stage (seconds)
    mcap_peak: float                   #: mCAP's least largest device memory under 1F1B counts (bytes)
    makespan: float                    #: flushed schedules: the simulated makespan of one flush (seconds)
    flushes: int                       #: flushed schedules: flushes simulated
    layer_names: list[str]             #: `plan`: the profile's layer names, in the plan's order
    tied: list[dict[str, Any]]         #: `plan`: the profile's shared parameters (docs/model.md, "Tied parameters")
    model_config: dict[str, Any]       #: the zoo model's configuration a runtime rebuilds it from
    module: str                        #: a layout plan's ``--module FILE.py:FUNC`` (the runtime rebuilds it)


def phase_record(phase: str, seconds: float, period: float | None, bound: float | None, outcome: str) -> PhaseRecord:
    """A :class:`PhaseRecord`; an infinite or missing period or bound is recorded as None (valid JSON)."""
    fin = lambda x: float(x) if x is not None and math.isfinite(x) else None  # noqa: E731
    return PhaseRecord(phase=phase, seconds=float(seconds), period=fin(period), bound=fin(bound), outcome=outcome)


_JSON_TYPES: dict[Any, tuple[type, ...]] = {float: (int, float), int: (int,), str: (str,), bool: (bool,)}


def _type_problems(value: Any, hint: Any, where: str) -> list[str]:
    """What is wrong with ``value`` against the type ``hint`` (the few shapes the schema uses)."""
    origin = getattr(hint, "__origin__", None)
    args = getattr(hint, "__args__", ())
    if hint is Any:
        return []
    if type(None) in args:                                   # X | None
        return [] if value is None else _type_problems(value, next(a for a in args if a is not type(None)), where)
    if isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__annotations__"):   # a TypedDict
        return _record_problems(value, hint, where)
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in _type_problems(v, args[0], f"{where}[{i}]")]
    if origin is dict or hint is dict:
        return [] if isinstance(value, dict) else [f"{where}: expected an object, got {type(value).__name__}"]
    allowed = _JSON_TYPES.get(hint, (hint,))
    if isinstance(value, bool) and bool not in allowed:
        return [f"{where}: expected {hint.__name__}, got bool"]
    return [] if isinstance(value, allowed) else [f"{where}: expected {hint.__name__}, got {type(value).__name__}"]


def _record_problems(value: Any, record: type, where: str) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"{where}: expected an object, got {type(value).__name__}"]
    hints = get_type_hints(record)
    out = [f"{where}: missing {k!r}" for k in sorted(record.__required_keys__) if k not in value]   # type: ignore[attr-defined]
    for k, v in value.items():
        if k not in hints:
            out.append(f"{where}: unknown key {k!r}")
        else:
            out += _type_problems(v, hints[k], f"{where}.{k}")
    return out


def extra_problems(extra: Mapping[str, Any]) -> list[str]:
    """Every way ``extra`` departs from :class:`PlanExtra` (an unknown key, a missing or mistyped field)."""
    return _record_problems(extra, PlanExtra, "extra")
