"""Reading a plan's JSON object (docs/model.md, "JSON"): every field checked, each error naming that field.

:func:`plan_fields` turns the object into :class:`~workbench.model.plan.Plan`'s keywords, or raises a
``ValueError`` whose message starts with the field that is wrong (``stages[1].device: ...``,
``memory_setup.optimizer: ...``): the field itself, never a later one that only disagrees with it (an
``assignment`` of the wrong length is reported as such, not as a wrong number of ``activations``).

>>> plan_fields({"devices": 2, "allocation": "weird"})
Traceback (most recent call last):
ValueError: allocation: 'weird' is not one of contiguous, general
>>> plan_fields({"devices": 1, "assignment": [0], "activations": 3})
Traceback (most recent call last):
ValueError: activations: expected a list, got a number
"""

from __future__ import annotations

import math
from typing import Any

from workbench.model.activations import POLICIES, is_keep, policy_vector
from workbench.model.layout import LAYOUT_KEYS, pipeline_json

__all__ = ["plan_fields", "json_kind", "setup_fields", "MAX_DEVICES", "MAX_MICRO_BATCHES"]

#: the statuses a plan may have
STATUSES = ("optimal", "feasible", "infeasible", "timeout")
#: the allocations a plan may have
ALLOCATIONS = ("contiguous", "general")
#: the most devices a plan may have
MAX_DEVICES = 65536
#: the most micro-batches a flushed plan's flush may hold
MAX_MICRO_BATCHES = 10_000


def json_kind(x: Any) -> str:
    """'a list', 'a string', ... for messages about JSON values."""
    names = {list: "a list", dict: "an object", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(x), "a number" if isinstance(x, (int, float)) else type(x).__name__)


def _list(x: Any, where: str) -> list:
    if not isinstance(x, list):
        raise ValueError(f"{where}: expected a list, got {json_kind(x)}")
    return x


def _real(x: Any, where: str, *, null: float | None = None, lo: float | None = None) -> float:
    """A finite JSON number (``null`` maps to ``null`` when given), at least ``lo`` when given."""
    if x is None and null is not None:
        return null
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"{where}: expected a number, got {json_kind(x)} {x!r}")
    if not math.isfinite(x):
        raise ValueError(f"{where}: {x} is not a finite number")
    if lo is not None and x < lo:
        raise ValueError(f"{where}: {x} is below {lo:g}")
    return float(x)


