"""The checker: re-derive a plan from the chain and list every rule it breaks (docs/model.md, "Plan").

Nothing recorded in the plan is trusted: stage costs, boundary costs,
in-flight counts and memory are recomputed from the chain and the platform.
Recorded in-flight counts and memory that disagree with the recomputation
are reported under rule 7 too. Rule 0 collects structural faults (the plan
does not describe the chain: wrong length, stages that do not cover it in
order, a stage on another device than its layers, a bad period).

Rules: 0 structure, 1 allocation, 2 forward order, 3 turn-around,
4 backward order, 5 overlap on a device, 6 link load, 7 memory, 8 host link.
A plan's activation policies (``plan.activations``) are applied to the chain
first, by the checker's own reading of docs/model.md (:mod:`workbench.verify.check_policies`).
Flushed schedules (GPipe, 1F1B, torch's multi-stage schedules: a plan whose ``schedule`` is flushed in
:mod:`workbench.schedules.registry`) are replayed instead of rules 2-6
(:mod:`workbench.verify.check_flushed`: layout, order, period, memory). :func:`structural_violations` is
rules 0 and 1 alone: what the simulator requires before it runs a plan.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.plan import make_plan
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
>>> plat = Target.of(2, memory=100, memory_model="paper")
>>> good = make_plan(chain, plat, 0.006, [0, 0, 1, 1], [0.0, 0.002], [0.008, 0.004])
>>> check(good, chain, plat)
[]
>>> bad = make_plan(chain, plat, 0.006, [0, 0, 1, 1], [0.0, 0.001], [0.008, 0.004])
>>> print(check(bad, chain, plat)[0])
rule 2 (forward order): stage 1 (device 1) starts its forward at 1.00 ms, before stage 0's forward ends and its
output arrives at 2.00 ms (early by 1.00 ms)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from workbench.model.chain import Chain
from workbench.model.plan import Plan, chain_for_plan, in_flight, stages_of
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes, format_seconds
from workbench.schedules.registry import SCHEDULES
from workbench.verify.check_flushed import flushed_problems
from workbench.verify.check_memory import memory_by_device
from workbench.verify.check_policies import effective_chain, host_link_problems

__all__ = ["Violation", "RULES", "PlanStructureError", "check", "is_valid", "format_violations",
           "structural_violations", "require_structure"]

RULES: dict[int, str] = {
    0: "structure",
    1: "allocation",
    2: "forward order",
    3: "turn-around",
    4: "backward order",
    5: "overlap",
    6: "link load",
    7: "memory",
    8: "host link",
}


@dataclass(frozen=True)
class Violation:
    """One broken rule: its number, a readable message, where (stage/device) and by how much.

    ``amount`` is the excess in the rule's unit (seconds for rules 2-6, bytes
    for rule 7, 0 when not a quantity).

    >>> print(Violation(7, "device 1 holds 3.00 GiB, limit 2.00 GiB, over by 1.00 GiB", device=1, amount=2**30))
    rule 7 (memory): device 1 holds 3.00 GiB, limit 2.00 GiB, over by 1.00 GiB
    """

    rule: int
    message: str
    stage: int | None = None
    device: int | None = None
    amount: float = 0.0

    @property
    def name(self) -> str:
        return RULES.get(self.rule, "?")

    def __str__(self) -> str:
        return f"rule {self.rule} ({self.name}): {self.message}"


class PlanStructureError(ValueError):
    """A plan that does not describe the chain on the platform (rules 0 and 1); ``violations`` lists why."""

    def __init__(self, message: str, violations: Sequence[Violation]) -> None:
        super().__init__(message)
        self.violations = list(violations)


def _fmt_t(t: float) -> str:
    return format_seconds(t)


def _whole(x: object) -> bool:
    """A device index or count that is a whole number (an int, or a float equal to one)."""
    try:
        return float(x).is_integer()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _infeasible(plan: Plan) -> Violation:
    """Rule 0: an infeasible plan has nothing to check."""
    why = "; ".join(plan.notes) if plan.notes else "no reason given"
    return Violation(0, f"the plan is infeasible (status {plan.status}, period {plan.period}): "
                        f"nothing to check ({why})")


def _device_count(plan: Plan, P: int) -> list[Violation]:
    """Rule 0: the plan is for the platform's number of devices."""
    return [] if plan.devices == P else [Violation(0, f"the plan is for {plan.devices} devices, the platform has {P}")]


