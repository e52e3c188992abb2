"""torch's multi-stage schedules as planning methods, one per torch schedule of :mod:`workbench.schedules.registry`
(``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb``, ``zbv``, ``dualpipev``; docs/model.md, "Torch's schedules").

A plan is a partition of the chain into S = P V stages (V = ``chunks``
stages per device, fixed at 2 for the V schedules), laid out as torch lays
them out (:meth:`workbench.schedules.registry.Schedule.stage_devices`), run in the order
torch's own class produces (:func:`workbench.schedules.torch_orders.torch_order`) for
``micro_batches`` micro-batches (default 4 P), then a flush. It is simulated
(:func:`workbench.schedules.simulate_orders.simulate_order`): its period is the
makespan over the micro-batches, its memory the simulated peak per device.

**The partition, balanced by time under the memory limit.** The order does
not depend on the partition, and a device's memory changes only at its own
operations, so each device's peak is read off the order exactly, without
running the clock (:class:`workbench.schedules.order_memory.OrderMemory`: during each of its operations, per stage
the micro-batches held and the weight gradients pending, times the memory
model's terms, :mod:`workbench.model.memory`, plus the running operation's
excess; the optimizer's step after the flush). The search:

1. the time-balanced partition: the least largest stage time ``tau`` such that
   a partition has every stage within ``tau`` (bisection over the distinct stage
   times, each probe a DP over (stage, first layer) reachability), each stage then as close as allowed to
   an equal share of the compute left; if it fits, it is the plan;
2. otherwise seeds from shares of the limit per stage (equal per device, by
   need, by the most micro-batches the stage holds; a device's stages' needs
   added up bound its peak, so a partition within the shares fits), each
   improved by a local search that moves one stage boundary at a time to the
   best neighbour, first towards fitting, then towards a smaller largest
   stage time and more even device loads;
3. every candidate is simulated; the fastest that fits is the plan.

Without ``micro_batches`` the flush holds 4 P, 2 P or P micro-batches: of
those torch takes, the count whose plan is fastest within the limit (fewer
micro-batches hold less memory and add bubble). A heuristic, not
an optimum (status ``feasible``); on random small chains it finds a fitting
partition where exhaustive search does in 39 of 40 cases, 2.5 % slower on
average (``tests/test_torch_schedules.py`` holds the comparison). A plan that
cannot fit says so (``plan.fits`` is False), as the flushed schedules do.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1, 1) for i in range(8)), input_bytes=1)
>>> p = TORCH_PLANNERS["interleaved-1f1b"](ch, Target.of(2, memory_model="paper"), micro_batches=4)
>>> [(s.first, s.last, s.device) for s in p.stages], p.period   # (m v + p - 1)(f + b) / m = 9 x 6 / 4
([(0, 1, 0), (2, 3, 1), (4, 5, 0), (6, 7, 1)], 13.5)
"""

from __future__ import annotations

import time
from typing import Any, Callable

from workbench.model.chain import Chain
from workbench.model.plan import Plan, Stage, infeasible_plan, lower_bound, with_memory_setup
from workbench.model.split import split_note
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes, format_seconds
from workbench.planners.budget import Budget
from workbench.planners.torch_partition import Balance, Clock, Spans, candidates
from workbench.schedules.ops import Op
from workbench.schedules.order_memory import OrderMemory
from workbench.schedules.registry import TORCH_SCHEDULES
from workbench.schedules.simulate_orders import held_counts, simulate_order
from workbench.schedules.torch_orders import needs_torch, order_counts, torch_order, torch_schedule

__all__ = ["plan_torch_schedule", "TORCH_PLANNERS"]


#: seconds per operation of one flush that planning a micro-batch count costs (torch's order, the peaks, a
#: simulation and the plan's re-check; 50-100 us measured on the 2-core machine under load, for resnet50 on
#: 2-8 devices): the estimate that decides, under a time limit, which counts are planned
SECONDS_PER_OP = 1e-4
#: what a plan whose search the time limit cut says
MAY_VARY_CUT = "this result may differ between runs"


