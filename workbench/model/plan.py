"""Plans: the period, the device of every layer, and start times per stage (docs/model.md, "Plan").

A :class:`Plan` is a plain value. Derived quantities (in-flight counts,
memory per device) are computed by :func:`make_plan` from the chain and
the platform and stored, so a plan round-trips through JSON in the format
of docs/model.md, "JSON" without the chain. :mod:`workbench.verify.check`
re-derives everything independently.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
>>> plat = Target.of(2, memory_model="paper")
>>> stages = stages_of([0, 0, 1, 1])
>>> stages
[(0, 1), (2, 3)]
>>> plan = make_plan(chain, plat, period=0.006, assignment=[0, 0, 1, 1],
...                  fwd_start=[0.0, 0.002], bwd_start=[0.008, 0.004], method="hand")
>>> [s.in_flight for s in plan.stages]
[2, 1]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from itertools import groupby
from pathlib import Path
from typing import Any, Literal, Sequence

from workbench.io import write_text_atomic
from workbench.model.activations import describe
from workbench.model.chain import Chain
from workbench.model.layout import every_rank_json
from workbench.model.memory import layer_terms
from workbench.model.memory_views import estimate_note, plan_memory
from workbench.model.plan_extra import PlanExtra
from workbench.model.plan_json import MAX_DEVICES, MAX_MICRO_BATCHES, plan_fields
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes, format_seconds

__all__ = [
    "Stage", "Plan", "Status", "MAX_DEVICES", "MAX_MICRO_BATCHES", "stages_of", "in_flight", "make_plan",
    "infeasible_plan", "lower_bound", "device_memory", "stage_in_flight", "chain_for_plan", "memory_setup",
    "with_memory_setup",
]

Status = Literal["optimal", "feasible", "infeasible", "timeout"]
# MAX_DEVICES: the most devices a plan file may name (a bigger count is a typo, and would make ``check`` allocate
# per device); MAX_MICRO_BATCHES: the most micro-batches per flush of a flushed schedule (simulating one holds 2 S
# rows per micro-batch: 10,000 take about ten seconds; a bigger count is a typo). Both from the plan file's reader.


def _ceil_tol(x: float) -> int:
    """ceil with a relative tolerance: 2.0000000001 -> 2."""
    r = round(x)
    if abs(x - r) <= REL_TOL * max(1.0, abs(x)):
        return int(r)
    return int(math.ceil(x))


def in_flight(fwd_start: float, bwd_end: float, period: float) -> int:
    """k = ceil((end of backward - start of forward) / T), at least 1."""
    if period <= 0 or not math.isfinite(period):
        return 1
    return max(1, _ceil_tol((bwd_end - fwd_start) / period))


def stages_of(assignment: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive layers on one device, as (first, last)."""
    out: list[tuple[int, int]] = []
    start = 0
    for _, run in groupby(assignment):
        n = sum(1 for _ in run)
        out.append((start, start + n - 1))
        start += n
    return out


@dataclass(frozen=True)
class Stage:
    """A maximal run ``first..last`` of layers on ``device``; start times of mini-batch 0."""

    first: int
    last: int
    device: int
    fwd_start: float
    bwd_start: float
    in_flight: int = 1

    @property
    def layers(self) -> tuple[int, int]:
        return (self.first, self.last)