def _layer_devices(a: tuple, chain: Chain, P: int) -> list[Violation]:
    """Rule 1: every layer on one of the platform's devices (the first five named, then a count)."""
    bad = [(l, d) for l, d in enumerate(a) if not (_whole(d) and 0 <= d < P)]
    out = [Violation(1, f"layer {l} ({chain[l].name}) is on device {d}, not one of 0..{P - 1}",
                     device=d if _whole(d) else None) for l, d in bad[:5]]
    if len(bad) > 5:
        out.append(Violation(1, f"... and {len(bad) - 5} more layers on devices not in 0..{P - 1}"))
    return out


def _coverage(plan: Plan, L: int) -> list[Violation]:
    """Rule 0: the stages cover the chain's L layers in order (the first stage that does not, or the gap)."""
    expect = 0
    for i, s in enumerate(plan.stages):
        if s.first != expect or s.last < s.first or s.last >= L:
            return [Violation(0, f"stage {i} covers layers [{s.first}, {s.last}]; expected it to start at "
                                 f"layer {expect} and end before layer {L} (stages must cover the chain in order)",
                              stage=i)]
        expect = s.last + 1
    if expect != L or not plan.stages:
        return [Violation(0, f"the stages cover layers 0..{expect - 1} of 0..{L - 1}")]
    return []


def _stage_records(plan: Plan, a: tuple) -> tuple[list[Violation], bool]:
    """Rule 0, per stage: a whole in-flight count of at least 1, and the device its layers are on.
    Returns the violations and whether every stage's device agrees with the assignment."""
    out: list[Violation] = []
    usable = True
    for i, s in enumerate(plan.stages):
        if not _whole(s.in_flight) or s.in_flight < 1:
            out.append(Violation(0, f"stage {i} records {s.in_flight} mini-batches in flight, not a whole number "
                                    f"of at least 1", stage=i))
        devs = set(a[s.first:s.last + 1])
        if devs != {s.device}:
            out.append(Violation(0, f"stage {i} (layers {s.first}..{s.last}) says device {s.device} but its layers "
                                    f"are assigned to device(s) {sorted(devs)}", stage=i, device=s.device))
            usable = False
    return out, usable


def _maximal_runs(plan: Plan, a: tuple) -> list[Violation]:
    """Rule 0: a stage is a maximal run of layers on one device (no two neighbours on one device), except in
    torch's V schedules, whose two middle stages share the last device (their layout is checked instead)."""
    if stages_of(a) == [(s.first, s.last) for s in plan.stages]:
        return []
    if plan.schedule in SCHEDULES and SCHEDULES[plan.schedule].stages_meet:
        return []
    st = plan.stages
    return [Violation(0, f"stages {i} and {i + 1} are both on device {st[i].device}: "
                         f"a stage must be a maximal run of layers on one device", stage=i + 1, device=st[i].device)
            for i in range(len(st) - 1) if st[i].device == st[i + 1].device]


def _contiguous(plan: Plan) -> list[Violation]:
    """Rule 1: a contiguous plan puts at most one stage on each device."""
    if plan.allocation != "contiguous":
        return []
    out: list[Violation] = []
    seen: dict[int, int] = {}
    for i, s in enumerate(plan.stages):
        if s.device in seen:
            out.append(Violation(1, f"contiguous plan but device {s.device} holds stages {seen[s.device]} "
                                    f"and {i}", stage=i, device=s.device))
        else:
            seen[s.device] = i
    return out


def _schedule(plan: Plan) -> list[Violation]:
    """Rule 0: the plan names a schedule the workbench knows."""
    if plan.schedule in SCHEDULES:
        return []
    return [Violation(0, f"unknown schedule {plan.schedule!r}; a plan's schedule is one of {', '.join(SCHEDULES)}")]


def _micro_batches(plan: Plan) -> list[Violation]:
    """Rule 0: a flushed plan says how many micro-batches a flush holds."""
    if not SCHEDULES[plan.schedule].flushed or (_whole(plan.micro_batches) and plan.micro_batches >= 1):
        return []
    return [Violation(0, f"a {plan.schedule} plan needs micro_batches, a whole number of at least 1, "
                         f"got {plan.micro_batches}")]


def _timing(plan: Plan) -> list[Violation]:
    """Rule 0: a positive finite period (a flushed plan's too: its makespan over its micro-batches) and finite
    start times."""
    out: list[Violation] = []
    if not (plan.period > 0 and math.isfinite(plan.period)):
        out.append(Violation(0, f"the period must be positive and finite, got {plan.period}"))
    for i, s in enumerate(plan.stages):
        if not (math.isfinite(s.fwd_start) and math.isfinite(s.bwd_start)):
            out.append(Violation(0, f"stage {i} has a non-finite start time (forward {s.fwd_start}, "
                                    f"backward {s.bwd_start})", stage=i, device=s.device))
    return out


