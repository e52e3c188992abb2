"""Simulate a flushed schedule given as an order of operations per device (torch's multi-stage schedules).

Each device runs its operations (:class:`~workbench.schedules.ops.Op`:
``F``, ``B``, ``I``, ``W`` of a stage on a micro-batch) in the order given;
an operation starts when its device is free and what it needs has arrived:

* ``F`` of stage s: the forward of stage s-1 of the same micro-batch, plus the
  transfer (none when both stages are on one device: a V schedule's turn);
* ``B`` or ``I`` of stage s: its own forward and, before the last stage, the
  ``B``/``I`` of stage s+1 plus the transfer;
* ``W``: the stage's own ``I``.

Durations are the stage's forward, its whole backward (``B``) or its two
parts (:func:`workbench.model.split.stage_split`: torch's stage 0 runs no
``I`` and its whole backward as ``W``). Sends are rows on the sending device
that use the link, not the device. After ``micro_batches`` micro-batches a
flush: everything ends, the optimizer steps, the next group starts.

**Memory** (:mod:`workbench.schedules.simulate_memory`): a stage holds a
micro-batch's activations from the start of its forward to the end of its
``B`` or ``W``, and, under the full memory model, its pending bytes from the end
of its ``I`` to the end of its ``W``; its excess while any of its operations
runs; its static bytes (weights, gradients, optimizer state, receive buffers)
all along; the optimizer step's temporaries after the flush.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.schedules.torch_orders import torch_order
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1, 1) for i in range(4)), input_bytes=1)
>>> order = torch_order("interleaved-1f1b", 2, 2, 4)
>>> t = simulate_order(ch, Target.of(2, memory_model="paper"), [(0, 0, 0), (1, 1, 1), (2, 2, 0), (3, 3, 1)],
...                    order, 4)
>>> t.makespan, t.period        # (m v + p - 1)(f + b) = (4 x 2 + 1) x 3
(27.0, 6.75)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from workbench.model.chain import Chain
from workbench.model.split import stage_split
from workbench.model.target import Target
from workbench.model.trace import OP_COLUMNS, Trace
from workbench.schedules.ops import Op
from workbench.schedules.simulate_memory import StageMemory, grad_windows, memory_frame, with_step_rows

__all__ = ["simulate_order", "order_makespan", "OrderTimes", "held_counts"]


@dataclass(frozen=True)
class OrderTimes:
    """Per stage: its device, forward, full backward, I and W seconds, pending bytes and the transfer to the
    next stage (0 after the last, or when the next stage is on the same device)."""

    dev: list[int]
    F: list[float]
    B: list[float]
    I: list[float]
    W: list[float]
    pending: list[float]
    c: list[float]

    @classmethod
    def of(cls, chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int]]) -> "OrderTimes":
        S = len(stages)
        dev = [int(d) for _, _, d in stages]
        F = [chain.stage_costs(a, b).forward for a, b, _ in stages]
        B = [chain.stage_costs(a, b).backward for a, b, _ in stages]
        parts = [stage_split(chain, a, b, first_stage=(s == 0)) for s, (a, b, _) in enumerate(stages)]
        pending = [p for _, _, p in parts] if platform.setup.memory_model == "full" else [0.0] * S
        c = [platform.comm_time(chain.cut(stages[s][1]), dev[s], dev[s + 1]) if s + 1 < S and dev[s] != dev[s + 1]
             else 0.0 for s in range(S)]
        return cls(dev, F, B, [i for i, _, _ in parts], [w for _, w, _ in parts], pending, c)

    def length(self, a: Op) -> float:
        return {"F": self.F, "B": self.B, "I": self.I, "W": self.W}[a.kind][a.stage]


class _Run:
    """Start and end of every operation ``(stage, kind, batch)`` so far, and the rows of the trace."""

    def __init__(self) -> None:
        self.start: dict[tuple[int, str, int], float] = {}
        self.end: dict[tuple[int, str, int], float] = {}
        self.rows: list[tuple[int, int, str, int, float, float]] = []

    def ready(self, a: Op, times: OrderTimes, S: int, offset: int) -> float | None:
        """When ``a`` (of micro-batch ``a.batch + offset``) may start as far as its inputs go, or None."""
        i = a.batch + offset
        need: list[tuple[tuple[int, str, int], float]] = []
        if a.kind == "F":
            if a.stage > 0:
                need.append(((a.stage - 1, "F", i), times.c[a.stage - 1]))
        elif a.kind in ("B", "I"):
            need.append(((a.stage, "F", i), 0.0))
            if a.stage < S - 1:
                nxt = (a.stage + 1, "B", i) if (a.stage + 1, "B", i) in self.end else (a.stage + 1, "I", i)
                need.append((nxt, times.c[a.stage]))
        else:
            need.append(((a.stage, "I", i), 0.0))
        t = 0.0
        for key, wait in need:
            if key not in self.end:
                return None
            t = max(t, self.end[key] + wait)
        return t


def _run_flush(run: _Run, times: OrderTimes, orders: Mapping[int, Sequence[Op]], offset: int, t0: float,
               devices: int) -> float:
    """Run one flush (micro-batches offset..) from ``t0``: the operation that can start first, first; returns
    when everything ended."""
    S = len(times.F)
    ptr = {d: 0 for d in orders}
    free = {d: t0 for d in orders}
    left = sum(len(o) for o in orders.values())
    while left:
        best: tuple[float, int] | None = None
        for d, order in orders.items():
            if ptr[d] >= len(order):
                continue
            r = run.ready(order[ptr[d]], times, S, offset)
            if r is not None and (best is None or max(r, free[d]) < best[0]):
                best = (max(r, free[d], t0), d)
        if best is None:
            stuck = ", ".join(f"device {d}: {orders[d][ptr[d]]}" for d in orders if ptr[d] < len(orders[d]))
            raise ValueError(f"the order deadlocks with {left} operations left ({stuck})")
        t, d = best
        a = orders[d][ptr[d]]
        ln = times.length(a)
        key = (a.stage, a.kind, a.batch + offset)
        run.start[key], run.end[key] = t, t + ln
        run.rows.append((times.dev[a.stage], a.stage, a.kind, a.batch + offset, t, t + ln))
        _send_row(run, times, a, offset, t + ln)
        free[d] = t + ln
        ptr[d] += 1
        left -= 1
    return max([t0] + [r[5] for r in run.rows])


def _send_row(run: _Run, times: OrderTimes, a: Op, offset: int, t: float) -> None:
    """The transfer ``a`` starts when it ends: its output forward, or its input gradient back."""
    s, S = a.stage, len(times.F)
    if a.kind == "F" and s < S - 1 and times.c[s] > 0:
        run.rows.append((times.dev[s], s, "send", a.batch + offset, t, t + times.c[s]))
    if a.kind in ("B", "I") and s > 0 and times.c[s - 1] > 0:
        run.rows.append((times.dev[s], s, "send", a.batch + offset, t, t + times.c[s - 1]))


def order_makespan(chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int]],
                   orders: Mapping[int, Sequence[Op]]) -> float:
    """The makespan of one flush of ``orders`` on ``stages``: :func:`simulate_order`'s clock alone, without
    the trace (for planners that try many partitions)."""
    return _run_flush(_Run(), OrderTimes.of(chain, platform, stages), orders, 0, 0.0, platform.devices)


def held_counts(ops: pd.DataFrame, stage: int) -> int:
    """Peak number of micro-batches ``stage`` holds: from its forward's start to the end of its last backward
    part (``B``, or ``W`` after ``I``)."""
    mine = ops[ops["stage"] == stage]
    f = mine[mine["kind"] == "F"].groupby("batch")["start"].min()
    b = mine[mine["kind"].isin(["B", "W"])].groupby("batch")["end"].max()
    events = sorted([(t, 1) for t in f.to_numpy()] + [(t, -1) for t in b.to_numpy()], key=lambda e: (e[0], e[1]))
    held = peak = 0
    for _, d in events:
        held += d
        peak = max(peak, held)
    return peak


def simulate_order(chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int]],
                   orders: Mapping[int, Sequence[Op]], micro_batches: int, flushes: int = 1,
                   schedule: str = "") -> Trace:
    """Run ``orders`` (per device, its operations on micro-batches ``0..micro_batches-1``) for ``flushes``
    flushes on ``stages`` (``(first, last, device)`` in chain order); the trace's period is the makespan
    over every micro-batch run."""
    if int(micro_batches) < 1 or flushes < 1:
        raise ValueError(f"need at least one micro-batch and one flush, got {micro_batches} and {flushes}")
    m = int(micro_batches)
    times = OrderTimes.of(chain, platform, stages)
    run = _Run()
    t = 0.0
    ends = []
    for fl in range(flushes):
        t = _run_flush(run, times, orders, fl * m, t, platform.devices)
        ends.append(t)
    ops = _frame(run.rows, stages)
    mem = _memory(chain, platform, stages, times, run, m, ends)
    total = m * flushes
    return Trace(ops, mem, platform.devices, period=t / total, source="simulated",
                 meta={"schedule": schedule, "micro_batches": m, "flushes": flushes, "makespan": t})


def _frame(rows: list[tuple[int, int, str, int, float, float]], stages: Sequence[tuple[int, int, int]]) -> pd.DataFrame:
    cols: dict[str, list] = {k: [] for k in OP_COLUMNS}
    for d, s, k, i, t0, t1 in rows:
        for name, value in zip(OP_COLUMNS, (d, s, stages[s][0], stages[s][1], k, i, t0, t1)):
            cols[name].append(value)
    df = pd.DataFrame(cols).astype({"device": "int64", "stage": "int64", "first": "int64", "last": "int64",
                                    "batch": "int64", "start": "float64", "end": "float64"})
    return df.sort_values(["start", "device", "stage"], kind="stable").reset_index(drop=True)


def _memory(chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int]], times: OrderTimes, run: _Run,
            m: int, ends: list[float]) -> pd.DataFrame:
    """The memory rows: every stage's micro-batches held, then its pending bytes as a second kind of hold
    (a stand-in stage with only activations), its operations' excess, its gradients under ``zero_grad none``
    (from its first ``B`` or ``W`` of each flush), and the steps after the flush."""
    S = len(stages)
    total, end = m * len(ends), ends[-1]
    runs = [(a, b) for a, b, _ in stages]
    sm = StageMemory.of(chain, platform, runs, stash=False, step_in_ops=False)
    first_ends: list[list[float]] = []
    nan = np.full((2 * S, total), np.nan)
    hold_start, hold_end = nan.copy(), nan.copy()
    op_rows = []
    for s in range(S):
        for i in range(total):
            last = "W" if (s, "W", i) in run.end else "B"
            hold_start[s, i], hold_end[s, i] = run.start[(s, "F", i)], run.end[(s, last, i)]
            if last == "W":
                hold_start[S + s, i], hold_end[S + s, i] = run.end[(s, "I", i)], run.end[(s, "W", i)]
            else:
                hold_start[S + s, i] = hold_end[S + s, i] = run.end[(s, "B", i)]
        firsts = {min(((run.start[(s, k, i)], (s, k, i)) for k in ("B", "W") for i in range(f * m, (f + 1) * m)
                       if (s, k, i) in run.start))[1] for f in range(len(ends))} if sm.grads else set()
        for kind in ("F", "B", "I", "W"):
            keys = [(s, kind, i) for i in range(total) if (s, kind, i) in run.end and (s, kind, i) not in firsts]
            if keys:
                op_rows.append((s, np.array([run.start[k] for k in keys]), np.array([run.end[k] for k in keys])))
        if firsts:   # zero_grad none: each flush's first backward (B or W) writes the stage's gradients
            keys = sorted(firsts, key=lambda k: run.start[k])
            op_rows.append((s, np.array([run.start[k] for k in keys]), np.array([run.end[k] for k in keys]), True))
            first_ends.append([run.end[k] for k in keys])
    both = StageMemory(list(sm.A) + list(times.pending), list(sm.static) + [0.0] * S, [0.0] * (2 * S),
                       list(sm.excess) + [0.0] * S, sm.const, tuple(sm.grads) + (0.0,) * S if sm.grads else (),
                       tuple(sm.first_excess) + (0.0,) * S if sm.grads else ())
    grads = grad_windows(first_ends, ends) + [[]] * S if sm.grads else []
    mem = memory_frame(platform.devices, times.dev + times.dev, both, hold_start, hold_end, op_rows, 0.0,
                       max(end, 1e-300), grads=grads)
    return with_step_rows(mem, chain, platform, runs, times.dev, end)
