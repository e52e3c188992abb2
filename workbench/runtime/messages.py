"""The PipeDream engine's messages: which receives a rank posts in which order, their tags, the sends in flight.

A rank of :class:`~workbench.runtime.pipedream.PipeDreamRank` receives three
kinds of message, each keyed by a tuple:

* ``("F", s, i)``: the input of stage ``s``'s forward of mini-batch ``i``
  (the output of stage ``s - 1`` on another rank);
* ``("B", s, i)``: the output gradient of stage ``s``'s backward of ``i``
  (the input gradient of stage ``s + 1`` on another rank);
* ``("T", s, i, k)``: a sharer stage's gradient of tied parameter ``k`` for
  owner stage ``s``'s step after mini-batch ``i``.

:func:`plan_receives` orders them per sender **in the order the sender sends
them** (NCCL ignores tags and matches in order), and lists the F and B
receives in the order the program needs them. Tied gradients travel on a
channel of their own (their own queue per sender; the engine sends them on a
process group of their own, so NCCL matches them apart from the F and B
messages): the owner posts the receive of mini-batch ``i``'s tied gradient
when its own stage's forward of ``i`` starts (``tied_at``), so the sharer's
send completes as soon as it is made and the owner holds one receive buffer
per mini-batch in flight (docs/model.md, "Tied parameters"). :func:`post_schedule`
says which receives to post before each op: what it consumes and one more per
link. :func:`message_tag` numbers them uniquely (gloo matches by tag).
:class:`SendWaiter` keeps each sent message alive until its send has
completed, without blocking the rank; :class:`ReadyReceive` stands in for a
receive in an isolated replay.

>>> from workbench.schedules.ops import Op
>>> programs = [[Op(0, "F", 0, 0.0), Op(0, "B", 0, 3.0)], [Op(1, "F", 0, 1.0), Op(1, "B", 0, 2.0)]]
>>> shapes = {0: ((2, 3), "f32"), 1: ((2, 1), "f32")}
>>> r = plan_receives(programs, 1, [0, 1], [0, 1], shapes, {}, {}, 0)
>>> r.incoming, dict(r.queues), r.recv_at, r.tied_at
({('F', 1, 0): (0, (2, 3), 'f32')}, {0: deque([('F', 1, 0)])}, [(0, ('F', 1, 0))], [])
>>> message_tag(("F", 1, 0), steps=4, stages=2, tied=0), message_tag(("B", 0, 0), steps=4, stages=2, tied=0)
(2, 1)
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from workbench.schedules.ops import Op

__all__ = ["Receives", "channel", "plan_receives", "post_schedule", "message_tag", "SendWaiter", "ReadyReceive"]


@dataclass(frozen=True)
class Receives:
    """A rank's receives: ``incoming`` (key -> (sender, shape, dtype)), ``queues`` (:func:`channel` -> keys
    in the sender's order, consumed as they are posted), ``recv_at`` ((program index, key) of the F and B
    receives, in the order needed) and ``tied_at`` ((program index, key) of the tied gradients: posted when
    the op at that index, the owner stage's forward of their mini-batch, starts)."""

    incoming: dict[tuple, tuple[int, tuple[int, ...], Any]]
    queues: dict[Any, deque]
    recv_at: list[tuple[int, tuple]]
    tied_at: list[tuple[int, tuple]]


def channel(key: tuple, src: int) -> Any:
    """The queue a message from ``src`` is matched in: ``src`` for F and B, ``("T", src)`` for tied gradients.

    >>> channel(("F", 1, 0), 2), channel(("T", 0, 3, 0), 2)
    (2, ('T', 2))
    """
    return ("T", src) if key[0] == "T" else src


def plan_receives(programs: Sequence[Sequence[Op]], rank: int, stage_dev: Sequence[int], stage_last: Sequence[int],
                  shapes: dict[int, tuple[tuple[int, ...], Any]], owners: dict[int, list[tuple[int, int, str]]],
                  tied_shapes: dict[tuple[int, str], tuple[tuple[int, ...], Any]], tied: int) -> Receives:
    """Every message ``rank`` receives, queued per sender in the order the sender sends them.

    ``stage_dev[s]``: the device of stage ``s``; ``stage_last[s]``: its last layer; ``shapes[l]``: layer
    ``l``'s output (shape, dtype); ``owners[s]``: (sharer stage, tie, parameter name) for owner stage ``s``;
    ``tied_shapes[(s, name)]``: that parameter's (shape, dtype); ``tied``: the number of tied parameters.
    The example is in the module docstring.
    """
    index = [{(o.stage, o.kind, o.batch): j for j, o in enumerate(p)} for p in programs]
    incoming: dict[tuple, tuple[int, tuple[int, ...], Any]] = {}
    queues: dict[int, list[tuple[tuple[int, int], tuple]]] = {}
    last = len(stage_dev) - 1
    for op in programs[rank]:
        s, i = op.stage, op.batch
        if op.kind == "F" and s > 0 and stage_dev[s - 1] != rank:
            src = stage_dev[s - 1]
            incoming[("F", s, i)] = (src, *shapes[stage_last[s - 1]])
            queues.setdefault(src, []).append(((index[src][(s - 1, "F", i)], 0), ("F", s, i)))
        if op.kind == "B" and s < last and stage_dev[s + 1] != rank:
            src = stage_dev[s + 1]
            incoming[("B", s, i)] = (src, *shapes[stage_last[s]])
            queues.setdefault(src, []).append(((index[src][(s + 1, "B", i)], tied), ("B", s, i)))
        if op.kind == "B":
            for sharer, k, name in owners.get(s, []):
                src = stage_dev[sharer]
                if src != rank:
                    key = ("T", s, i, k)
                    incoming[key] = (src, *tied_shapes[(s, name)])
                    queues.setdefault(channel(key, src), []).append(((index[src][(sharer, "B", i)], k), key))
    recv_at, tied_at = [], []
    for j, o in enumerate(programs[rank]):
        recv_at += [(j, key) for key in ((o.kind, o.stage, o.batch),) if key in incoming]
        if o.kind == "F":
            tied_at += [(j, ("T", o.stage, o.batch, k)) for _, k, _ in owners.get(o.stage, [])
                        if ("T", o.stage, o.batch, k) in incoming]
    return Receives(incoming, {src: deque(key for _, key in sorted(q)) for src, q in queues.items()}, recv_at,
                    tied_at)


def post_schedule(receives: Receives, ops: int, lookahead: int = 1) -> list[list[tuple]]:
    """Per op index of the rank's program (``ops`` of them), the receives to post before it runs: those it
    needs, then on every link (a stage's F receives, its B receives) the next ``lookahead`` needed by later
    ops, and the tied gradients of ``tied_at``. So a stage holds, beside what it consumes, one posted receive
    buffer per link (docs/model.md, "Memory": ``buf_in`` and ``buf_out``), whether its other link is busy or
    it has none.

    >>> r = Receives({}, {}, [(0, ("F", 1, 0)), (2, ("F", 1, 1)), (3, ("B", 1, 0)), (4, ("F", 1, 2))], [])
    >>> post_schedule(r, 5)[1], post_schedule(r, 5)[2]     # op 1 needs none; op 2 needs F(1)
    ([('F', 1, 1), ('B', 1, 0)], [('F', 1, 1), ('F', 1, 2), ('B', 1, 0)])
    """
    by_link: dict[tuple, list[tuple[int, tuple]]] = {}
    for j, key in receives.recv_at:
        by_link.setdefault(key[:2], []).append((j, key))
    out: list[list[tuple]] = [[] for _ in range(ops)]
    for entries in by_link.values():
        nxt = 0                                  # the first entry of the link needed at or after op j
        for j in range(ops):
            while nxt < len(entries) and entries[nxt][0] < j:
                nxt += 1
            now = [key for at, key in entries[nxt:] if at == j]
            out[j] += now + [key for _, key in entries[nxt + len(now):nxt + len(now) + lookahead]]
    for j, key in receives.tied_at:
        out[j].append(key)
    return out


def message_tag(key: tuple, steps: int, stages: int, tied: int) -> int:
    """A message's tag: F and B messages below ``2 * steps * stages``, tied gradients above.

    >>> message_tag(("T", 0, 1, 0), steps=4, stages=2, tied=1)
    18
    """
    kind, s, i = key[0], key[1], key[2]
    if kind == "T":
        return 2 * steps * stages + (i * tied + key[3]) * stages + s
    return (i * stages + s) * 2 + (0 if kind == "F" else 1)


class SendWaiter:
    """Sends in flight, each message kept until its send has completed, then released.

    gloo's send work says it is completed only once ``wait()`` was called on it
    (``is_completed()`` stays False even after the receiver has the data), so a
    list pruned with ``is_completed`` keeps every message of the run. A daemon
    thread waits on the sends in order instead: a message lives until its
    receiver has posted the matching receive, and the rank never blocks on it.

    >>> w = SendWaiter(); w.add(ReadyReceive(), torch.zeros(1)); w.drain()
    """

    def __init__(self) -> None:
        self._queue: "queue.Queue[tuple[Any, torch.Tensor] | None]" = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._wait_all, daemon=True)
        self._thread.start()

    def _wait_all(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, msg = item
            try:
                work.wait()
            except BaseException as e:  # noqa: BLE001 - reported by drain()
                self._error = e
            del item, work, msg
            self._queue.task_done()

    def add(self, work: Any, msg: torch.Tensor) -> None:
        """Keep ``msg`` until ``work`` (its send) has completed."""
        self._queue.put((work, msg))

    def drain(self) -> None:
        """Block until every send so far has completed (the end of a pass)."""
        self._queue.join()
        if self._error is not None:
            raise self._error


class ReadyReceive:
    """A receive that is complete at once: the stand-in for a message in an isolated replay.

    >>> ReadyReceive().wait()
    True
    """

    def wait(self) -> bool:
        return True
