"""The one phase runner of the ILP: every variant is a list of phases run in order until one settles.

The three variants (docs/model.md, "Planners") are each a list of phases:
:func:`workbench.planners.ilp.phases.solve_chain` (keep, on one chain),
:func:`workbench.planners.ilp.coarse.plan_coarse` (long chains, on blocks) and
:func:`workbench.planners.ilp.auto.plan_ilp_auto` (activation policies chosen per layer).
:func:`run_phases` runs such a list. A phase is a function of the :class:`Run` (the instance,
the options, the budget and what the phases before it left) that returns

* a :class:`PhaseResult`: the incumbent and the proven bound after it, its
  :class:`~workbench.model.plan_extra.PhaseRecord`, and a :class:`Verdict` when it settles the answer;
* a bare :class:`Verdict`: a check that settles the answer without work of its own (no record);
* None: the phase does not apply (the runner goes on to the next).

The first verdict ends the run: :func:`finish` turns it into the plan, which records every
phase, the phase whose plan it is (``found_by``) and the one that proved its bound
(``bound_by``) in ``extra["solve"]`` (:class:`~workbench.model.plan_extra.SolveRecord`).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.budget import Budget
>>> from workbench.planners.ilp.options import IlpOptions
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(2)))
>>> run = Run(ch, Target.of(1, memory_model="paper"), "contiguous", IlpOptions(), Budget())
>>> p = run_phases(run, [lambda r: None, lambda r: Verdict("infeasible", notes=("nothing fits",))])
>>> p.status, p.notes, p.extra["solve"]["phases"]
('infeasible', ('nothing fits',), [])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from workbench.model.chain import Chain
from workbench.model.plan import Plan, infeasible_plan
from workbench.model.plan_extra import PhaseRecord, SolveRecord, phase_record
from workbench.model.target import Target
from workbench.planners.budget import MAY_VARY, Budget
from workbench.planners.ilp.options import IlpOptions
from workbench.verify.check import check

__all__ = ["Verdict", "PhaseResult", "Run", "Phase", "run_phases", "finish"]


@dataclass(frozen=True)
class Verdict:
    """How a phase settles the answer: the status and gap of the incumbent (or, without one, why not),
    notes to add, extra fields, the phase that proved the bound (None: the run's), and what the gap
    is measured against (for the progress line)."""

    status: str
    gap: float = 0.0
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    bound_by: str | None = None
    against: str = ""


@dataclass(frozen=True)
class PhaseResult:
    """What a phase leaves: the incumbent, the proven bound (None: it proves none), its record, and a
    verdict if it settles."""

    plan: Plan | None
    bound: float | None
    record: PhaseRecord
    verdict: Verdict | None = None


class Run:
    """One solve: the instance, options and budget, the incumbent, bound, notes and records so far."""

    def __init__(self, chain: Chain, platform: Target, allocation: str, opts: IlpOptions, budget: Budget) -> None:
        self.chain, self.platform, self.allocation, self.opts, self.budget = chain, platform, allocation, opts, budget
        self.general = allocation == "general" and platform.devices > 1
        self.inc: Plan | None = None
        self.bound = 0.0
        self.notes: list[str] = []
        self.records: list[PhaseRecord] = []
        self.found_by: str | None = None
        self.bound_by: str | None = None
        self.need, self.why = 0.0, ""
        self.background: Any = None     #: a search running on another core (workbench.planners.ilp.background)
        self._t = budget.elapsed()

    def result(self, phase: str, plan: Plan | None, bound: float | None, outcome: str,
               verdict: Verdict | None = None, *, shown_bound: float | None = None) -> PhaseResult:
        """A phase's result, its record timed since the previous phase ended (``shown_bound``: the bound
        its record shows, when it is not one the run takes)."""
        now = self.budget.elapsed()
        period = plan.period if plan is not None else None
        rec = phase_record(phase, now - self._t, period, bound if shown_bound is None else shown_bound, outcome)
        self._t = now
        return PhaseResult(plan, bound, rec, verdict)

    def apply(self, res: PhaseResult) -> Verdict | None:
        """Take in a phase's result: a different plan becomes the incumbent (found by that phase), a
        higher bound the bound (proved by it)."""
        self.records.append(res.record)
        phase = res.record["phase"]
        if res.plan is not None and res.plan is not self.inc:
            self.inc, self.found_by = res.plan, phase
        if res.bound is not None and res.bound > self.bound:
            self.bound, self.bound_by = res.bound, phase
        return self.settle(res.verdict)

    def settle(self, verdict: Verdict | None) -> Verdict | None:
        """Take in a verdict (None: not settled yet): the phase it names proved the bound."""
        if verdict is not None and verdict.bound_by is not None:
            self.bound_by = verdict.bound_by
        return verdict

    def valid(self, plan: Plan) -> bool:
        """Whether ``plan`` is feasible and the checker accepts it on this run's chain and platform."""
        return plan.feasible and not check(plan, self.chain, self.platform)

    def meets_bound(self) -> bool:
        return self.inc is not None and self.inc.period <= self.bound * (1 + self.opts.rel_gap)

    def incumbent_note(self) -> str:
        return f"incumbent {self.inc.method} ({self.inc.allocation}) period {self.inc.period:.6g} s"

    def solve_record(self) -> SolveRecord:
        return SolveRecord(phases=list(self.records), found_by=self.found_by if self.inc is not None else None,
                           bound_by=self.bound_by)


#: a phase: the run so far -> its result, a verdict without work of its own, or None (it does not apply)
Phase = Callable[[Run], "PhaseResult | Verdict | None"]


def run_phases(run: Run, phases: Sequence[Phase]) -> Plan:
    """Run ``phases`` in order until one settles the answer, and return :func:`finish`'s plan (a background
    search a phase started is stopped whatever happens)."""
    try:
        for phase in phases:
            out = phase(run)
            if out is None:
                continue
            verdict = run.settle(out) if isinstance(out, Verdict) else run.apply(out)
            if verdict is not None:
                return finish(run, verdict)
    finally:
        if run.background is not None:
            run.background.stop()
    raise RuntimeError("the last phase of an ILP variant must settle the answer")


def finish(run: Run, v: Verdict) -> Plan:
    """The plan of a settled run: the incumbent with the verdict's status and gap, its notes, and the
    solve record; without an incumbent, an infeasible plan (status ``timeout`` if time ran out)."""
    budget = run.budget
    notes = list(run.notes) + list(v.notes)
    extra: dict[str, Any] = dict(v.extra)
    if budget.deterministic:
        extra["deterministic"] = not budget.cut_short
        extra["may_vary"] = budget.cut_short
        if budget.cut_short and run.inc is not None:
            notes.append(MAY_VARY)
    extra["solve"] = run.solve_record()
    if run.inc is None or v.status == "infeasible":
        p = infeasible_plan(run.chain, run.platform, "ilp", notes[-1] if notes else "no plan",
                            allocation=run.allocation, solve_seconds=budget.elapsed(), extra=extra)
        return p if v.status == "infeasible" else p.with_(status="timeout")
    plan = run.inc
    budget.say(f"ilp: {v.status}, period {plan.period:.6g} s" + (f", gap {v.gap:.1%}{v.against}" if v.gap else "")
               + f" ({budget.elapsed():.1f} s)")
    return plan.with_(method="ilp", allocation=run.allocation, status=v.status, gap=v.gap,
                      solve_seconds=budget.elapsed(), memory_limit=run.platform.memory_limit,
                      notes=tuple(plan.notes) + tuple(notes), extra={**plan.extra, **extra})
