"""``gpipe`` and ``1f1b``: flushed schedules on the partition ``dp`` chooses.

A flushed schedule runs m micro-batches (each one a profile mini-batch),
then waits for the pipeline to drain and updates the weights: one weight
version, no stashing. It is finite, so it is *simulated*
(:func:`workbench.schedules.simulate.simulate_flushed`), not checked against the
periodic rules: the plan's period is makespan / m and its memory the
simulated peak per device (docs/model.md, "Plan").

* GPipe: all m forwards, then all m backwards; stage s holds m copies of
  its activations at the turn.
* 1F1B (PipeDream-Flush, DAPPLE, Megatron): stage s runs
  ``min(m, S - s)`` warm-up forwards, then alternates one forward and one
  backward; it holds at most ``min(m, S - s)`` copies (stages downstream,
  itself included).

The partition is the unconstrained ``dp`` optimum (balanced compute and
links; memory ignored, since the periodic memory model does not apply).
m is the option ``micro_batches`` (default ``4 * P``). The plan's status
is ``"feasible"``; when the simulated peak exceeds the limit the plan says
by how much (``plan.fits`` is False).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 8) for i in range(4)), input_bytes=8)
>>> p = plan_gpipe(ch, Target.of(2, memory_model="paper"), micro_batches=4)
>>> p.schedule, p.micro_batches, [s.in_flight for s in p.stages]
('gpipe', 4, [4, 4])
"""

from __future__ import annotations

import math
import time
from typing import Any

from workbench.model.chain import Chain
from workbench.model.plan import MAX_MICRO_BATCHES, Plan, Stage, chain_for_plan, lower_bound, with_memory_setup
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes
from workbench.planners.dp.contiguous import plan_dp
from workbench.schedules.simulate import simulate_flushed
from workbench.schedules.simulate_orders import held_counts

__all__ = ["plan_gpipe", "plan_1f1b", "plan_flushed"]


def plan_flushed(chain: Chain, platform: Target, kind: str, *,
                 allocation: str = "contiguous", time_limit: float | None = None,
                 micro_batches: int | None = None, flushes: int = 1, **options: Any) -> Plan:
    """A flushed ``kind`` schedule on dp's unconstrained partition, simulated (see the module docstring)."""
    t0 = time.perf_counter()
    P = platform.devices
    m = int(micro_batches) if micro_batches is not None else 4 * P
    if not 1 <= m <= MAX_MICRO_BATCHES:
        raise ValueError(f"micro_batches must be in 1..{MAX_MICRO_BATCHES}, got {micro_batches!r}")
    notes: list[str] = []
    if allocation == "general":
        notes.append("flushed schedules are contiguous: allocation 'general' ignored")
    base = plan_dp(chain, platform.with_(memory=math.inf), **options)
    used = chain_for_plan(base, chain)
    assignment = list(base.assignment)
    trace = simulate_flushed(used, platform, assignment, m, kind=kind, flushes=flushes)
    period = float(trace.period)
    peak = tuple(float(x) for x in trace.peak_memory())
    ops = trace.ops
    stages = []
    for s, st in enumerate(base.stages):
        mine = ops[(ops["stage"] == s) & (ops["batch"] == 0)]
        f0 = float(mine.loc[mine["kind"] == "F", "start"].min())
        b0 = float(mine.loc[mine["kind"] == "B", "start"].min())
        stages.append(Stage(st.first, st.last, st.device, f0, b0, held_counts(ops, s)))
    over = max(peak) - platform.memory_limit if peak else 0.0
    if over > platform.memory_limit * REL_TOL:
        notes.append(f"does not fit: needs {format_bytes(max(peak))}, limit {format_bytes(platform.memory_limit)} "
                     f"(over by {format_bytes(over)})")
    notes.append(f"{kind} with a flush every {m} micro-batches; period = makespan / {m}")
    return Plan(
        period=period, assignment=tuple(assignment), stages=tuple(stages), devices=P, memory=peak,
        memory_limit=platform.memory_limit, lower_bound=lower_bound(chain, platform), method=kind,
        allocation="contiguous", status="feasible", solve_seconds=time.perf_counter() - t0,
        schedule=kind, micro_batches=m, chain_order=base.chain_order,
        extra={"makespan": float(trace.makespan), "flushes": flushes},
        **with_memory_setup(chain, platform, {"notes": tuple(notes)}),
    )


def plan_gpipe(chain: Chain, platform: Target, *, allocation: str = "contiguous",
               time_limit: float | None = None, **options: Any) -> Plan:
    """GPipe (all forwards, then all backwards, flush) on dp's partition; option ``micro_batches``."""
    return plan_flushed(chain, platform, "gpipe", allocation=allocation, time_limit=time_limit, **options)


def plan_1f1b(chain: Chain, platform: Target, *, allocation: str = "contiguous",
              time_limit: float | None = None, **options: Any) -> Plan:
    """1F1B with a flush every m micro-batches on dp's partition; option ``micro_batches``."""
    return plan_flushed(chain, platform, "1f1b", allocation=allocation, time_limit=time_limit, **options)