def _structure(plan: Plan, chain: Chain, platform: Target) -> tuple[list[Violation], bool]:
    """Rules 0 and 1. Returns the violations and whether the stages are usable for rules 2-7."""
    if not plan.feasible:
        return [_infeasible(plan)], False
    L, P = len(chain), platform.devices
    unknown = _schedule(plan)
    if unknown:
        return unknown, False
    out = _device_count(plan, P)
    a = tuple(plan.assignment)
    if len(a) != L:
        return out + [Violation(0, f"the assignment has {len(a)} entries for a chain of {L} layers")], False
    off_platform = _layer_devices(a, chain, P)
    out += off_platform
    cover = _coverage(plan, L)
    if cover:
        return out + cover, False
    records, devices_agree = _stage_records(plan, a)
    out += records
    usable = devices_agree and not off_platform
    if usable:
        out += _maximal_runs(plan, a) + _contiguous(plan)
    timing = _timing(plan)
    return out + _micro_batches(plan) + timing, usable and not timing


def structural_violations(plan: Plan, chain: Chain, platform: Target) -> list[Violation]:
    """Rules 0 and 1 alone: does the plan describe ``chain`` on ``platform`` (layers, stages, devices,
    a positive finite period, finite start times)? The simulator needs nothing more to run a plan.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.plan import make_plan
    >>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    >>> plan = make_plan(chain, Target.of(2), 0.006, [0, 0, 1, 1], [0.0, 0.002], [0.008, 0.004])
    >>> structural_violations(plan.with_(period=-1.0), chain, Target.of(2))[0].message
    'the period must be positive and finite, got -1.0'
    """
    return _structure(plan, chain_for_plan(plan, chain), platform)[0]


def require_structure(plan: Plan, chain: Chain, platform: Target, what: str = "use") -> None:
    """Raise :class:`PlanStructureError` listing :func:`structural_violations`, if there are any."""
    bad = structural_violations(plan, chain, platform)
    if bad:
        lines = "\n".join(f"  {v}" for v in bad)
        raise PlanStructureError(f"cannot {what} this plan: it does not describe the chain of {len(chain)} layers "
                                 f"on {platform.devices} devices:\n{lines}", bad)


@dataclass(frozen=True)
class _Timing:
    """A periodic plan's times recomputed from the chain: period ``T``, per stage its costs, the
    boundary cost after it (``comm``, 0 after the last), its start times ``f`` and ``b``; ``tol`` the
    absolute tolerance (``REL_TOL`` of the largest time)."""

    T: float
    stages: Sequence
    costs: list
    comm: list[float]
    f: list[float]
    b: list[float]
    tol: float

    @classmethod
    def of(cls, plan: Plan, chain: Chain, platform: Target) -> "_Timing":
        T = float(plan.period)
        st = plan.stages
        S = len(st)
        costs = [chain.stage_costs(s.first, s.last) for s in st]
        # boundary cost after each stage, asked of the platform for its pair of devices
        comm = [platform.comm_time(chain.cut(st[i].last), st[i].device, st[i + 1].device) if i + 1 < S else 0.0
                for i in range(S)]
        f = [s.fwd_start for s in st]
        b = [s.bwd_start for s in st]
        scale = max([T] + [abs(x) for x in f] + [abs(x) for x in b])
        return cls(T, st, costs, comm, f, b, REL_TOL * scale)


def _forward_order(t: _Timing) -> list[Violation]:
    """Rule 2: a stage's forward starts once the previous stage's forward ends and its output arrives."""
    out: list[Violation] = []
    st, f = t.stages, t.f
    for i in range(len(st) - 1):
        need = f[i] + t.costs[i].forward + t.comm[i]
        if f[i + 1] < need - t.tol:
            out.append(Violation(2, f"stage {i + 1} (device {st[i + 1].device}) starts its forward at "
                                    f"{_fmt_t(f[i + 1])}, before stage {i}'s forward ends and its output arrives "
                                    f"at {_fmt_t(need)} (early by {_fmt_t(need - f[i + 1])})",
                                 stage=i + 1, device=st[i + 1].device, amount=need - f[i + 1]))
    return out


def _turn_around(t: _Timing) -> list[Violation]:
    """Rule 3: the last stage's backward starts once its forward ends."""
    last = len(t.stages) - 1
    need = t.f[last] + t.costs[last].forward
    if t.b[last] >= need - t.tol:
        return []
    device = t.stages[last].device
    return [Violation(3, f"the last stage {last} (device {device}) starts its backward at "
                         f"{_fmt_t(t.b[last])}, before its forward ends at {_fmt_t(need)} "
                         f"(early by {_fmt_t(need - t.b[last])})", stage=last, device=device, amount=need - t.b[last])]


