"""What each device holds over a simulated run (:mod:`workbench.schedules.simulate`), as step-function rows.

**Memory** rows per device are a step function (bytes held from ``time``
until the device's next row): a stage holds its saved bytes A_s for a
mini-batch from the start of its forward to the end of its backward; its
weights phi*W_s all along and, with weight stashing, one extra version W_s
per in-flight mini-batch beyond the first. On a device with one stage the
peak equals rule 7's figure; with several it never exceeds it.

The terms come from the memory model (:mod:`workbench.model.memory`, docs/model.md
"Memory"): :class:`StageMemory` per stage, :func:`memory_frame` the rows of a
run from when each stage holds each mini-batch and when its operations run,
:func:`with_step_rows` the optimizer steps after a flush.

>>> import numpy as np
>>> sm = StageMemory(A=[10.0], static=[100.0], stash=[0.0], excess=[5.0], const=0.0)
>>> rows = memory_frame(1, [0], sm, np.array([[0.0, 1.0]]), np.array([[2.0, 3.0]]),
...                     [(0, np.array([0.0, 1.0]), np.array([0.5, 1.5]))], 0.0, 3.0)
>>> rows["time"].tolist()       # mini-batches held over [0, 2) and [1, 3), operations over [0, .5) and [1, 1.5)
[0.0, 0.5, 1.0, 1.5, 2.0, 3.0]
>>> rows["total"].tolist()      # 100 static + 10 per mini-batch held + 5 while an operation runs
[115.0, 110.0, 125.0, 120.0, 110.0, 100.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.model.chain import Chain
from workbench.model.memory import (
    flushed_platform,
    layer_terms,
    stage_activation,
    stage_excess,
    stage_memory,
    stage_op_excess,
    stage_step,
)
from workbench.model.target import Target
from workbench.model.trace import MEMORY_COLUMNS

__all__ = ["StageMemory", "memory_frame", "with_step_rows", "grad_windows"]


def grad_windows(first_backward: Sequence[Sequence[float]], flush_ends: Sequence[float]
                 ) -> list[list[tuple[float, float]]]:
    """Per stage, per flush, when a flushed schedule holds the stage's gradients under ``zero_grad none``:
    from its first backward (``first_backward[s][f]``, the end of its first ``B`` or ``W`` in flush f) to
    the flush's end, the last flush's through the step after it (``inf``).

    >>> grad_windows([[2.0, 7.0]], [5.0, 10.0])
    [[(2.0, 5.0), (7.0, inf)]]
    """
    last = len(flush_ends) - 1
    return [[(t, flush_ends[f] if f < last else float("inf")) for f, t in enumerate(per)] for per in first_backward]


@dataclass(frozen=True)
class StageMemory:
    """What each stage holds (:mod:`workbench.model.memory`): per in-flight mini-batch ``A``, always
    ``static``, per extra in-flight mini-batch ``stash`` (weight stashing), and ``excess`` while
    one of its operations runs; ``const`` per used device."""

    A: list[float]
    static: list[float]
    stash: list[float]
    excess: list[float]
    const: float
    #: per stage, its gradients under ``zero_grad none`` in a flushed schedule: made by its first backward,
    #: held from its end to the step after the flush (``memory_frame``'s ``grads``), and that first backward's
    #: excess (it writes them fresh); empty otherwise (they are in ``static``)
    grads: tuple[float, ...] = ()
    first_excess: tuple[float, ...] = ()

    @classmethod
    def of(cls, chain: Chain, platform: Target, runs: Sequence[tuple[int, int]], *, stash: bool,
           step_in_ops: bool) -> "StageMemory":
        """Periodic (``step_in_ops``: a step after every mini-batch's backward) or flushed (one step after the
        flush: the micro-batches' gradients accumulate, :func:`workbench.model.memory.flushed_platform`; under
        ``zero_grad none`` they are not in ``static`` but in ``grads``, made by the stage's first backward)."""
        t = layer_terms(chain, platform if step_in_ops else flushed_platform(platform))
        A = [stage_activation(t, a, b) for a, b in runs]
        per_k = [stage_memory(t, a, b, 2) - stage_memory(t, a, b, 1) for a, b in runs]
        st = [pk - x if stash else 0.0 for pk, x in zip(per_k, A)]
        static = [stage_memory(t, a, b, 1) - x for (a, b), x in zip(runs, A)]
        excess = [stage_excess(t, a, b) if step_in_ops else stage_op_excess(t, a, b) for a, b in runs]
        grads: tuple[float, ...] = ()
        first: tuple[float, ...] = ()
        if not step_in_ops and platform.setup.memory_model == "full" and platform.setup.zero_grad == "none":
            none = layer_terms(chain, platform)
            grads = tuple(s - (stage_memory(none, a, b, 1) - x) for s, (a, b), x in zip(static, runs, A))
            static = [s - g for s, g in zip(static, grads)]
            first = tuple(stage_op_excess(none, a, b) for a, b in runs)
        return cls(A, static, st, excess, t.const, grads, first)


def _device_events(p: int, stage_dev: Sequence[int], sm: StageMemory, hold_start: np.ndarray, hold_end: np.ndarray,
                   ops: Sequence[tuple[int, np.ndarray, np.ndarray]],
                   grads: Sequence[Sequence[tuple[float, float]]] = ()) -> tuple[np.ndarray, ...]:
    """Device p's memory events as arrays (time, sign, stage, kind): kind 0 holds a mini-batch (from
    ``hold_start`` to ``hold_end``), 1 runs an operation of a stage with an excess (3: the stage's first
    backward of a flush, ``(stage, starts, ends, True)`` in ``ops``, with ``sm.first_excess``), 2 holds the
    stage's gradients (``grads[s]``: (from, to) per flush; ``inf``: to the end)."""
    ev_t, ev_sign, ev_stage, ev_kind = [], [], [], []
    n = hold_start.shape[1]
    for s in (s for s in range(len(stage_dev)) if stage_dev[s] == p):
        ev_t += [hold_start[s], hold_end[s]]
        ev_sign += [np.ones(n), -np.ones(n)]
        ev_stage += [np.full(2 * n, s)]
        ev_kind += [np.zeros(2 * n)]
        for t0, t1 in (grads[s] if grads and sm.grads and sm.grads[s] > 0 else ()):
            ends = [(t0, 1.0)] + ([(t1, -1.0)] if np.isfinite(t1) else [])
            ev_t += [np.array([t for t, _ in ends])]
            ev_sign += [np.array([g for _, g in ends])]
            ev_stage += [np.full(len(ends), s)]
            ev_kind += [np.full(len(ends), 2.0)]
    for s, starts, ends, *first in ops:
        kind = 3.0 if first and first[0] else 1.0        # 3: a stage's first backward of a flush (fresh gradients)
        if stage_dev[s] != p or (sm.first_excess[s] if kind == 3.0 else sm.excess[s]) <= 0:
            continue
        ev_t += [starts, ends]
        ev_sign += [np.ones(len(starts)), -np.ones(len(ends))]
        ev_stage += [np.full(len(starts) + len(ends), s)]
        ev_kind += [np.full(len(starts) + len(ends), kind)]
    return (np.concatenate(ev_t), np.concatenate(ev_sign), np.concatenate(ev_stage).astype(int),
            np.concatenate(ev_kind))


def _sweep(events: tuple[np.ndarray, ...], sm: StageMemory, mine: list[int], base_w: float, tol: float,
           rows: tuple[list, list, list, list]) -> None:
    """Walk device events in time order (releases within ``tol`` of an acquisition first), appending to
    ``rows`` (time, activations, weights, transient) one row per distinct instant: the state after it."""
    times, sign, stg, kind = events
    out_t, out_a, out_w, out_x = rows
    key = times - np.where(sign < 0, tol, 0.0)
    order = np.lexsort((sign, key))
    counts = {s: 0 for s in mine}
    act = extra = trans = 0.0
    tl, sl, gl, kl = times[order].tolist(), sign[order].tolist(), stg[order].tolist(), kind[order].tolist()
    m = len(tl)
    for e in range(m):
        s = gl[e]
        if kl[e] == 2:
            extra += sl[e] * sm.grads[s]
        elif kl[e] == 3:
            trans += sl[e] * sm.first_excess[s]
        elif kl[e]:
            trans += sl[e] * sm.excess[s]
        elif sl[e] > 0:
            counts[s] += 1
            act += sm.A[s]
            extra += sm.stash[s] if counts[s] > 1 else 0.0
        else:
            extra -= sm.stash[s] if counts[s] > 1 else 0.0
            counts[s] -= 1
            act -= sm.A[s]
        if e + 1 == m or tl[e + 1] > tl[e] + tol:
            if tl[e] <= out_t[-1] + tol:  # same instant as the last row: it holds the final state
                out_a[-1], out_w[-1], out_x[-1] = act, base_w + extra, trans
            else:
                for column, value in ((out_t, tl[e]), (out_a, act), (out_w, base_w + extra), (out_x, trans)):
                    column.append(value)


def memory_frame(devices: int, stage_dev: Sequence[int], sm: StageMemory, hold_start: np.ndarray,
                  hold_end: np.ndarray, ops: Sequence[tuple[int, np.ndarray, np.ndarray]],
                  t0: float, scale: float, grads: Sequence[Sequence[tuple[float, float]]] = ()) -> pd.DataFrame:
    """Step-function memory rows per device.

    ``hold_start[s, i]``/``hold_end[s, i]``: when stage s starts holding
    mini-batch i (forward start) and stops (backward end). ``ops``: (stage,
    starts, ends) of its operations, during which it holds its excess too.
    ``grads[s]``: per flush, when stage s holds its gradients (``sm.grads``): from the end of its first
    backward to the flush's end (``inf`` for the last flush: through the step); that backward is an op
    ``(stage, starts, ends, True)``, with ``sm.first_excess``. Releases at the same instant as an
    acquisition (within 1e-9 of ``scale``) come first.
    """
    tol = 1e-9 * scale
    frames = []
    for p in range(devices):
        mine = [s for s in range(len(stage_dev)) if stage_dev[s] == p]
        base_w = sum(sm.static[s] for s in mine) + (sm.const if mine else 0.0)
        rows: tuple[list, list, list, list] = ([t0], [0.0], [base_w], [0.0])
        if mine:
            _sweep(_device_events(p, stage_dev, sm, hold_start, hold_end, ops, grads), sm, mine, base_w, tol, rows)
        frames.append((np.full(len(rows[0]), p),) + rows)
    return _rows_frame(frames)


def _rows_frame(frames: list[tuple]) -> pd.DataFrame:
    """The memory frame of per-device rows ``(device, time, activations, weights, transient)``; float
    noise (below 1e-9 of the largest activations or transient) is rounded to 0."""
    a = np.concatenate([np.asarray(f[2]) for f in frames])
    w = np.concatenate([np.asarray(f[3]) for f in frames])
    x = np.concatenate([np.asarray(f[4]) for f in frames])
    big = max(1.0, float(np.max(np.abs(a))) if len(a) else 1.0, float(np.max(np.abs(x))) if len(x) else 1.0)
    a[np.abs(a) < 1e-9 * big] = 0.0
    x[np.abs(x) < 1e-9 * big] = 0.0
    df = pd.DataFrame({"device": np.concatenate([f[0] for f in frames]).astype("int64"),
                       "time": np.concatenate([np.asarray(f[1], dtype=float) for f in frames]),
                       "activations": a, "weights": w, "transient": x, "total": a + w + x})
    return df[MEMORY_COLUMNS + ["transient"]]


def with_step_rows(mem: pd.DataFrame, chain: Chain, platform: Target, runs: Sequence[tuple[int, int]],
                    dev: Sequence[int], end: float) -> pd.DataFrame:
    """After the flush each device's optimizer steps its stages (one at a time, with nothing in
    flight): a row at ``end`` per used device whose transient is the largest step's temporaries."""
    t = layer_terms(chain, platform)
    rows = []
    for p in sorted(set(dev)):
        step = max(stage_step(t, a, b) for (a, b), d in zip(runs, dev) if d == p)
        if step <= 0:
            continue
        weights = float(mem.loc[mem["device"] == p, "weights"].iloc[-1])
        rows.append({"device": p, "time": end, "activations": 0.0, "weights": weights, "transient": step,
                     "total": weights + step})
    if not rows:
        return mem
    out = pd.concat([mem, pd.DataFrame(rows)], ignore_index=True)
    return out.sort_values(["device", "time"], kind="stable").reset_index(drop=True)
