"""The op record: one compute operation of a schedule, as every schedule family produces it.

A periodic plan unrolled, GPipe's and 1F1B's orders, torch's multi-stage schedules read from torch: each
gives, per device, a sequence of :class:`Op`. The simulators (:mod:`workbench.schedules.simulate_orders`),
the checker's replay (:mod:`workbench.verify.check_flushed`), the order's memory
(:mod:`workbench.schedules.order_memory`) and the runtime's programs (:mod:`workbench.schedules.program`)
read that one record; what happened is a :class:`~workbench.model.trace.Trace`, one row per operation.

>>> op = Op(3, "I", 1)
>>> str(op), op.key, Op(0, "F", 2, time=1.5).time
('3I1', (3, 'I', 1), 1.5)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Op", "KINDS"]

#: the compute kinds: forward, full backward, input-gradient backward, weight-gradient backward
KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True, order=True)
class Op:
    """``kind`` (``F``, ``B``, ``I`` or ``W``) of ``stage`` on (micro-)batch ``batch``; ``time`` places it:
    a periodic plan's planned start, or its position in an order read from torch (0, 1, 2, ... per device)."""

    stage: int
    kind: str
    batch: int
    time: float = 0.0

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.batch}"

    @property
    def key(self) -> tuple[int, str, int]:
        """(stage, kind, batch): what the operation is, wherever it is placed."""
        return (self.stage, self.kind, self.batch)