@dataclass(frozen=True)
class Plan:
    """A periodic (or flushed) pipeline plan. Times in seconds, memory in bytes.

    ``schedule`` is ``"periodic"`` for plans under the rules of docs/model.md
    ("Plan"), or ``"gpipe"``/``"1f1b"`` for flushed schedules (then
    ``period`` is makespan / micro_batches and ``memory`` the simulated peak).
    """

    period: float
    assignment: tuple[int, ...]
    stages: tuple[Stage, ...]
    devices: int
    memory: tuple[float, ...] = ()
    memory_limit: float = math.inf
    lower_bound: float = 0.0
    method: str = ""
    allocation: str = "contiguous"
    status: Status = "feasible"
    gap: float | None = None
    solve_seconds: float = 0.0
    schedule: str = "periodic"
    micro_batches: int | None = None
    chain_order: tuple[str, ...] | None = None
    notes: tuple[str, ...] = ()
    #: what the planner records beyond the fields above: keys and types in :class:`workbench.model.plan_extra.PlanExtra`
    extra: PlanExtra = field(default_factory=dict, compare=False, hash=False)  # type: ignore[assignment]
    #: the memory set-up the plan's memory was computed with (:func:`memory_setup`; read it as a
    #: :class:`~workbench.model.training_setup.TrainingSetup` with ``TrainingSetup.from_memory_setup(plan.setup)``)
    setup: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: one activation policy per layer, in layer order (docs/model.md, "Activation policies");
    #: empty means every layer keeps its activations
    activations: tuple[str, ...] = ()
    #: a layout's plan (docs/model.md, "Layouts"): the JSON's top-level ``parallel``, ``tokens_per_second``,
    #: ``mfu``, ``step_seconds``, ``frontier``, ... (:data:`~workbench.model.layout.LAYOUT_KEYS`); empty for a
    #: plan of one pipeline (``tp = dp = 1``). The plan's own fields are one replica's pipeline: ``devices`` its
    #: ``pp`` ranks.
    parallel: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def feasible(self) -> bool:
        return self.status != "infeasible" and math.isfinite(self.period)

    @property
    def throughput(self) -> float:
        return 1.0 / self.period if self.feasible and self.period > 0 else 0.0

    @property
    def peak_memory(self) -> float:
        return max(self.memory) if self.memory else 0.0

    @property
    def fits(self) -> bool:
        return self.feasible and all(m <= self.memory_limit * (1 + REL_TOL) for m in self.memory)

    def ratio_to_bound(self) -> float:
        return self.period / self.lower_bound if self.lower_bound > 0 and self.feasible else math.inf

    # ----- JSON (docs/model.md, "JSON") -------------------------------------
    def to_dict(self) -> dict[str, Any]:
        fin = lambda x: x if (x is not None and math.isfinite(x)) else None  # noqa: E731
        d: dict[str, Any] = {
            "method": self.method,
            "allocation": self.allocation,
            "status": self.status,
            "period": fin(self.period),
            "throughput": self.throughput,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "devices": self.devices,
            "memory_limit": fin(self.memory_limit),
            "assignment": list(self.assignment),
            "stages": [
                {"layers": [s.first, s.last], "device": s.device, "fwd_start": s.fwd_start,
                 "bwd_start": s.bwd_start, "in_flight": s.in_flight}
                for s in self.stages
            ],
            "memory": list(self.memory),
            "solve_seconds": self.solve_seconds,
            "schedule": self.schedule,
        }
        if self.micro_batches is not None:
            d["micro_batches"] = self.micro_batches
        if self.chain_order is not None:
            d["chain_order"] = list(self.chain_order)
        if self.notes:
            d["notes"] = list(self.notes)
        if self.extra:
            d["extra"] = self.extra
        if self.setup:   # an infinite link (an API platform's) as null, which check and simulate read as infinite
            d["memory_setup"] = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                                 for k, v in self.setup.items()}
        if self.assignment:
            d["activations"] = list(self.activations) if self.activations else ["keep"] * len(self.assignment)
        if self.parallel:
            d.update(every_rank_json(self.parallel, list(self.memory)))
        return d

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            write_text_atomic(path, text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        """A plan from its JSON object; a :class:`ValueError` naming the field for anything else.

        Every number must be finite (``period`` and ``memory_limit`` may be null: infinite),
        devices, layers and in-flight counts whole numbers, ``devices`` at most ``MAX_DEVICES``.

        >>> Plan.from_dict({"devices": 2, "period": float("nan")})
        Traceback (most recent call last):
        ValueError: period: nan is not a finite number
        >>> Plan.from_dict([1, 2])
        Traceback (most recent call last):
        ValueError: a plan is a JSON object, got a list
        """
        fields = plan_fields(d)
        return cls(**{**fields, "stages": tuple(Stage(*s) for s in fields["stages"])})

    @classmethod
    def from_json(cls, path_or_text: str | Path) -> "Plan":
        """A plan from a JSON file (a :class:`Path`, or a string naming an existing file) or JSON text.

        Errors name the file and the field; ``NaN`` and ``Infinity`` are refused.
        """
        p = Path(path_or_text)
        text = str(path_or_text)
        where = "plan JSON"
        is_file = not text.lstrip().startswith("{") and (p.exists() or text.endswith(".json"))
        if isinstance(path_or_text, Path) or is_file:
            where = str(p)
            if p.is_dir():
                raise ValueError(f"{p}: is a folder, not a plan file")
            if not p.exists():
                raise FileNotFoundError(f"{p}: no such plan file")
            try:
                text = p.read_text()
            except UnicodeDecodeError as e:
                raise ValueError(f"{p}: not a text file ({e})") from None
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e})") from None
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        except RecursionError:
            raise ValueError(f"{where}: nested too deep to be a plan (a plan JSON is an object of numbers, "
                             "lists and objects a few levels deep)") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def with_(self, **kw: Any) -> "Plan":
        return replace(self, **kw)

    def summary(self) -> str:
        if not self.feasible:
            why = "; ".join(self.notes) if self.notes else "no plan"
            word = "timeout, no plan" if self.status == "timeout" else "infeasible"
            return f"{self.method} ({self.allocation}): {word}: {why}"
        mem = ", ".join(f"GPU{p}: {format_bytes(m)}" for p, m in enumerate(self.memory))
        lim = format_bytes(self.memory_limit)
        # two different bounds: the gap is against the best bound the method proved, the ratio against
        # the simple bound max(compute / P, largest layer) that every plan records
        gap = (f"; gap {self.gap:.1%} to the bound the method proved, "
               f"{format_seconds(self.period * (1 - self.gap))}") if self.gap else ""
        acts = ""
        if self.activations:
            acts = f"\n  activations: {describe(self.activations)}"
        return (
            f"{self.method} ({self.allocation}, {self.schedule}): status {self.status}{gap}\n"
            f"  period {format_seconds(self.period)}  throughput {self.throughput:.3f} mini-batches/s  "
            f"ratio {self.ratio_to_bound():.3f} to the simple bound max(compute / P, largest layer) "
            f"= {format_seconds(self.lower_bound)}\n"
            f"  {len(self.stages)} stages on {self.devices} devices; memory per device (limit {lim}): {mem}\n"
            f"  solved in {self.solve_seconds:.2f} s{acts}"
        )