def _backward_order(t: _Timing) -> list[Violation]:
    """Rule 4: a stage's backward starts once the next stage's backward ends and the gradient arrives."""
    out: list[Violation] = []
    st, b = t.stages, t.b
    for i in range(len(st) - 1):
        need = b[i + 1] + t.costs[i + 1].backward + t.comm[i]
        if b[i] < need - t.tol:
            out.append(Violation(4, f"stage {i} (device {st[i].device}) starts its backward at {_fmt_t(b[i])}, "
                                    f"before stage {i + 1}'s backward ends and the gradient arrives at "
                                    f"{_fmt_t(need)} (early by {_fmt_t(need - b[i])})",
                                 stage=i, device=st[i].device, amount=need - b[i]))
    return out


def _device_overlaps(t: _Timing, d: int, ops: list[tuple[str, int, float, float]]) -> list[Violation]:
    """Rule 5 on device d: every pair of its operations ``(kind, stage, start, length)`` apart modulo T."""
    out: list[Violation] = []
    T, tol = t.T, t.tol
    for x in range(len(ops)):
        for y in range(x + 1, len(ops)):
            kx, sx, x0, dx = ops[x]
            ky, sy, y0, dy = ops[y]
            r1 = (y0 - x0) % T  # how long after x starts y starts (mod T)
            r2 = (x0 - y0) % T
            if r1 < dx - tol or r2 < dy - tol:
                over = max(dx - r1, dy - r2)
                out.append(Violation(5, f"device {d}: the {kx} of stage {sx} ({_fmt_t(x0)} + {_fmt_t(dx)}) and "
                                        f"the {ky} of stage {sy} ({_fmt_t(y0)} + {_fmt_t(dy)}) overlap modulo "
                                        f"the period {_fmt_t(T)} (by {_fmt_t(over)})",
                                     stage=sy, device=d, amount=over))
    return out


def _overlap(t: _Timing) -> list[Violation]:
    """Rule 5: per device, its load within the period, then no two operations overlapping modulo T."""
    ops_by_dev: dict[int, list[tuple[str, int, float, float]]] = {}
    for i, s in enumerate(t.stages):
        ops_by_dev.setdefault(s.device, []).append(("forward", i, t.f[i], t.costs[i].forward))
        ops_by_dev.setdefault(s.device, []).append(("backward", i, t.b[i], t.costs[i].backward))
    out: list[Violation] = []
    for d in sorted(ops_by_dev):
        ops = [o for o in ops_by_dev[d] if o[3] > 0]
        load = sum(o[3] for o in ops)
        if load > t.T + t.tol:
            out.append(Violation(5, f"device {d} load {_fmt_t(load)} exceeds the period {_fmt_t(t.T)} "
                                    f"(by {_fmt_t(load - t.T)})", device=d, amount=load - t.T))
        else:
            out += _device_overlaps(t, d, ops)
    return out


def _link_load(t: _Timing) -> list[Violation]:
    """Rule 6: per ordered pair of devices, the transfers of one period (both ways) fit in it."""
    links: dict[tuple[int, int], float] = {}
    st = t.stages
    for i in range(len(st) - 1):
        p, q = st[i].device, st[i + 1].device
        c = t.comm[i]
        if p == q or c <= 0:
            continue
        links[(p, q)] = links.get((p, q), 0.0) + c
        links[(q, p)] = links.get((q, p), 0.0) + c
    return [Violation(6, f"link {p}->{q} carries {_fmt_t(load)} of transfers per period, more than the "
                         f"period {_fmt_t(t.T)} (by {_fmt_t(load - t.T)})", device=p, amount=load - t.T)
            for (p, q), load in sorted(links.items()) if load > t.T + t.tol]


