"""Per-device programs: the order in which each device runs its operations.

A periodic plan fixes, for every stage ``s``, the start of the forward
``f_s`` and of the backward ``b_s`` of mini-batch 0; mini-batch ``i`` runs
the same operations ``i*T`` later. Unrolled for ``N`` mini-batches and
sorted by start time, the operations of one device give its *program*:
warm-up (forwards only), steady state (forwards and backwards interleaved),
drain (backwards only), with no special case for any of them.

The runtime executes programs as fast as the data arrives (it does not wait
for the planned clock), so the order, and with it the number of mini-batches
in flight and hence the memory, is the plan's; the time is measured.

Because a valid plan respects the data dependencies (docs/model.md, rules 2-4),
sorting every device's operations by planned time never makes a device wait
for an operation that comes later in the global order: with non-blocking
sends the unrolled programs cannot deadlock. :func:`check_programs` replays
the programs abstractly and raises (pointing at the stuck operations) when
an order would deadlock, before any process is started.

>>> from workbench.model.plan import Plan, Stage
>>> plan = Plan(period=3.0, assignment=(0, 1), devices=2,
...             stages=(Stage(0, 0, 0, 0.0, 4.0, 2), Stage(1, 1, 1, 1.0, 2.0, 1)))
>>> progs = unroll(plan, 3)
>>> [f"{op.kind}{op.batch}" for op in progs[0]]
['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
>>> check_programs(progs, n_stages=2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from workbench.model.plan import Plan

__all__ = ["Op", "unroll", "programs_from_trace", "programs_for", "check_programs", "stage_devices", "predicted_ops",
           "torch_programs"]


@dataclass(frozen=True, order=True)
class Op:
    """One compute operation: ``kind`` "F" or "B" of ``stage`` for mini-batch ``batch`` at planned ``time``."""

    time: float
    stage: int
    kind: str
    batch: int


def stage_devices(plan: Plan) -> list[int]:
    return [s.device for s in plan.stages]


def unroll(plan: Plan, steps: int) -> list[list[Op]]:
    """Programs of every device for ``steps`` mini-batches of a periodic plan (sorted by planned start)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if plan.schedule != "periodic":
        raise ValueError(f"unroll needs a periodic plan, got schedule {plan.schedule!r}; "
                         "use programs_from_trace on a simulated trace")
    T = plan.period
    progs: list[list[Op]] = [[] for _ in range(plan.devices)]
    for s, st in enumerate(plan.stages):
        for i in range(steps):
            progs[st.device].append(Op(st.fwd_start + i * T, s, "F", i))
            progs[st.device].append(Op(st.bwd_start + i * T, s, "B", i))
    for p in progs:
        # ties (only possible with zero-length operations) are broken by stage then kind
        p.sort(key=lambda o: (o.time, o.stage, o.kind, o.batch))
    return progs


def programs_from_trace(ops: pd.DataFrame, devices: int) -> list[list[Op]]:
    """Programs from any trace's F/B rows (e.g. a simulated flushed GPipe/1F1B schedule)."""
    progs: list[list[Op]] = [[] for _ in range(devices)]
    comp = ops[ops["kind"].isin(["F", "B"])]
    for r in comp.itertuples(index=False):
        progs[int(r.device)].append(Op(float(r.start), int(r.stage), str(r.kind), int(r.batch)))
    for p in progs:
        p.sort(key=lambda o: (o.time, o.stage, o.kind, o.batch))
    return progs


