"""What every rank of a layout run needs, as one picklable value (it crosses the process boundary).

>>> from workbench.model.layout import Layout
>>> micro_batch_indices(Layout(dp=2), dp=1, micro_batches=3)
[3, 4, 5]
>>> micro_batch_indices(Layout(dp=2), dp=1, micro_batches=3, step=1)    # the run's second optimizer step
[9, 10, 11]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.model.layout import Layout

__all__ = ["LayoutConfig", "micro_batch_indices"]


@dataclass(frozen=True)
class LayoutConfig:
    """One layout run: the pipeline ``plan`` of one replica, its ``layout``, the ``workload``, the
    ``micro_batches`` each replica runs per optimizer step, the run's ``optimizer_steps`` (``--steps`` mini-batches
    per replica, over ``micro_batches``), and how (``extra_steps`` optimizer steps after the measured one, learning
    rate, optimizer, zero_grad loop, backend, device, threads, timeout)."""

    plan: Any
    layout: Layout
    workload: Any
    micro_batches: int
    programs: Any = None
    lr: float = 0.0
    optimizer: str = "adam"
    zero_grad: str = "none"
    backend: str = "gloo"
    device: str = "cpu"
    threads: int = 1
    timeout: float = 300.0
    extra_steps: int = 0
    optimizer_steps: int = 1

    @property
    def world(self) -> int:
        return self.layout.devices


def micro_batch_indices(layout: Layout, dp: int, micro_batches: int, step: int = 0) -> list[int]:
    """The workload's mini-batch indices the replica at data-parallel coordinate ``dp`` runs as its micro-batches
    in the run's optimizer step ``step``: replica d takes ``(step * dp_size + d) * M`` and the ``M - 1`` after, so
    the replicas together run mini-batches ``step * dp_size * M ..`` ``(step + 1) * dp_size * M - 1``, and a run
    of k steps ``0 .. k * dp_size * M - 1``, what one process runs for the gradient check."""
    if not 0 <= dp < layout.dp:
        raise ValueError(f"dp coordinate {dp} is outside 0..{layout.dp - 1}")
    first = (step * layout.dp + dp) * micro_batches
    return [first + j for j in range(micro_batches)]