def plan_torch_schedule(chain: Chain, platform: Target, name: str, *, allocation: str = "contiguous",
                        time_limit: float | None = None, micro_batches: int | None = None,
                        chunks: int | None = None, flushes: int = 1, **options: Any) -> Plan:
    """Plan ``chain`` with torch's schedule ``name`` (see the module docstring). Without ``micro_batches``
    the flush holds 4 P, 2 P or P micro-batches, whichever torch takes and plans fastest (all three are tried).

    ``time_limit`` covers the whole call, the one-off import of ``torch.distributed.pipelining`` by the first
    order included (:func:`_plan_counts`: the counts are planned cheapest first, each within its share of what
    is left; a count whose estimated cost does not fit is not planned, and the plan's notes say so; with none
    planned, the answer is a time-out).
    """
    budget = Budget(time_limit)
    P = platform.devices
    sched = torch_schedule(name)
    V = sched.chunks(chunks)
    S = P * V
    if len(chain) < S:
        return infeasible_plan(chain, platform, name, f"{name} with {V} stages on each of {P} devices needs at least "
                               f"{S} layers; the chain has {len(chain)}", solve_seconds=budget.elapsed())
    if micro_batches is not None and int(micro_batches) < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches!r}")
    counts = [int(micro_batches)] if micro_batches is not None else [4 * P, 2 * P, P]
    say = options.get("progress") or (lambda line: None)
    cold = needs_torch(name, P, V, counts[0])
    say(f"{name}: {S} stages on {P} devices, {' or '.join(map(str, counts))} micro-batches, in the order torch's "
        f"{sched.torch_class} gives" + (" (asked of torch: importing torch.distributed.pipelining takes seconds, "
                                        "once; its answers are kept on disk)" if cold else ""))
    found, skipped = _plan_counts(chain, platform, name, counts, V, flushes, budget, micro_batches is None, say)
    if not found:
        why = "; ".join(skipped)
        return infeasible_plan(chain, platform, name, f"no plan within the time limit of {time_limit:g} s: {why}",
                               solve_seconds=budget.elapsed(), extra={"may_vary": True}).with_(status="timeout")
    _, _, parts, trace, m = min(found, key=lambda f: f[:2])
    p = _plan_of(chain, platform, name, sched.torch_class, parts, sched.stage_devices(P, S), trace, m, V, flushes,
                 sched.split_backward, budget.elapsed())
    if not skipped:
        return p
    # what the clock stopped depends on the machine's speed: the plan says so (extra["may_vary"], as the ILP's)
    return p.with_(notes=p.notes + tuple(skipped) + (f"the time limit cut the search short: {MAY_VARY_CUT}",),
                   extra={**p.extra, "may_vary": True})


def _plan_counts(chain: Chain, platform: Target, name: str, counts: list[int], V: int, flushes: int,
                 budget: Budget, optional: bool, say: Callable[[str], None]) -> tuple[list[tuple], list[str]]:
    """Each micro-batch count's best partition and trace, as ``((does not fit, period or peak), position in
    counts, parts, trace, count)``, and why counts were not planned. Under a time limit the counts go cheapest
    first, each with an equal share of what is left, and only where the estimate (the last count's seconds per
    operation, :data:`SECONDS_PER_OP` before the first) fits what is left; the first planned may use the
    limit's tolerance (10 % + 1 s). ``optional``: counts torch refuses are skipped (else its refusal raised).
    ``say`` is given a line per count (its period and peak, torch's refusal, or why it was not planned)."""
    P, S = platform.devices, platform.devices * V
    dev = torch_schedule(name).stage_devices(P, S)
    spans = Spans(chain, platform)
    ops = {m: _operations(name, S, m) * flushes for m in counts}
    todo = sorted(range(len(counts)), key=lambda i: ops[counts[i]]) if budget.limited else list(range(len(counts)))
    found: list[tuple] = []
    skipped: list[str] = []
    refused = ""
    rate = SECONDS_PER_OP
    for n, i in enumerate(todo):
        m = counts[i]
        if budget.limited:
            grace = 0.0 if found else 0.1 * (budget.seconds or 0.0) + 1.0
            need = ops[m] * rate
            if need > budget.left() + grace:
                skipped.append(f"{m} micro-batches not planned: {ops[m]} operations, about {need:.1f} s, "
                               f"{budget.left():.1f} s of the time limit left")
                say(f"{name}: {skipped[-1]}")
                continue
        if needs_torch(name, P, V, m):   # counted in the limit, not in the rate per operation
            import torch.distributed.pipelining.schedules  # noqa: F401
        t = time.perf_counter()
        share = budget.left() / (len(todo) - n) if budget.limited else None
        clock = Clock(None if share is None else t + share)
        try:
            order = torch_order(name, P, V, m)
        except ValueError as e:
            if not optional:
                raise
            refused = str(e)
            say(f"{name}: {m} micro-batches: {e}")
            continue
        parts, trace = _best_partition(spans, name, order, dev, m, flushes, clock)
        if clock.cut:
            skipped.append(f"{m} micro-batches: the time limit stopped the partition search")
            say(f"{name}: {skipped[-1]}")
        fits = float(trace.peak_memory().max()) <= platform.memory_limit * (1 + REL_TOL)
        say(f"{name}: {m} micro-batches: period {format_seconds(float(trace.period))}, peak "
            f"{format_bytes(float(trace.peak_memory().max()))}{'' if fits else ' (does not fit)'}")
        found.append(((not fits, float(trace.period) if fits else float(trace.peak_memory().max())), i, parts,
                      trace, m))
        rate = (time.perf_counter() - t) / ops[m]
    if not found and not skipped:
        raise ValueError(refused)
    return found, skipped


