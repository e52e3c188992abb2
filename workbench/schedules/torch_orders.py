"""The order of operations of torch's pipeline schedules, read from torch itself (docs/model.md, "Torch's schedules").

``torch.distributed.pipelining`` (2.13) ships schedules that put several
stages on each device and, for the zero-bubble ones, split a stage's backward
into its input-gradient part ``I`` and its weight-gradient part ``W``. Each
is a class that computes, per rank, a list of ``_Action``\\ s: stage, kind
(``F``, ``B`` a full backward, ``I``, ``W``; DualPipeV's ``OVERLAP_F_B`` is a
forward and a full backward run one after the other) and micro-batch.
:func:`torch_order` builds the real class on stand-in stages (no process
group, no model: only the attributes the classes read to compute their
order) and returns its ``pipeline_order``, so the order planned, simulated,
checked and run is torch's own, not a re-derivation.

Stage ``s`` of ``S = P V`` sits on device ``s mod P`` in the looped layout
(``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb``) and, in the V
layout (``zbv``, ``dualpipev``, two stages per device), on device ``s`` for
``s < P`` and ``2P - 1 - s`` after: device 0 holds the first and the last
stage, device P - 1 the two middle ones (:func:`stage_devices`).

>>> order = torch_order("interleaved-1f1b", devices=2, chunks=2, micro_batches=2)
>>> [str(a) for a in order[0]]
['0F0', '0F1', '2F0', '2F1', '2B0', '2B1', '0B0', '0B1']
>>> stage_devices("zbv", 2, 4), stage_devices("looped-bfs", 2, 4)
([0, 1, 1, 0], [0, 1, 0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from workbench.methods import METHODS, Method

__all__ = ["Action", "SCHEDULES", "order_counts", "schedule_of", "stage_devices", "torch_order", "chunks_of",
           "KINDS"]

#: the compute kinds of an order: forward, full backward, input-gradient backward, weight-gradient backward
KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True, order=True)
class Action:
    """One operation of an order: ``kind`` (``F``, ``B``, ``I`` or ``W``) of ``stage`` on micro-batch ``batch``.

    >>> str(Action(3, "I", 1))
    '3I1'
    """

    stage: int
    kind: str
    batch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.batch}"


#: torch's schedules by method name: the methods of :mod:`workbench.methods` that name a ``torch_class``
SCHEDULES: dict[str, Method] = {m.name: m for m in METHODS if m.torch_class}


def schedule_of(name: str) -> Method:
    """The torch schedule called ``name``, its method in :mod:`workbench.methods` (a ``ValueError`` naming the
    choices otherwise).

    >>> schedule_of("zbv").torch_class
    'ScheduleZBVZeroBubble'
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def chunks_of(name: str, chunks: int | None) -> int:
    """The stages per device a schedule runs with: its fixed count, else ``chunks`` (default 2).

    >>> chunks_of("zbv", None), chunks_of("interleaved-1f1b", 3)
    (2, 3)
    >>> chunks_of("dualpipev", 3)
    Traceback (most recent call last):
    ...
    ValueError: dualpipev puts exactly 2 stages on each device (torch's ScheduleDualPipeV); --chunks 3 is not possible
    """
    sched = schedule_of(name)
    if sched.fixed_chunks is not None:
        if chunks is not None and int(chunks) != sched.fixed_chunks:
            raise ValueError(f"{name} puts exactly {sched.fixed_chunks} stages on each device (torch's "
                             f"{sched.torch_class}); --chunks {chunks} is not possible")
        return sched.fixed_chunks
    v = 2 if chunks is None else int(chunks)
    if v < 1:
        raise ValueError(f"chunks (stages per device) must be at least 1, got {chunks}")
    return v


def stage_devices(name: str, devices: int, stages: int) -> list[int]:
    """The device of each of ``stages`` stages on ``devices`` devices in the schedule's layout (module docstring)."""
    if schedule_of(name).layout == "v":
        return [s if s < devices else 2 * devices - 1 - s for s in range(stages)]
    return [s % devices for s in range(stages)]


class _StandIn:
    """What torch's schedule classes read of a stage to compute their order (no module, no process group)."""

    def __init__(self, index: int, stages: int, devices: int) -> None:
        import torch

        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, devices, 0
        self.is_first, self.is_last = index == 0, index == stages - 1
        self.submod = torch.nn.Identity()


@lru_cache(maxsize=256)
def torch_order(name: str, devices: int, chunks: int | None, micro_batches: int) -> dict[int, tuple[Action, ...]]:
    """Per device, the operations torch's schedule ``name`` runs for ``micro_batches`` micro-batches with
    ``chunks`` stages per device, in its order (an ``OVERLAP_F_B`` becomes its forward, then its backward).

    A combination torch refuses (a micro-batch count its class does not take) raises a ``ValueError``
    with torch's reason.
    """
    from torch.distributed.pipelining import schedules as ts

    sched = schedule_of(name)
    v = chunks_of(name, chunks)
    if devices < 1 or micro_batches < 1:
        raise ValueError(f"need at least one device and one micro-batch, got {devices} and {micro_batches}")
    S = devices * v
    mine = [s for s, d in enumerate(stage_devices(name, devices, S)) if d == 0]
    cls = getattr(ts, sched.torch_class)
    try:
        built = cls([_StandIn(s, S, devices) for s in mine], micro_batches)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise ValueError(f"torch's {sched.torch_class} refuses {devices} devices, {v} stages each and "
                         f"{micro_batches} micro-batches: {e}") from None
    out: dict[int, tuple[Action, ...]] = {}
    for rank in range(devices):
        acts: list[Action] = []
        for a in built.pipeline_order[rank]:
            if a is None:
                continue
            for sub in (a.sub_actions or (a,)):
                acts.append(Action(int(sub.stage_index), str(sub.computation_type.value), int(sub.microbatch_index)))
        out[rank] = tuple(acts)
    return out


def order_counts(order: dict[int, Sequence[Action]], stages: int) -> tuple[list[int], list[int], list[int]]:
    """Per stage, read off the order alone (a device's memory changes only at its own operations): the most
    micro-batches it holds (forward started, last backward part, ``B`` or ``W``, not ended), the most whose
    weight gradients wait (``I`` ended, ``W`` not; none on torch's stage 0, which runs no ``I``) and the most
    between a forward and the end of its ``B`` or ``I`` (what torch's last stage keeps its output for).

    >>> order_counts(torch_order("interleaved-zb", 2, 1, 4), 2)    # the last stage runs F, I, F, I, W, F, I, W, ...
    ([2, 2], [0, 2], [2, 1])
    """
    held, peak = [0] * stages, [0] * stages
    wait, wpeak = [0] * stages, [0] * stages
    live, lpeak = [0] * stages, [0] * stages
    for acts in order.values():
        for a in acts:
            s = a.stage
            if a.kind == "F":
                held[s] += 1
                live[s] += 1
                peak[s], lpeak[s] = max(peak[s], held[s]), max(lpeak[s], live[s])
            elif a.kind in ("B", "W"):
                held[s] -= 1
            if a.kind in ("B", "I"):
                live[s] -= 1
            if a.kind == "I":
                wait[s] += 1
                wpeak[s] = max(wpeak[s], wait[s])
            elif a.kind == "W":
                wait[s] -= 1
    if stages:
        wpeak[0] = 0
    return peak, wpeak, lpeak
