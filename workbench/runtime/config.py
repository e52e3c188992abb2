"""What a rank needs to run its share of a plan, on either engine: :class:`RunConfig`.

It crosses the process boundary (pickled by ``torch.multiprocessing``), so it
holds plain values: the plan, the per-device programs
(:mod:`~workbench.schedules.program`), the workload
(:mod:`~workbench.profiles.workload`) and the run's settings.

>>> from workbench.model.plan import Plan
>>> cfg = RunConfig(Plan(1.0, (0,), (), 1), [[]], None, steps=2)
>>> cfg.weights, cfg.backend, cfg.engine, cfg.lookahead, cfg.zero_grad
('stash', 'gloo', 'pipedream', 1, 'none')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.model.plan import Plan
from workbench.schedules.ops import Op

__all__ = ["RunConfig"]


@dataclass
class RunConfig:
    """Everything a rank needs (picklable: it crosses the process boundary)."""

    plan: Plan
    programs: list[list[Op]]
    workload: Any                     # engine.Workload
    steps: int
    lr: float = 0.0
    weights: str = "stash"
    backend: str = "gloo"
    device: str = "cpu"              # "cpu" or "cuda"
    threads: int = 1
    timeout: float = 120.0
    lookahead: int = 1              # receives posted ahead on each link (the model counts one per link)
    warmup: bool = True
    isolated: bool = False           # replay this device alone: receives are random tensors, sends dropped
    engine: str = "pipedream"        # "torch" or "pipedream"
    optimizer: str = "adam"
    extra: dict[str, Any] = field(default_factory=dict)
    zero_grad: str = "none"          # the training loop: "none" (torch's default zero_grad()) or "zeros" (in place)
