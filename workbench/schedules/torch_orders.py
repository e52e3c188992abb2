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

Stage ``s`` of ``S = P V`` sits where the schedule's layout puts it
(:meth:`workbench.schedules.registry.Schedule.stage_devices`). Each operation is an
:class:`~workbench.schedules.ops.Op` whose ``time`` is its position in the device's order.

>>> order = torch_order("interleaved-1f1b", devices=2, chunks=2, micro_batches=2)
>>> [str(a) for a in order[0]]
['0F0', '0F1', '2F0', '2F1', '2B0', '2B1', '0B0', '0B1']
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Sequence

from workbench.schedules.ops import Op
from workbench.schedules.order_cache import is_kept, load_answer, store_answer
from workbench.schedules.registry import TORCH_SCHEDULES, Schedule, schedule_of

__all__ = ["order_counts", "torch_order", "torch_schedule", "needs_torch"]


def torch_schedule(name: str) -> Schedule:
    """The torch schedule called ``name`` (a ``ValueError`` naming torch's schedules otherwise).

    >>> torch_schedule("zbv").torch_class
    'ScheduleZBVZeroBubble'
    """
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; choose one of {', '.join(TORCH_SCHEDULES)}")
    return schedule_of(name)


class _StandIn:
    """What torch's schedule classes read of a stage to compute their order (no module, no process group)."""

    def __init__(self, index: int, stages: int, devices: int) -> None:
        import torch

        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, devices, 0
        self.is_first, self.is_last = index == 0, index == stages - 1
        self.submod = torch.nn.Identity()


@lru_cache(maxsize=None)
def _compute_only(cls: type, ts) -> type:
    """``cls`` without its lowering of the order to communication actions (``_prepare_schedule_with_comms``),
    which its ``__init__`` runs after computing ``pipeline_order`` and which the order does not need: it is
    quadratic in the micro-batches (torch 2.13: 14 s for 1,024 on 8 devices, so 10,000 ran past 300 s); the
    schedule's own validation of the order (``_validate_and_set_stage_mapping``) is kept. ``cls`` itself
    where torch has no such method."""
    if not hasattr(cls, "_prepare_schedule_with_comms") or not hasattr(ts, "PipelineScheduleMulti"):
        return cls

    def prepare(self, actions, format="compute_only"):  # noqa: A002 - torch's signature
        ts.PipelineScheduleMulti._validate_and_set_stage_mapping(self, actions)

    return type(cls.__name__, (cls,), {"_prepare_schedule_with_comms": prepare})


@lru_cache(maxsize=256)
def torch_order(name: str, devices: int, chunks: int | None, micro_batches: int) -> dict[int, tuple[Op, ...]]:
    """Per device, the operations torch's schedule ``name`` runs for ``micro_batches`` micro-batches with
    ``chunks`` stages per device, in its order (an ``OVERLAP_F_B`` becomes its forward, then its backward).

    A combination torch refuses (a micro-batch count its class does not take) raises a ``ValueError``
    with torch's reason. torch's answer (order or refusal) is kept on disk (:mod:`workbench.schedules.order_cache`):
    asked again, in this process or a later one, no import of ``torch.distributed.pipelining``.
    """
    sched = torch_schedule(name)
    v = sched.chunks(chunks)
    if devices < 1 or micro_batches < 1:
        raise ValueError(f"need at least one device and one micro-batch, got {devices} and {micro_batches}")
    question = (name, int(devices), v, int(micro_batches))
    kept = load_answer(question)
    if kept is None:
        kept = _from_torch(sched, devices, v, micro_batches)
        store_answer(question, kept)
    if isinstance(kept, str):
        raise ValueError(kept)
    return kept


def needs_torch(name: str, devices: int, chunks: int | None, micro_batches: int) -> bool:
    """Whether :func:`torch_order` of these would import torch's pipelining first: not imported yet, and
    the answer not kept on disk."""
    if "torch.distributed.pipelining.schedules" in sys.modules:
        return False
    sched = torch_schedule(name)
    return not is_kept((name, int(devices), sched.chunks(chunks), int(micro_batches)))


def _from_torch(sched: Schedule, devices: int, v: int, micro_batches: int) -> dict[int, tuple[Op, ...]] | str:
    """The order torch's class computes (or why it refuses the combination)."""
    from torch.distributed.pipelining import schedules as ts

    S = devices * v
    mine = [s for s, d in enumerate(sched.stage_devices(devices, S)) if d == 0]
    cls = _compute_only(getattr(ts, sched.torch_class), ts)
    try:
        built = cls([_StandIn(s, S, devices) for s in mine], micro_batches)
    except (ValueError, AssertionError, RuntimeError) as e:
        return (f"torch's {sched.torch_class} refuses {devices} devices, {v} stages each and "
                f"{micro_batches} micro-batches: {e}")
    out: dict[int, tuple[Op, ...]] = {}
    for rank in range(devices):
        acts: list[Op] = []
        for a in built.pipeline_order[rank]:
            if a is None:
                continue
            for sub in (a.sub_actions or (a,)):
                acts.append(Op(int(sub.stage_index), str(sub.computation_type.value), int(sub.microbatch_index),
                               float(len(acts))))
        out[rank] = tuple(acts)
    return out


def order_counts(order: dict[int, Sequence[Op]], stages: int) -> tuple[list[int], list[int], list[int]]:
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
