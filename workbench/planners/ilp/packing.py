"""General plans built from the stage-path bound: its stages packed onto the devices, then timed exactly.

The stage-path bound (:mod:`workbench.planners.ilp.stage_bound`) at a period T
picks the stage partition that needs the least memory with the devices
pooled. Where that partition's stages can be *packed* onto the P devices
(each device's stages within its memory and their compute within T, two
consecutive stages never on one device: they would be one stage), the
packing is a general allocation whose period is close to T unless its
stages' operations collide modulo T; :func:`packed_plan` tries a few periods
between the bound and the incumbent's, packs each partition (first fit by
decreasing memory, then by decreasing compute) and keeps the best allocation
the exact evaluator (:func:`workbench.planners.evaluate.period.allocation_best`)
times below the incumbent. The searches then start from it.

On PipeDream's resnet50 on 8 devices at the third memory level of the
committed figures it found 0.1041 s where the contiguous DP has 0.1123 s and
the guided search found nothing better in 60 s.

>>> from workbench.model.chain import Chain, Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 0, saved_bytes=10) for i in range(4)), input_bytes=0)
>>> pack([(0, 0, 30.0, 2.0), (1, 1, 20.0, 2.0), (2, 2, 20.0, 2.0)], 2, 50.0, 4.0)
[0, 1, 0]
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from workbench.model.chain import Chain
from workbench.model.plan import Plan, make_plan
from workbench.model.target import Target
from workbench.model.tolerances import BETTER, LOAD_SLACK, MEMORY_SLACK
from workbench.planners.budget import within
from workbench.planners.evaluate.period import allocation_best, normalise
from workbench.planners.ilp.stage_bound import stage_partition

__all__ = ["pack", "packed_plan", "PERIODS", "CHECK_SECONDS"]

#: periods tried between the bound and the incumbent's period
PERIODS = 6
#: seconds the exact evaluator may spend on one packed allocation at most
CHECK_SECONDS = 3.0


def pack(stages: Sequence[tuple[int, int, float, float]], devices: int, memory: float, period: float,
         by: int = 2) -> list[int] | None:
    """A device per stage (``(first, last, memory, compute)``), first fit in decreasing order of item
    ``by`` (2: memory, 3: compute), each device within ``memory`` and ``period``, consecutive stages on
    different devices; None if a stage fits nowhere."""
    mem = [0.0] * devices
    load = [0.0] * devices
    dev: list[int | None] = [None] * len(stages)
    for s in sorted(range(len(stages)), key=lambda t: -stages[t][by]):
        _, _, m, w = stages[s]
        near = {dev[s - 1] if s > 0 else None, dev[s + 1] if s + 1 < len(stages) else None}
        fit = [p for p in range(devices) if p not in near and mem[p] + m <= memory * (1 + MEMORY_SLACK)
               and load[p] + w <= period * (1 + LOAD_SLACK)]
        if not fit:
            return None
        p = max(fit, key=lambda q: (mem[q], -q)) if by == 2 else min(fit, key=lambda q: (load[q], q))
        dev[s] = p
        mem[p] += m
        load[p] += w
    return [int(d) for d in dev]


def packed_plan(chain: Chain, platform: Target, bound: float, incumbent: Plan, deadline: Any = None) -> Plan | None:
    """The best plan below ``incumbent``'s period among the packings of the stage-path bound's partitions at
    :data:`PERIODS` periods from ``bound`` up to the incumbent's (module docstring); None if none beats it.
    ``deadline``: a ``perf_counter`` time or a :class:`~workbench.planners.budget.WorkDeadline`."""
    best_T, best = incumbent.period, None
    hi = incumbent.period
    lo = max(bound, 1e-300)
    tried: set[tuple[int, ...]] = set()
    for T in np.geomspace(lo * (1 + 1e-6), hi, PERIODS) if hi > lo else []:
        if deadline is not None and time.perf_counter() > deadline:
            break
        stages = stage_partition(chain, platform, float(T))
        if not stages:
            continue
        for by in (2, 3):
            dev = pack(stages, platform.devices, platform.memory_limit, float(T), by)
            if dev is None:
                continue
            a = [0] * len(chain)
            for (i, j, _, _), d in zip(stages, dev):
                a[i:j + 1] = [d] * (j - i + 1)
            key = normalise(a)
            if key in tried:
                continue
            tried.add(key)
            try:
                r = allocation_best(chain, platform, key, best_T * (1 - BETTER),
                                    deadline=within(deadline, CHECK_SECONDS, "guided_search"))
            except TimeoutError:
                continue
            if r is not None and r[0] < best_T * (1 - BETTER):
                best_T, best = r[0], make_plan(chain, platform, r[0], list(key), r[1], r[2], method="packing")
    return best if best is not None and math.isfinite(best_T) else None
