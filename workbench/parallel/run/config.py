"""What every rank of a layout run needs, as one picklable value (it crosses the process boundary).

>>> from workbench.model.layout import Layout
>>> micro_batch_indices(Layout(dp=2), dp=1, micro_batches=3)
[3, 4, 5]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.model.layout import Layout

__all__ = ["LayoutConfig", "micro_batch_indices"]


@dataclass(frozen=True)
class LayoutConfig:
    """One layout run: the pipeline ``plan`` of one replica, its ``layout``, the ``workload``, the
    ``micro_batches`` each replica runs per optimizer step, and how (``steps`` optimizer steps after the
    measured one, learning rate, optimizer, zero_grad loop, backend, device, threads, timeout)."""

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

    @property
    def world(self) -> int:
        return self.layout.devices


def micro_batch_indices(layout: Layout, dp: int, micro_batches: int) -> list[int]:
    """The workload's mini-batch indices the replica at data-parallel coordinate ``dp`` runs as its
    micro-batches: replica d takes ``d * M .. d * M + M - 1``, so the ``dp`` replicas together run
    mini-batches ``0 .. dp * M - 1``, what one process runs for the gradient check."""
    if not 0 <= dp < layout.dp:
        raise ValueError(f"dp coordinate {dp} is outside 0..{layout.dp - 1}")
    return [dp * micro_batches + j for j in range(micro_batches)]