def _memory(t: _Timing, chain: Chain, platform: Target) -> tuple[list[Violation], list[float]]:
    """Rule 7: recorded in-flight counts against the windows, then each device's memory against its
    limit. Returns the violations and each device's recomputed memory."""
    out: list[Violation] = []
    counted = []
    for i, s in enumerate(t.stages):
        window_end = t.b[i] + t.costs[i].backward
        k = in_flight(t.f[i], window_end, t.T)
        if s.in_flight != k:
            out.append(Violation(7, f"stage {i} (device {s.device}) records {s.in_flight} mini-batches in flight; "
                                    f"its window {_fmt_t(window_end - t.f[i])} over the period "
                                    f"{_fmt_t(t.T)} gives {k}",
                                 stage=i, device=s.device, amount=float(k - s.in_flight)))
        counted.append((s.first, s.last, s.device, k))
    mem = memory_by_device(chain, platform, counted)
    for d in range(platform.devices):
        M = platform.memory_of(d)
        if mem[d] > M * (1 + REL_TOL):
            out.append(Violation(7, f"device {d} holds {format_bytes(mem[d])}, limit {format_bytes(M)}, "
                                    f"over by {format_bytes(mem[d] - M)}", device=d, amount=mem[d] - M))
    return out, mem


def _recorded_memory(plan: Plan, mem: list[float], devices: int) -> list[Violation]:
    """Rule 7: the memory the plan records (if any) agrees with the recomputation."""
    if not plan.memory:
        return []
    if len(plan.memory) != devices:
        return [Violation(7, f"the plan records memory for {len(plan.memory)} devices, the platform has {devices}")]
    return [Violation(7, f"device {d}: the plan records {format_bytes(rec)} of memory, the "
                         f"recomputation gives {format_bytes(m)}", device=d, amount=abs(rec - m))
            for d, (rec, m) in enumerate(zip(plan.memory, mem)) if abs(rec - m) > REL_TOL * max(abs(m), abs(rec), 1.0)]


def check(plan: Plan, chain: Chain, platform: Target) -> list[Violation]:
    """Every violated rule of docs/model.md, "Plan", recomputed from ``chain`` and ``platform``.

    An empty list means the plan is valid. Comparisons use the relative
    tolerance ``REL_TOL`` (1e-6) of the period (times) or of the limit (memory).
    """
    chain = chain_for_plan(plan, chain)
    out, usable = _structure(plan, chain, platform)
    if not usable:
        return out
    if SCHEDULES[plan.schedule].flushed:     # replayed (layout, order, period, memory)
        if plan.activations and any(p != "keep" for p in plan.activations):
            chain = effective_chain(chain, plan.activations)
        return out + [Violation(**v) for v in flushed_problems(plan, chain, platform)]
    if plan.activations and any(p != "keep" for p in plan.activations):
        try:
            chain = effective_chain(chain, plan.activations)
        except ValueError as e:
            return out + [Violation(0, str(e))]
    t = _Timing.of(plan, chain, platform)
    out += _forward_order(t) + _turn_around(t) + _backward_order(t) + _overlap(t) + _link_load(t)
    memory, mem = _memory(t, chain, platform)
    out += memory
    # rule 8: the host link (offloaded activations)
    out.extend(Violation(**v) for v in host_link_problems(chain, platform, t.T, t.stages, t.tol))
    return out + _recorded_memory(plan, mem, platform.devices)


def is_valid(plan: Plan, chain: Chain, platform: Target) -> bool:
    """True when :func:`check` finds nothing."""
    return not check(plan, chain, platform)


def format_violations(violations: Sequence[Violation], devices: int) -> str:
    """A devices x rules grid marking where the violations are (with its legend), then the messages.

    >>> print(format_violations([Violation(5, "overlap", device=1)], 2))
    rules: 0 structure, 1 allocation, 2 forward order, 3 turn-around, 4 backward order, 5 overlap, 6 link load, 7 memory
    X: the rule is broken on that device; row '-': broken for the plan as a whole (or on a device it does not have)
    device | 0 1 2 3 4 5 6 7
    -      | . . . . . . . .
    0      | . . . . . . . .
    1      | . . . . . X . .
    1 violation(s):
      rule 5 (overlap): overlap
    """
    if not violations:
        return "valid: no rule is violated"
    shown = [r for r in RULES if r < 8 or any(v.rule == r for v in violations)]   # rule 8 only when broken
    rows: list[str] = [
        "rules: " + ", ".join(f"{r} {RULES[r]}" for r in shown),
        "X: the rule is broken on that device; row '-': broken for the plan as a whole "
        "(or on a device it does not have)",
        "device | " + " ".join(str(r) for r in shown)]
    for d in [None] + list(range(devices)):
        marks = []
        for r in shown:
            hit = any(v.rule == r and (v.device == d or (d is None and v.device is not None
                                                         and not (0 <= v.device < devices)))
                      for v in violations)
            marks.append("X" if hit else ".")
        rows.append(f"{'-' if d is None else d:<6} | " + " ".join(marks))
    rows.append(f"{len(violations)} violation(s):")
    rows.extend(f"  {v}" for v in violations)
    return "\n".join(rows)