def check_programs(progs: Sequence[Sequence[Op]], n_stages: int) -> None:
    """Replay programs abstractly (sends never block, a compute op waits for its input); raise on deadlock.

    Also checks that every (stage, kind, batch) appears exactly once and that
    a stage's forward of a mini-batch comes before its backward. A backward may be split into ``I`` (it
    needs what ``B`` needs) and ``W`` (it needs the ``I``), as torch's zero-bubble schedules run it.
    """
    seen: dict[tuple[int, str, int], int] = {}
    for d, prog in enumerate(progs):
        for op in prog:
            key = (op.stage, op.kind, op.batch)
            if key in seen:
                raise ValueError(f"operation {op.kind}{op.batch} of stage {op.stage} appears twice")
            seen[key] = d
    batches = {b for (_, _, b) in seen}
    for s in range(n_stages):
        for b in batches:
            for k in "FB":
                if (s, k, b) not in seen and not (k == "B" and (s, "I", b) in seen and (s, "W", b) in seen):
                    raise ValueError(f"no {k}{b} for stage {s}")
    done: set[tuple[int, str, int]] = set()
    pc = [0] * len(progs)
    total = sum(len(p) for p in progs)
    while len(done) < total:
        progress = False
        for d, prog in enumerate(progs):
            while pc[d] < len(prog):
                op = prog[pc[d]]
                if op.kind == "F":
                    need = [(op.stage - 1, "F", op.batch)] if op.stage > 0 else []
                elif op.kind == "W":
                    need = [(op.stage, "I", op.batch)]
                else:
                    need = [(op.stage, "F", op.batch)]
                    if op.stage < n_stages - 1:
                        later = "I" if (op.stage + 1, "I", op.batch) in seen else "B"
                        need.append((op.stage + 1, later, op.batch))
                if all(n in done for n in need):
                    done.add((op.stage, op.kind, op.batch))
                    pc[d] += 1
                    progress = True
                else:
                    break
        if not progress:
            stuck = [f"device {d}: {prog[pc[d]].kind}{prog[pc[d]].batch} of stage {prog[pc[d]].stage}"
                     for d, prog in enumerate(progs) if pc[d] < len(prog)]
            raise ValueError("the programs deadlock; stuck at " + "; ".join(stuck))


def predicted_ops(plan: Plan, chain, steps: int) -> pd.DataFrame:
    """The plan's own operations (F/B) for ``steps`` mini-batches, with durations from ``chain``.

    A light stand-in for the simulator's trace (no send/recv rows) when only
    the planned times are wanted.
    """
    rows = []
    for s, st in enumerate(plan.stages):
        c = chain.stage_costs(st.first, st.last)
        for i in range(steps):
            f0 = st.fwd_start + i * plan.period
            b0 = st.bwd_start + i * plan.period
            rows.append((st.device, s, st.first, st.last, "F", i, f0, f0 + c.forward))
            rows.append((st.device, s, st.first, st.last, "B", i, b0, b0 + c.backward))
    df = pd.DataFrame(rows, columns=["device", "stage", "first", "last", "kind", "batch", "start", "end"])
    return df.sort_values(["device", "start"]).reset_index(drop=True)


def torch_programs(plan: Plan, steps: int) -> list[list[Op]]:
    """Per device, the operations torch's schedule (``plan.schedule``) runs for ``steps`` micro-batches, in
    torch's order (:func:`workbench.schedules.torch_orders.torch_order`; ``time`` is the position)."""
    from workbench.schedules.torch_orders import torch_order

    order = torch_order(plan.schedule, plan.devices, len(plan.stages) // plan.devices, steps)
    return [[Op(float(j), a.stage, a.kind, a.batch) for j, a in enumerate(order.get(d, ()))]
            for d in range(plan.devices)]


def programs_for(plan: Plan, steps: int, chain=None, platform=None) -> list[list[Op]]:
    """Per-device programs: unrolled periodic plan, torch's order for its schedules, or a simulated flushed
    schedule's order."""
    from workbench.schedules.torch_orders import SCHEDULES

    if plan.schedule in SCHEDULES:
        progs = torch_programs(plan, steps)
    elif plan.schedule == "periodic":
        progs = unroll(plan, steps)
    else:
        if chain is None or platform is None:
            raise ValueError(f"a {plan.schedule!r} plan needs the chain and platform to simulate its order")
        from workbench.schedules.simulate import simulate

        progs = programs_from_trace(simulate(plan, chain, platform, steps).ops, plan.devices)
    check_programs(progs, len(plan.stages))
    return progs
