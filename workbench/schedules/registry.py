"""Every schedule a plan can name, and what it means to the modules that plan, order, simulate, check and run it.

A plan's ``schedule`` is ``periodic`` (each stage's forward and backward start times repeat every period,
docs/model.md "Plan") or the name of a flushed method of :mod:`workbench.methods` (micro-batches, then a
flush): the workbench's own GPipe and 1F1B, whose per-stage orders are written here, and torch's
multi-stage schedules, whose order torch's own class computes (:mod:`workbench.schedules.torch_orders`);
GPipe's and 1F1B's per-stage orders follow from their methods' ``warmup``.
Each is one :class:`Schedule`; the other modules ask it instead of testing names. The flushed entries are
derived from the methods: **adding one of torch's schedule classes is one** :class:`~workbench.methods.Method`
**naming its** ``torch_class`` (with its layout, whether it splits the backward, the stages per device it
requires) **and its test**; the planner, the order, the simulator, the checker's replay and the runtime
follow from this entry.

The structural rules of a schedule are here too: where its stages go (:meth:`Schedule.stage_devices`: the
looped layout puts stage s on device s mod P, the V layout on s, then 2P - 1 - s; a periodic plan or
GPipe/1F1B on the devices its planner chose) and how many stages a device takes (:meth:`Schedule.chunks`).

>>> schedule_of("zbv").stage_devices(2, 4), schedule_of("looped-bfs").stage_devices(2, 4)
([0, 1, 1, 0], [0, 1, 0, 1])
>>> [str(op) for op in schedule_of("1f1b").stage_order(2, 0, 3)]
['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
>>> schedule_of("periodic").flushed, schedule_of("gpipe").engine("stash"), schedule_of("periodic").engine("stash")
(False, 'torch', 'pipedream')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from workbench.methods import METHODS, Method
from workbench.schedules.ops import Op

__all__ = ["Schedule", "SCHEDULES", "TORCH_SCHEDULES", "schedule_of"]

#: one flush of stage ``s`` of ``S`` for ``m`` micro-batches: its operations in order
StageOrder = Callable[[int, int, int], list[Op]]


@dataclass(frozen=True)
class Schedule:
    """A schedule a plan can name (see the module docstring).

    ``flushed``: micro-batches, then a flush (else periodic); ``layout``: ``plan`` (the planner places the
    stages), ``loop`` or ``v`` (torch's layouts); ``torch_class``: its class in
    ``torch.distributed.pipelining.schedules`` (empty: the workbench orders it); ``split_backward``: it runs
    a backward as ``I`` and ``W``; ``fixed_chunks``: the stages per device it requires (None: any);
    ``stage_order``: the workbench's own order of one stage's operations in a flush.
    """

    name: str
    flushed: bool
    layout: str = "plan"
    torch_class: str = ""
    split_backward: bool = False
    fixed_chunks: int | None = None
    stage_order: StageOrder | None = None

    @property
    def from_torch(self) -> bool:
        """Its order is torch's own class's (:func:`workbench.schedules.torch_orders.torch_order`)."""
        return bool(self.torch_class)

    @property
    def stages_meet(self) -> bool:
        """Two neighbouring stages may sit on one device (a V's turn): such a plan records its stages explicitly
        instead of as maximal runs of layers on one device."""
        return self.layout == "v"

    def chunks(self, chunks: int | None) -> int:
        """The stages per device it runs with: its fixed count, else ``chunks`` (default 2).

        >>> schedule_of("zbv").chunks(None), schedule_of("interleaved-1f1b").chunks(3)
        (2, 3)
        >>> schedule_of("dualpipev").chunks(3)
        Traceback (most recent call last):
        ...
        ValueError: dualpipev puts exactly 2 stages on each device (torch's ScheduleDualPipeV); --chunks 3 is not
        possible
        """
        if self.fixed_chunks is not None:
            if chunks is not None and int(chunks) != self.fixed_chunks:
                raise ValueError(f"{self.name} puts exactly {self.fixed_chunks} stages on each device (torch's "
                                 f"{self.torch_class}); --chunks {chunks} is not possible")
            return self.fixed_chunks
        v = 2 if chunks is None else int(chunks)
        if v < 1:
            raise ValueError(f"chunks (stages per device) must be at least 1, got {chunks}")
        return v

    def stage_devices(self, devices: int, stages: int) -> list[int]:
        """The device of each of ``stages`` stages on ``devices`` devices in its layout (module docstring); a
        ``ValueError`` for a schedule whose planner places its stages."""
        if self.layout == "v":
            return [s if s < devices else 2 * devices - 1 - s for s in range(stages)]
        if self.layout == "loop":
            return [s % devices for s in range(stages)]
        raise ValueError(f"a {self.name} plan puts its stages where its planner chose; no layout to read")

    def engine(self, weights: str) -> str:
        """The runtime's engine for it: PipeDream's fallback for a periodic plan with weight stashing (a step
        after every backward), else torch's pipelining engine."""
        return "pipedream" if not self.flushed and weights == "stash" else "torch"


def _warm_then_alternate(warmup: str) -> StageOrder:
    """The workbench's own order of a stage in one flush: its warm-up forwards (``all``: every micro-batch, as
    GPipe; ``downstream``: min(m, S - 1 - s), as 1F1B), then one forward and one backward in turn, then the
    backwards left."""
    if warmup not in ("all", "downstream"):
        raise ValueError(f"warmup must be 'all' or 'downstream', got {warmup!r}")

    def order(S: int, s: int, m: int) -> list[Op]:
        warm = m if warmup == "all" else min(m, S - 1 - s)
        out = [Op(s, "F", j) for j in range(warm)]
        for j in range(m - warm):
            out += [Op(s, "F", warm + j), Op(s, "B", j)]
        return out + [Op(s, "B", j) for j in range(m - warm, m)]

    return order


def _of(m: Method) -> Schedule:
    if not m.torch_class and not m.warmup:
        raise ValueError(f"flushed method {m.name!r} names neither a torch_class nor a warmup")
    return Schedule(m.name, True, m.layout or "plan", m.torch_class, m.split_backward, m.fixed_chunks,
                    None if m.torch_class else _warm_then_alternate(m.warmup))


#: every schedule by the name a plan records: ``periodic``, then the flushed methods in registry order
SCHEDULES: dict[str, Schedule] = {"periodic": Schedule("periodic", False)} | {
    m.name: _of(m) for m in METHODS if m.family == "flushed"}

#: torch's multi-stage schedules, in registry order
TORCH_SCHEDULES: tuple[str, ...] = tuple(n for n, s in SCHEDULES.items() if s.from_torch)


def schedule_of(name: str) -> Schedule:
    """The schedule a plan's ``schedule`` names; a ``ValueError`` naming the choices otherwise.

    >>> schedule_of("zbv").torch_class
    'ScheduleZBVZeroBubble'
    >>> schedule_of("loop")
    Traceback (most recent call last):
    ...
    ValueError: unknown schedule 'loop'; a plan's schedule is one of periodic, gpipe, 1f1b, ...
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; a plan's schedule is one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name]