def _whole(x: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """A whole JSON number (1.0 is fine, 1.5 is not) in ``lo..hi``."""
    v = _real(x, where)
    if not v.is_integer():
        raise ValueError(f"{where}: {x!r} is not a whole number")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        shown = f"{lo if lo is not None else ''}..{hi if hi is not None else ''}"
        raise ValueError(f"{where}: {int(v)} is out of range {shown}")
    return int(v)


def _one_of(x: Any, where: str, choices: tuple[str, ...], what: str = "one") -> str:
    if not isinstance(x, str) or x not in choices:
        raise ValueError(f"{where}: {x!r} is not {what} of {', '.join(choices)}")
    return x


def _stages(d: dict) -> list[tuple[int, int, int, float, float, int]]:
    """Each stage's (first, last, device, fwd_start, bwd_start, in_flight)."""
    out = []
    for i, s in enumerate(_list(d.get("stages", []), "stages")):
        w = f"stages[{i}]"
        if not isinstance(s, dict):
            raise ValueError(f"{w}: a stage is a JSON object, got {json_kind(s)}")
        layers = _list(s.get("layers"), f"{w}.layers")
        if len(layers) != 2:
            raise ValueError(f"{w}.layers: expected [first, last], got {len(layers)} entries")
        out.append((_whole(layers[0], f"{w}.layers[0]", 0), _whole(layers[1], f"{w}.layers[1]", 0),
                    _whole(s.get("device"), f"{w}.device"), _real(s.get("fwd_start"), f"{w}.fwd_start"),
                    _real(s.get("bwd_start"), f"{w}.bwd_start"), _whole(s.get("in_flight", 1), f"{w}.in_flight", 1)))
    return out


def _assignment(d: dict, stages: list) -> tuple[int, ...]:
    """One device per layer; as many layers as the stages cover (the stages are checked against it by rules 0-1)."""
    asg = tuple(_whole(a, f"assignment[{i}]") for i, a in enumerate(_list(d.get("assignment", []), "assignment")))
    covered = max((s[1] for s in stages), default=-1) + 1
    if stages and len(asg) != covered:
        raise ValueError(f"assignment: {len(asg)} entries, but the stages cover {covered} layers (one device per "
                         "layer, in layer order)")
    return asg


def _activations(value: Any, n_layers: int) -> tuple[str, ...]:
    """A plan file's ``activations``: one known policy per layer, or () when absent or all ``keep``."""
    if value is None:
        return ()
    items = _list(value, "activations")
    if len(items) != n_layers:
        raise ValueError(f"activations: {len(items)} policies for an assignment of {n_layers} layers (one per "
                         "layer, in layer order)")
    for i, x in enumerate(items):
        _one_of(x, f"activations[{i}]", tuple(POLICIES), "an activation policy: one")
    pol = policy_vector(items, n_layers)
    return () if is_keep(pol) else pol


def setup_fields(setup: Any) -> dict:
    """A plan's ``memory_setup``, each recorded value checked (null: not recorded; a link's null: infinite);
    fields it does not know are kept as they are."""
    from workbench.model.memory import MEMORY_MODELS, OPTIMIZER_STATES, PRECISIONS, ZERO_GRADS

    if not isinstance(setup, dict):
        raise ValueError(f"memory_setup: expected a JSON object, got {json_kind(setup)}")
    names = {"memory_model": MEMORY_MODELS, "optimizer": tuple(OPTIMIZER_STATES), "precision": PRECISIONS,
             "zero_grad": ZERO_GRADS, "weights": ("stash", "single")}
    for key, value in setup.items():
        where = f"memory_setup.{key}"
        if value is None:
            continue
        if key in names:
            _one_of(value, where, tuple(names[key]))
        elif key == "weight_factor":
            _real(value, where, lo=0.0)
        elif key in ("bandwidth", "node_bandwidth", "host_bandwidth"):
            if _real(value, where) <= 0:
                raise ValueError(f"{where}: {value} is not a positive bandwidth (bytes per second; null: infinite)")
        elif key in ("devices_per_node", "dp"):
            _whole(value, where, 1)
        elif key == "zero":
            _whole(value, where, 0, 3)
        elif key == "gpu" and not isinstance(value, str):
            raise ValueError(f"{where}: expected a GPU's name, got {json_kind(value)}")
        elif key == "estimated" and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            raise ValueError(f"{where}: expected a list of profile columns, got {value!r}")
    return dict(setup)


def plan_fields(d: Any) -> dict[str, Any]:
    """:class:`~workbench.model.plan.Plan`'s keywords from a plan's JSON object (module docstring); ``stages`` as
    tuples of a :class:`~workbench.model.plan.Stage`'s fields."""
    if not isinstance(d, dict):
        raise ValueError(f"a plan is a JSON object, got {json_kind(d)}")
    if "devices" not in d:
        raise ValueError("devices: missing (the number of devices the plan is for)")
    if "parallel" in d:     # a layout's plan: devices and memory count every GPU, the fields one pipeline's
        d = pipeline_json(d, _whole(d["devices"], "devices", 1))
    devices = _whole(d["devices"], "devices", 1, MAX_DEVICES)
    stages = _stages(d)
    assignment = _assignment(d, stages)
    mb, order, gap = d.get("micro_batches"), d.get("chain_order"), d.get("gap")
    extra = d.get("extra", {})
    if not isinstance(extra, dict):
        raise ValueError(f"extra: expected a JSON object, got {json_kind(extra)}")
    # a plan written before the memory model records no set-up: it used the paper's rule 7
    setup = setup_fields(d.get("memory_setup", {"memory_model": "paper", "weight_factor": 1.0}))
    if gap is not None and not 0.0 <= _real(gap, "gap") <= 1.0:
        raise ValueError(f"gap: {gap} is not in 0..1 (the gap is (period - bound) / period)")
    return dict(
        period=_real(d.get("period"), "period", null=math.inf),
        assignment=assignment,
        stages=tuple(stages),
        devices=devices,
        memory=tuple(_real(m, f"memory[{i}]") for i, m in enumerate(_list(d.get("memory", []), "memory"))),
        memory_limit=_real(d.get("memory_limit"), "memory_limit", null=math.inf, lo=0.0),
        lower_bound=_real(d.get("lower_bound", 0.0), "lower_bound", lo=0.0),
        method=str(d.get("method", "")),
        allocation=_one_of(d.get("allocation", "contiguous"), "allocation", ALLOCATIONS),
        status=_one_of(d.get("status", "feasible"), "status", STATUSES),
        gap=None if gap is None else float(gap),
        solve_seconds=_real(d.get("solve_seconds", 0.0), "solve_seconds"),
        schedule=str(d.get("schedule", "periodic")),
        micro_batches=None if mb is None else _whole(mb, "micro_batches", 1, MAX_MICRO_BATCHES),
        chain_order=tuple(str(n) for n in _list(order, "chain_order")) if order else None,
        notes=tuple(str(n) for n in _list(d.get("notes", []), "notes")),
        extra=extra,
        setup=setup,
        activations=_activations(d.get("activations"), len(assignment)),
        parallel={k: d[k] for k in LAYOUT_KEYS if k in d},
    )