def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in the plan (JSON has no NaN or Infinity; write null for "
                     f"an infinite period or memory limit)")






def lower_bound(chain: Chain, platform: Target) -> float:
    """max( sum of compute / P, largest layer compute ): no plan has a smaller period."""
    comp = chain.forward + chain.backward
    return float(max(comp.sum() / platform.devices, comp.max()))


def stage_in_flight(chain: Chain, platform: Target, period: float, first: int, last: int,
                    fwd_start: float, bwd_start: float) -> int:
    c = chain.stage_costs(first, last)
    return in_flight(fwd_start, bwd_start + c.backward, period)


def device_memory(chain: Chain, platform: Target, stages: Sequence[Stage]) -> list[float]:
    """Rule 7: memory of every device given stages with their in-flight counts
    (:func:`workbench.model.memory_views.plan_memory`)."""
    return plan_memory(chain, platform, stages)


def make_plan(
    chain: Chain,
    platform: Target,
    period: float,
    assignment: Sequence[int],
    fwd_start: Sequence[float],
    bwd_start: Sequence[float],
    *,
    method: str = "",
    allocation: str | None = None,
    status: Status = "feasible",
    gap: float | None = None,
    solve_seconds: float = 0.0,
    **kw: Any,
) -> Plan:
    """Build a periodic plan, deriving stages, in-flight counts, memory and the bound.

    ``fwd_start``/``bwd_start`` are per stage, in chain order (see :func:`stages_of`).
    """
    assignment = tuple(int(a) for a in assignment)
    if len(assignment) != len(chain):
        raise ValueError(f"assignment has {len(assignment)} entries for a chain of {len(chain)} layers")
    runs = stages_of(assignment)
    if len(fwd_start) != len(runs) or len(bwd_start) != len(runs):
        raise ValueError(f"need start times for {len(runs)} stages, got {len(fwd_start)} and {len(bwd_start)}")
    stages = tuple(
        Stage(a, b, assignment[a], float(f), float(bw),
              stage_in_flight(chain, platform, period, a, b, float(f), float(bw)))
        for (a, b), f, bw in zip(runs, fwd_start, bwd_start)
    )
    if allocation is None:
        allocation = "contiguous" if len({s.device for s in stages}) == len(stages) else "general"
    kw = with_memory_setup(chain, platform, kw)
    return Plan(
        period=float(period),
        assignment=assignment,
        stages=stages,
        devices=platform.devices,
        memory=tuple(device_memory(chain, platform, stages)),
        memory_limit=platform.memory_limit,
        lower_bound=lower_bound(chain, platform),
        method=method,
        allocation=allocation,
        status=status,
        gap=gap,
        solve_seconds=solve_seconds,
        **kw,
    )


