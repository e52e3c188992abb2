"""Each device's peak memory under an order of operations, read off the order (docs/model.md, "Torch's schedules").

Under a flushed order a device's memory changes only at its own operations.
During its j-th operation it holds, per stage (the memory model's terms,
:mod:`workbench.model.memory`; the pending bytes, :mod:`workbench.model.split`):

* its static bytes (parameters, gradients, optimizer state, one receive buffer
  each way) and the runtime constant (under ``zero_grad none`` its gradients only
  once its first ``B`` or ``W`` has ended, and at the step);
* ``A`` for every micro-batch whose forward has started and whose last backward
  part (``B``, or ``W`` after ``I``) has not ended;
* its pending bytes for every micro-batch whose ``I`` has ended and ``W`` not;
* the running operation's excess (under ``zero_grad none``, for the stage's first
  ``B`` or ``W``, the one that writes its gradients fresh);

and, after the flush, the optimizer step's temporaries. The peak is the
largest of these; it equals the simulated one
(:func:`workbench.schedules.simulate_orders.simulate_order`) without running the
clock, so a planner can price many partitions.

**torch's engine** (``engine=True``; docs/model.md, "Runtime") holds more,
in time: per stage whose previous stage is on another device, a receive
buffer per micro-batch for its input (the input itself: ``N``, against the
model's in-flight inputs and one buffer) and every input gradient sent so far
(held to the end of the step); per stage whose next stage is elsewhere, a
receive buffer per micro-batch for its output's gradient and every output
sent so far (``N`` + sent, against the model's in-flight outputs and one
buffer); stage 0 the step's whole input; the last stage its output from its
forward to its ``B`` or ``I``. Where the neighbour stage is on the same device
(a V schedule's turn), torch passes the tensor in place of the receive buffer
and sends nothing: the ``N`` buffers stay, the sent ones do not. Adding these
at each operation gives the peak a run on torch's engine reaches (``N``
micro-batches in one step).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.schedules.torch_orders import torch_order
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 8, 1, 10) for i in range(4)), input_bytes=1)
>>> om = OrderMemory(ch, Target.of(2, memory_model="paper"), [0, 1, 0, 1], torch_order("looped-bfs", 2, 2, 4))
>>> om.peaks([(0, 0), (1, 1), (2, 2), (3, 3)])     # 4 micro-batches x 10 on each of 2 stages + 2 x 8 weights
[96.0, 96.0]
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from workbench.model.chain import Chain
from workbench.model.memory import (
    flushed_platform,
    layer_terms,
    stage_activation,
    stage_memory,
    stage_op_excess,
    stage_step,
)
from workbench.model.split import split_columns
from workbench.model.target import Target
from workbench.schedules.ops import Op

__all__ = ["OrderMemory", "engine_extra"]

#: per operation of a device: held, pending, the running stage's position (its stage count: none), outputs sent,
#: input gradients sent, outputs kept by the last stage, gradients made (each a tuple over the device's stages),
#: whether the operation is its stage's first backward (B or W: it makes them)
_Row = tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...], tuple[int, ...], tuple[int, ...],
             tuple[int, ...], int]


class OrderMemory:
    """Peaks per device for partitions of ``chain`` into stages on devices ``stage_dev`` run in ``order``."""

    def __init__(self, chain: Chain, platform: Target, stage_dev: Sequence[int],
                 order: Mapping[int, Sequence[Op]]) -> None:
        self.chain, self.platform, self.dev = chain, platform, list(stage_dev)
        self.terms = layer_terms(chain, flushed_platform(platform))   # gradients accumulate over the flush ...
        # ... and under zero_grad none exist from the stage's first backward (B or W) on
        self.fresh = layer_terms(chain, platform) if platform.setup.memory_model == "full" and \
            platform.setup.zero_grad == "none" else None
        S = len(self.dev)
        self.mine = {d: [s for s in range(S) if self.dev[s] == d] for d in order}
        # per device, the distinct states during its operations as arrays: rows x its stages (run: the
        # running stage's position among them, V for none)
        self.rows = {d: _arrays(_rows(acts, self.mine[d]), len(self.mine[d])) for d, acts in order.items()}
        self.N = max((a.batch for acts in order.values() for a in acts), default=-1) + 1
        self.pend = np.concatenate([[0.0], np.cumsum(split_columns(chain)[1])])
        self._cache: dict[tuple[int, int, int], tuple[float, ...]] = {}

    def stage(self, s: int, a: int, b: int) -> tuple[float, ...]:
        """(A, static, excess, step, pending, gradients, first backward's excess) of stage s on layers a..b:
        its gradients (under ``zero_grad none``, made by its first backward) are not in ``static``."""
        key = (s, a, b)
        if key not in self._cache:
            t = self.terms
            A = stage_activation(t, a, b)
            pend = float(self.pend[b + 1] - self.pend[a]) if s > 0 and t.model == "full" else 0.0
            static = stage_memory(t, a, b, 1) - A
            excess = stage_op_excess(t, a, b)
            grads, first = 0.0, excess
            if self.fresh is not None:
                grads, first = static - (stage_memory(self.fresh, a, b, 1) - A), stage_op_excess(self.fresh, a, b)
            self._cache[key] = (A, static - grads, excess, stage_step(t, a, b), pend, grads, first)
        return self._cache[key]

    def peaks(self, parts: Sequence[tuple[int, int]], engine: bool = False) -> list[float]:
        """Each device's peak for stages ``parts`` (first, last); with torch's engine's buffers and sends."""
        out = [0.0] * self.platform.devices
        for d, mine in self.mine.items():
            # columns: A, static, excess, step, pending, gradients, first backward's excess
            st = np.array([self.stage(s, *parts[s]) for s in mine])
            held, wait, run, fsent, bsent, kept, made, first = self.rows[d]
            excess = np.where(first > 0, np.append(st[:, 6], 0.0)[run], np.append(st[:, 2], 0.0)[run])
            v = held @ st[:, 0] + wait @ st[:, 4] + made @ st[:, 5] + excess
            if engine:
                inp, rin, outb, rout, first, last = np.array([self._sides(s, parts) for s in mine]).T
                N = self.N
                v = v + ((N + bsent * rin - held - 1) @ inp + (N + fsent * rout - held - 1) @ outb
                         + np.maximum(N - held, 0) @ first + kept @ last)
            out[d] = float(st[:, 1].sum() + self.terms.const
                           + max(float(v.max()), float(st[:, 5].sum() + st[:, 3].max())))
        return out

    def _sides(self, s: int, parts: Sequence[tuple[int, int]]) -> tuple[float, ...]:
        """(the stage's input bytes and whether the previous stage is on another device, its output bytes and
        whether the next is, the chain's input for stage 0, the last layer's output for the last stage)."""
        S, ch = len(self.dev), self.chain
        a, b = parts[s]
        inp = ch.cut(a - 1) if s > 0 else 0.0
        out = ch.cut(b) if s < S - 1 else 0.0
        remote_in = float(s > 0 and self.dev[s - 1] != self.dev[s])
        remote_out = float(s < S - 1 and self.dev[s + 1] != self.dev[s])
        first = float(ch.input_bytes) if s == 0 else 0.0
        last = float(ch.layers[b].activation_bytes) if s == S - 1 else 0.0
        return inp, remote_in, out, remote_out, first, last


def _arrays(rows: set[_Row], V: int) -> tuple[np.ndarray, ...]:
    """The states as arrays: held, pending, running stage (its position, V for none), outputs sent, input
    gradients sent, outputs kept, gradients made (each rows x V but the running stage and the first-backward
    flag)."""
    ordered = sorted(rows)
    held, wait, run, fsent, bsent, kept, made, first = (np.array([r[i] for r in ordered]) for i in range(8))
    return (held.reshape(-1, V).astype(float), wait.reshape(-1, V).astype(float), run.astype(int),
            fsent.reshape(-1, V).astype(float), bsent.reshape(-1, V).astype(float), kept.reshape(-1, V).astype(float),
            made.reshape(-1, V).astype(float), first.astype(int))


def _rows(acts: Sequence[Op], mine: list[int]) -> set[_Row]:
    """The distinct states during each operation of one device's order."""
    held, wait, fsent, bsent, kept, made = (dict.fromkeys(mine, 0) for _ in range(6))
    rows: set[_Row] = set()
    for a in acts:
        s = a.stage
        if a.kind == "F":
            held[s] += 1
            kept[s] += 1
        makes = int(a.kind in ("B", "W") and not made[s])     # the stage's first backward writes its gradients
        runs = not (a.kind == "I" and s == 0)       # torch's stage 0 runs no I
        rows.add(tuple(tuple(c[x] for x in mine) for c in (held, wait)) + (mine.index(s) if runs else len(mine),)
                 + tuple(tuple(c[x] for x in mine) for c in (fsent, bsent, kept, made))
                 + (makes,))  # type: ignore[arg-type]
        if a.kind in ("B", "W"):
            held[s] -= 1
            made[s] = 1
        if a.kind in ("B", "I"):
            kept[s] -= 1
            bsent[s] += 1
        if a.kind == "F":
            fsent[s] += 1
        if a.kind == "I" and s > 0:
            wait[s] += 1
        elif a.kind == "W" and s > 0:
            wait[s] -= 1
    return rows


def engine_extra(plan, chain: Chain, platform: Target, micro_batches: int,
                 sends_kept: int | None = None) -> list[float]:
    """Per device, what torch's engine holds beyond ``plan.memory`` when it runs the plan for
    ``micro_batches`` micro-batches in one step: for torch's multi-stage schedules the time-resolved
    peak above (:class:`OrderMemory` with ``engine=True``) less the plan's; for the others the bound of
    :func:`workbench.model.memory_views.torch_engine_extra` (``sends_kept`` the sends its schedule class keeps
    per stage each way, None for every micro-batch's)."""
    from workbench.model.memory_views import torch_engine_extra
    from workbench.schedules.registry import schedule_of
    from workbench.schedules.torch_orders import torch_order

    if not schedule_of(plan.schedule).from_torch:
        return torch_engine_extra(chain, plan.stages, plan.devices, micro_batches, sends_kept)
    S = len(plan.stages)
    om = OrderMemory(chain, platform, [s.device for s in plan.stages],
                     torch_order(plan.schedule, plan.devices, S // plan.devices, micro_batches))
    parts = [(s.first, s.last) for s in plan.stages]
    model, engine = om.peaks(parts), om.peaks(parts, engine=True)
    return [max(e - m, 0.0) for e, m in zip(engine, model)]
