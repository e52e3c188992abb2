"""Per-device programs: the order in which each device runs its operations, for every schedule.

A program is a list of :class:`~workbench.schedules.ops.Op` per device. A periodic plan fixes, for
every stage ``s``, the start of the forward ``f_s`` and of the backward ``b_s`` of mini-batch 0; mini-batch ``i`` runs
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

A flushed schedule's program is its order (:func:`flush_order`: GPipe's and 1F1B's per stage from
:mod:`workbench.schedules.registry`, torch's from torch's class), flush after flush.

>>> [str(op) for op in flush_order("1f1b", [0, 1], 2)[0]]
['0F0', '0F1', '0B0', '0B1']
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from workbench.model.plan import Plan
from workbench.schedules.ops import Op
from workbench.schedules.registry import schedule_of
from workbench.schedules.torch_orders import torch_order

__all__ = ["unroll", "flush_order", "flushed_programs", "programs_for", "check_programs", "predicted_ops",
           "optimizer_steps"]


def unroll(plan: Plan, steps: int) -> list[list[Op]]:
    """Programs of every device for ``steps`` mini-batches of a periodic plan (sorted by planned start)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if schedule_of(plan.schedule).flushed:
        raise ValueError(f"unroll needs a periodic plan, got schedule {plan.schedule!r}; "
                         "use flushed_programs")
    T = plan.period
    progs: list[list[Op]] = [[] for _ in range(plan.devices)]
    for s, st in enumerate(plan.stages):
        for i in range(steps):
            progs[st.device].append(Op(s, "F", i, st.fwd_start + i * T))
            progs[st.device].append(Op(s, "B", i, st.bwd_start + i * T))
    for p in progs:
        # ties (only possible with zero-length operations) are broken by stage then kind
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


def flush_order(schedule: str, stage_devices: Sequence[int], micro_batches: int) -> dict[int, tuple[Op, ...]]:
    """Per device, the operations of one flush of ``micro_batches`` under the flushed ``schedule`` with its
    stages on ``stage_devices``, in order (``time``: the position on the device): torch's class's order, or
    the workbench's own per stage (GPipe, 1F1B: each device runs its stage's)."""
    sched = schedule_of(schedule)
    if not sched.flushed:
        raise ValueError(f"a {schedule} plan has no flush order: unroll it")
    m, devices = int(micro_batches), max(stage_devices, default=-1) + 1
    if sched.from_torch:
        return torch_order(schedule, devices, len(stage_devices) // max(devices, 1), m)
    out: dict[int, list[Op]] = {}
    for s, d in enumerate(stage_devices):
        out.setdefault(d, []).extend(sched.stage_order(len(stage_devices), s, m))   # type: ignore[misc]
    return {d: tuple(Op(o.stage, o.kind, o.batch, float(j)) for j, o in enumerate(ops)) for d, ops in out.items()}


def flushed_programs(plan: Plan, steps: int) -> list[list[Op]]:
    """Per device, a flushed plan's operations for ``steps`` micro-batches: its order for its micro-batches,
    flush after flush, as many flushes as cover ``steps`` (``time``: the position on the device)."""
    m = int(plan.micro_batches or steps)
    order = flush_order(plan.schedule, [st.device for st in plan.stages], m)
    progs: list[list[Op]] = [[] for _ in range(plan.devices)]
    for f in range(max(1, math.ceil(steps / m))):
        for d, ops in order.items():
            progs[d] += [Op(o.stage, o.kind, o.batch + f * m, float(len(progs[d]) + j)) for j, o in enumerate(ops)]
    return progs


def optimizer_steps(plan: Plan, steps: int) -> tuple[int, int]:
    """(optimizer steps, mini-batches per step) of a run of ``steps`` mini-batches on torch's engine: a flushed
    plan's micro-batches per step (its flush), a periodic plan's every mini-batch in one step. A count a flushed
    plan cannot run in whole steps is refused in one line (a ``ValueError`` naming the counts it can run).

    >>> from workbench.model.plan import Plan
    >>> optimizer_steps(Plan(1.0, (0,), (), 1, schedule="gpipe", micro_batches=4), 8)
    (2, 4)
    >>> optimizer_steps(Plan(1.0, (0,), (), 1, schedule="gpipe", micro_batches=4), 10)
    Traceback (most recent call last):
    ...
    ValueError: --steps 10: a gpipe plan runs 4 micro-batches per optimizer step (a flush), so 10 leaves a partial \
step of 2; run --steps 8 (2 steps) or 12 (3 steps)
    """
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    if not schedule_of(plan.schedule).flushed:
        return 1, int(steps)
    m = int(plan.micro_batches or steps)
    if steps % m:
        below, above = steps // m, steps // m + 1
        hint = (f"{below * m} ({below} step{'s' * (below > 1)}) or " if below else "") + \
            f"{above * m} ({above} step{'s' * (above > 1)})"
        raise ValueError(f"--steps {steps}: a {plan.schedule} plan runs {m} micro-batches per optimizer step (a "
                         f"flush), so {steps} leaves a partial step of {steps % m}; run --steps {hint}")
    return steps // m, m


def programs_for(plan: Plan, steps: int) -> list[list[Op]]:
    """Per-device programs, checked (:func:`check_programs`): a periodic plan unrolled for ``steps``
    mini-batches, a flushed plan's order for ``steps`` micro-batches (:func:`flushed_programs`)."""
    progs = flushed_programs(plan, steps) if schedule_of(plan.schedule).flushed else unroll(plan, steps)
    check_programs(progs, len(plan.stages))
    return progs