def infeasible_plan(chain: Chain, platform: Target, method: str, why: str, *,
                    allocation: str = "contiguous", solve_seconds: float = 0.0, **kw: Any) -> Plan:
    """A plan value saying no plan exists (or none was found), and why."""
    kw = with_memory_setup(chain, platform, {**kw, "notes": (why,) + tuple(kw.get("notes", ()))})
    return Plan(
        period=math.inf, assignment=(), stages=(), devices=platform.devices, memory=(),
        memory_limit=platform.memory_limit, lower_bound=lower_bound(chain, platform), method=method,
        allocation=allocation, status="infeasible", solve_seconds=solve_seconds, **kw,
    )


def with_memory_setup(chain: Chain, platform: Target, kw: dict[str, Any]) -> dict[str, Any]:
    """Plan keywords ``kw`` with the memory ``setup`` recorded and, when the profile lacked memory
    columns, a note saying they were estimated (every plan builder passes its keywords through here)."""
    kw = dict(kw)
    note = estimate_note(chain, platform)
    if note is not None and note not in kw.get("notes", ()):
        kw["notes"] = tuple(kw.get("notes", ())) + (note,)
    kw.setdefault("setup", memory_setup(chain, platform))
    return kw


def memory_setup(chain: Chain, platform: Target) -> dict[str, Any]:
    """What a plan's memory figures assume: the memory model, optimizer, precision, weight policy, training
    loop (``zero_grad``) (and the weight factor in the paper model), the profile columns that were
    estimated, and a layout's data-parallel group (``dp``, ``zero``) where dp > 1.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> memory_setup(Chain((Layer("a", 1, 1),)), Target.of(1, optimizer="sgd"))["optimizer"]
    'sgd'
    """
    setup = platform.setup
    if setup.paper:
        return setup.memory_setup()
    terms = layer_terms(chain, platform)      # the precision recorded is the one computed with (None: the profile's)
    out = replace(setup, precision=terms.parts["precision"]).memory_setup(terms.estimated)
    if platform.layout.dp > 1:                # each rank's data-parallel group: the layout's
        out.update(dp=platform.layout.dp, zero=platform.layout.zero)
    return out


def chain_for_plan(plan: Plan, chain: Chain) -> Chain:
    """The chain a plan's layer indices refer to.

    A graph planner may re-order a DAG's nodes; it records the order in
    ``plan.chain_order`` (layer names). This returns ``chain`` itself when the
    order is the chain's own, else the DAG re-linearised in that order
    (``chain.graph.linearise(order)``, which recomputes the cut volumes).
    """
    if plan.chain_order is None or tuple(plan.chain_order) == tuple(l.name for l in chain.layers):
        return chain
    if chain.graph is None:
        raise ValueError("the plan uses its own layer order (chain_order) but the profile has no graph to re-order")
    return chain.graph.linearise(list(plan.chain_order))
