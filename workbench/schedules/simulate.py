"""The simulator: run a plan for N mini-batches and record a :class:`~workbench.model.trace.Trace`.

**Periodic plans.** Mini-batch i's operations are planned at the plan's
start times + i*T. The run is event-driven: operations are taken in the
order of their planned start, and each starts at the latest of its planned
time, the end of what it depends on (the previous stage's forward plus the
transfer, the next stage's backward plus the transfer, the turn-around at
the last stage) and the moment its device is free (lateness below 1e-7 T,
float noise the checker forgives, is ignored). A valid plan runs
exactly as planned (``trace.meta["max_delay"] == 0``); an invalid one
shows where it slips. With activation policies (``plan.activations``) the
chain is the effective one: a recomputed layer's forward runs again inside
its stage's backward (an ``R`` operation overlapping the ``B`` bar, at the
start of that layer's own backward) and a stage that offloads moves its
activations to host (``offload``, after its forward) and back (``prefetch``,
ending as its backward starts) on the device's host link. Transfers are ``send`` operations on the sending
device's lane, of length c_s, starting when the producing operation ends;
they use the link, not the device, and the link is not modelled as a queue
(rule 6 only bounds its load), so they never delay anything beyond c_s.
Warm-up and drain come for free: mini-batch 0 starts at time 0 and the
last one's backward ends the run.

**Flushed schedules** run their order (:func:`workbench.schedules.program.flush_order`: GPipe and
1F1B as :mod:`workbench.schedules.registry` writes them, torch's schedules as torch's class orders them)
through :func:`workbench.schedules.simulate_orders.simulate_order`, with a flush (all operations done)
between groups of m micro-batches, one weight version; :func:`simulate_flushed` runs GPipe or 1F1B on an
allocation.

**Memory** rows per device (what each holds over the run) come from
:mod:`workbench.schedules.simulate_memory`.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.schedules.builder import build_schedule
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 100, 10) for i in range(6)), input_bytes=10)
>>> plat = Target.of(3, memory=1000, bandwidth=20000, memory_model="paper")
>>> plan = build_schedule(chain, plat, [0, 0, 1, 1, 2, 2], 0.008)
>>> trace = simulate(plan, chain, plat, batches=10)
>>> round(trace.steady_period(), 9), trace.peak_memory().tolist(), plan.memory
(0.008, [660.0, 440.0, 220.0], (660.0, 440.0, 220.0))
>>> g = simulate_flushed(chain, plat, [0, 0, 1, 1, 2, 2], 4, kind="gpipe")
>>> g.peak_memory().tolist()  # 4 micro-batches x 20 B + 200 B of weights per device
[280.0, 280.0, 280.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.model.activations import apply_policies, stage_host_time
from workbench.model.chain import Chain
from workbench.model.plan import Plan, chain_for_plan, stages_of
from workbench.model.target import Target
from workbench.model.trace import OP_COLUMNS, Trace
from workbench.schedules.program import flush_order
from workbench.schedules.registry import SCHEDULES, schedule_of
from workbench.schedules.simulate_memory import StageMemory, memory_frame
from workbench.schedules.simulate_orders import simulate_order

__all__ = ["simulate", "simulate_flushed"]


def _ops_frame(cols: dict[str, list], order_by_start: bool = True) -> pd.DataFrame:
    df = pd.DataFrame({c: cols[c] for c in OP_COLUMNS})
    df = df.astype({"device": "int64", "stage": "int64", "first": "int64", "last": "int64", "batch": "int64",
                    "start": "float64", "end": "float64"})
    if order_by_start and len(df):
        df = df.sort_values(["start", "device", "stage"], kind="stable").reset_index(drop=True)
    return df


@dataclass(frozen=True)
class _Pipeline:
    """Per stage (runs of layers ``first..last``): forward and backward times ``F``, ``B``, its device
    and the transfer time ``c`` to the next stage (0 after the last)."""

    runs: list[tuple[int, int]]
    F: list[float]
    B: list[float]
    dev: list[int]
    c: list[float]

    @classmethod
    def of(cls, chain: Chain, platform: Target, runs: Sequence[tuple[int, int]], dev: Sequence[int]) -> "_Pipeline":
        S = len(runs)
        costs = [chain.stage_costs(a, b, platform) for a, b in runs]
        c = [platform.comm_time(chain.cut(runs[s][1]), dev[s], dev[s + 1]) if s + 1 < S else 0.0 for s in range(S)]
        return cls(list(runs), [x.forward for x in costs], [x.backward for x in costs], list(dev), c)


def simulate(plan: Plan, chain: Chain, platform: Target, batches: int = 20) -> Trace:
    """Run ``plan`` for ``batches`` mini-batches (event-driven) and return the trace.

    Flushed plans run their schedule's order (GPipe, 1F1B, torch's) through
    :func:`workbench.schedules.simulate_orders.simulate_order`, with enough flushes of
    ``plan.micro_batches`` to cover ``batches``.
    """
    from workbench.verify.check import require_structure

    chain = chain_for_plan(plan, chain)
    if plan.activations:     # the effective chain: recomputation in the backward, offloaded copies resident
        chain = apply_policies(chain, plan.activations)
    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    require_structure(plan, chain, platform, "simulate")  # rules 0 and 1; rules 2-7 show as delays
    if schedule_of(plan.schedule).flushed:
        m = plan.micro_batches
        if not m:
            raise ValueError(f"a {plan.schedule} plan needs micro_batches to be simulated")
        order = flush_order(plan.schedule, [s.device for s in plan.stages], int(m))
        return simulate_order(chain, platform, [(s.first, s.last, s.device) for s in plan.stages], order, int(m),
                              flushes=max(1, math.ceil(batches / int(m))), schedule=plan.schedule)
    if not plan.feasible or not plan.stages:
        raise ValueError(f"cannot simulate an infeasible plan ({'; '.join(plan.notes) or plan.status})")
    if len(plan.assignment) != len(chain) or plan.stages[-1].last != len(chain) - 1:
        raise ValueError(f"the plan covers {len(plan.assignment)} layers, the chain has {len(chain)}")
    return _simulate_periodic(plan, chain, platform, int(batches))


def _simulate_periodic(plan: Plan, chain: Chain, platform: Target, N: int) -> Trace:
    """:func:`simulate` of a periodic plan, checked, for N mini-batches."""
    T = float(plan.period)
    st = plan.stages
    S = len(st)
    pipe = _Pipeline.of(chain, platform, [(s.first, s.last) for s in st], [s.device for s in st])
    start2, end2, max_delay = _run_periodic(pipe, st, T, N, platform.devices)
    ops = _periodic_ops(chain, platform, pipe, st, start2, end2)
    hold_start = np.stack([start2[:, s] for s in range(S)])
    hold_end = np.stack([end2[:, 2 * S - 1 - s] for s in range(S)])
    sm = StageMemory.of(chain, platform, pipe.runs, stash=platform.setup.stash, step_in_ops=True)
    op_rows = [(s, start2[:, j], end2[:, j]) for s in range(S) for j in (s, 2 * S - 1 - s)]
    mem = memory_frame(platform.devices, pipe.dev, sm, hold_start, hold_end, op_rows,
                        float(min(0.0, start2.min())), max(T, float(end2.max()) / max(N, 1)))
    return Trace(ops, mem, platform.devices, period=T, source="simulated",
                 meta={"schedule": "periodic", "batches": N, "method": plan.method, "max_delay": max_delay,
                       "planned_period": T})


def _run_periodic(pipe: _Pipeline, st: Sequence, T: float, N: int, devices: int
                  ) -> tuple[np.ndarray, np.ndarray, float]:
    """Start and end times (N x 2S: op j of a mini-batch is F_j for j < S, else B_{2S-1-j}) of the
    event-driven run, taking operations in the order of their planned start; and the largest delay."""
    S = len(st)
    # op j of a mini-batch: j < S is F_j, j >= S is B_{2S-1-j}; the chain of dependencies is j-1 -> j
    stage_of = [j if j < S else 2 * S - 1 - j for j in range(2 * S)]
    length = [pipe.F[j] if j < S else pipe.B[stage_of[j]] for j in range(2 * S)]
    offset = [st[j].fwd_start if j < S else st[stage_of[j]].bwd_start for j in range(2 * S)]
    # wait after op j-1 before op j: the transfer between stages (none at the turn-around)
    wait = [0.0] + [pipe.c[j - 1] if j < S else (0.0 if j == S else pipe.c[stage_of[j]]) for j in range(1, 2 * S)]
    planned = np.asarray(offset)[None, :] + T * np.arange(N)[:, None]
    jj = np.broadcast_to(np.arange(2 * S), (N, 2 * S))
    ii = np.broadcast_to(np.arange(N)[:, None], (N, 2 * S))
    order = np.lexsort((jj.ravel(), ii.ravel(), planned.ravel()))
    free = [-math.inf] * devices
    pl = planned.ravel().tolist()
    end_l = [0.0] * (N * 2 * S)
    start_l = [0.0] * (N * 2 * S)
    slack = 1e-7 * T  # float noise within the checker's tolerance is not a delay
    for idx in order.tolist():
        j = idx % (2 * S)
        t = pl[idx]
        if j > 0:
            dep = end_l[idx - 1] + wait[j]
            if dep > t + slack:
                t = dep
        d = pipe.dev[stage_of[j]]
        ln = length[j]
        if ln > 0:
            if free[d] > t + slack:
                t = free[d]
            free[d] = t + ln
        start_l[idx] = t
        end_l[idx] = t + ln
    start, end = np.array(start_l, dtype=float), np.array(end_l, dtype=float)
    max_delay = float(np.max(start - planned.ravel())) if len(start) else 0.0
    return start.reshape(N, 2 * S), end.reshape(N, 2 * S), max_delay


def _periodic_ops(chain: Chain, platform: Target, pipe: _Pipeline, st: Sequence, start2: np.ndarray,
                  end2: np.ndarray) -> pd.DataFrame:
    """The operations frame of a periodic run: per stage its forwards and backwards, the sends of its
    output and input gradient, and its activation-policy operations (:func:`_policy_ops`)."""
    cols: dict[str, list] = {k: [] for k in OP_COLUMNS}
    N, S = start2.shape[0], len(st)
    dev, c = pipe.dev, pipe.c

    def add(device, stage, kind, batch, s0, e0):
        n = len(batch)
        row = {"device": np.full(n, device), "stage": np.full(n, stage), "first": np.full(n, st[stage].first),
               "last": np.full(n, st[stage].last), "kind": np.full(n, kind, dtype=object), "batch": batch,
               "start": s0, "end": e0}
        for name, values in row.items():
            cols[name].append(values)

    batch = np.arange(N)
    for s in range(S):
        jf, jb = s, 2 * S - 1 - s
        add(dev[s], s, "F", batch, start2[:, jf], end2[:, jf])
        add(dev[s], s, "B", batch, start2[:, jb], end2[:, jb])
        if s < S - 1 and c[s] > 0 and dev[s] != dev[s + 1]:
            add(dev[s], s, "send", batch, end2[:, jf], end2[:, jf] + c[s])
        if s > 0 and c[s - 1] > 0 and dev[s] != dev[s - 1]:
            add(dev[s], s, "send", batch, end2[:, jb], end2[:, jb] + c[s - 1])
        for kind, s0, e0 in _policy_ops(chain, platform, st[s], start2[:, jf] + pipe.F[s], start2[:, jb]):
            add(dev[s], s, kind, batch, s0, e0)
    return _ops_frame({k: list(np.concatenate(v)) for k, v in cols.items()})


def _policy_ops(chain: Chain, platform: Target, stage, fwd_end: np.ndarray, bwd_start: np.ndarray
                ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """A stage's activation-policy operations (docs/model.md, "Activation policies"): each recomputed
    layer's forward (``R``) at the start of its own backward, inside the stage's backward (the
    layers' backwards run last to first), and the host-link transfers: ``offload`` right after the
    forward, ``prefetch`` ending as the backward starts (rule 8 keeps them apart on the link)."""
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    later = 0.0
    for l in range(stage.last, stage.first - 1, -1):
        layer = chain.layers[l]
        if chain.meta.get("activations", "")[l:l + 1] == "r":
            out.append(("R", bwd_start + later, bwd_start + later + layer.forward))
        later += layer.backward
    x = stage_host_time(chain, platform, stage.first, stage.last)
    if x > 0:
        out.append(("offload", fwd_end, fwd_end + x))
        out.append(("prefetch", bwd_start - x, bwd_start))
    return out


def simulate_flushed(chain: Chain, platform: Target, assignment: Sequence[int], micro_batches: int,
                     kind: str = "gpipe", flushes: int = 1) -> Trace:
    """Event-driven run of a flushed schedule (GPipe or 1F1B) over ``flushes`` groups of m micro-batches, its
    stages the runs of ``assignment`` (one on each device: the schedule's order is per stage).

    ``trace.period`` is makespan / (m * flushes); memory holds one weight
    version (phi * W) and the activations in flight.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1) for i in range(3)), input_bytes=1)
    >>> t = simulate_flushed(chain, Target.of(3, memory_model="paper"), [0, 1, 2], 4, kind="1f1b")
    >>> t.peak_memory().tolist()  # min(m, stages downstream + 1) micro-batches of 1 byte
    [3.0, 2.0, 1.0]
    >>> t.makespan, t.period  # (m + S - 1) * (F + B) with one layer per stage
    (18.0, 4.5)
    """
    if int(micro_batches) < 1:
        raise ValueError(f"micro_batches must be at least 1, got {micro_batches}")
    if flushes < 1:
        raise ValueError(f"flushes must be at least 1, got {flushes}")
    assignment = tuple(int(a) for a in assignment)
    if len(assignment) != len(chain):
        raise ValueError(f"the assignment has {len(assignment)} entries for a chain of {len(chain)} layers")
    for l, d in enumerate(assignment):
        if not 0 <= d < platform.devices:
            raise ValueError(f"layer {l} is on device {d}, not in 0..{platform.devices - 1}")
    own = [n for n, x in SCHEDULES.items() if x.stage_order is not None]
    if kind not in own:
        raise ValueError(f"flushed schedule kind must be one of {', '.join(own)}, got {kind!r}")
    stages = [(a, b, assignment[a]) for a, b in stages_of(assignment)]
    dev = [d for _, _, d in stages]
    if len(set(dev)) < len(dev):
        raise ValueError(f"{kind} runs one stage on each device; the assignment puts several on one ({dev})")
    return simulate_order(chain, platform, stages, flush_order(kind, dev, int(micro_batches)), int(micro_batches),
                          flushes=flushes, schedule=kind)