def _operations(name: str, stages: int, m: int) -> int:
    """The operations of one flush of ``m`` micro-batches on ``stages`` stages (a split backward is two)."""
    return stages * m * (3 if torch_schedule(name).split_backward else 2)


def _best_partition(spans: Spans, name: str, order: dict[int, tuple[Op, ...]], dev: list[int], m: int,
                    flushes: int, clock: Clock | None = None) -> tuple[list[tuple[int, int]], Any]:
    """The fastest candidate partition that fits (else the one needing least memory) and its simulated trace;
    past the ``clock``'s end no further candidate is searched or simulated (the first always is)."""
    chain, platform = spans.chain, spans.platform
    k, p, _ = order_counts(order, len(dev))
    prob = Balance(spans, dev, k, p)
    peaks = OrderMemory(chain, platform, dev, order)
    cache: dict[tuple, Any] = {}

    def simulated(parts: list[tuple[int, int]]):
        key = tuple(parts)
        if key not in cache:
            cache[key] = simulate_order(chain, platform, [(a, b, d) for (a, b), d in zip(parts, dev)], order, m,
                                        flushes, schedule=name)
        return cache[key]

    found = candidates(prob, peaks, platform.memory_limit, platform.devices, clock)
    tried = found[:1] + [c for c in found[1:] if clock is None or not clock.past()]
    fitting = [c for c in tried if float(simulated(c).peak_memory().max()) <= platform.memory_limit * (1 + REL_TOL)]
    chosen = min(fitting, key=lambda c: simulated(c).period) if fitting else \
        min(tried, key=lambda c: float(simulated(c).peak_memory().max()))
    return chosen, simulated(chosen)


def _plan_of(chain: Chain, platform: Target, name: str, torch_class: str, parts: list[tuple[int, int]],
             dev: list[int], trace, m: int, V: int, flushes: int, split: bool, seconds: float) -> Plan:
    """The plan of a simulated partition: stages with mini-batch 0's start times and held counts."""
    ops = trace.ops
    stages = []
    for s, ((a, b), d) in enumerate(zip(parts, dev)):
        mine = ops[(ops["stage"] == s) & (ops["batch"] == 0)]
        f0 = float(mine.loc[mine["kind"] == "F", "start"].min())
        b0 = float(mine.loc[mine["kind"].isin(["B", "I"]), "start"].min())
        stages.append(Stage(a, b, d, f0, b0, max(held_counts(ops, s), 1)))
    assignment = [0] * len(chain)
    for (a, b), d in zip(parts, dev):
        assignment[a:b + 1] = [d] * (b - a + 1)
    peak = tuple(float(x) for x in trace.peak_memory())
    notes = [f"{name}: torch's {torch_class}, {V} stage(s) per device, a flush every {m} micro-batches; "
             f"period = makespan / {m}"]
    if split and (note := split_note(chain)):
        notes.append(note)
    over = max(peak) - platform.memory_limit
    if over > platform.memory_limit * REL_TOL:
        notes.append(f"does not fit: needs {format_bytes(max(peak))}, limit {format_bytes(platform.memory_limit)} "
                     f"(over by {format_bytes(over)})")
    return Plan(period=float(trace.period), assignment=tuple(assignment), stages=tuple(stages),
                devices=platform.devices, memory=peak, memory_limit=platform.memory_limit,
                lower_bound=lower_bound(chain, platform), method=name,
                allocation="general" if V > 1 else "contiguous", status="feasible", solve_seconds=seconds,
                schedule=name, micro_batches=m, extra={"makespan": float(trace.makespan), "flushes": flushes},
                **with_memory_setup(chain, platform, {"notes": tuple(notes)}))


def _planner(name: str):
    """The planner of torch's schedule ``name``: :func:`plan_torch_schedule` with it, named ``plan_<name>``."""
    def plan(chain: Chain, platform: Target, **options: Any) -> Plan:
        return plan_torch_schedule(chain, platform, name, **options)

    plan.__name__ = plan.__qualname__ = "plan_" + name.replace("-", "_")
    plan.__doc__ = (f"torch's ``{torch_schedule(name).torch_class}`` (:func:`plan_torch_schedule`; options "
                    f"``chunks``, ``micro_batches``).")
    return plan


#: method name -> planner, one per torch schedule of the registry
TORCH_PLANNERS = {name: _planner(name) for name in TORCH_SCHEDULES}
