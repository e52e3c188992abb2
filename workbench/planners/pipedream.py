"""``pipedream``: PipeDream's partitioner (straight pipeline, no replication), our schedule on top.

PipeDream (Narayanan et al., SOSP 2019, section 3.1; ``optimizer/`` in
msr-fiddle/pipedream) partitions a chain by dynamic programming, minimising
the time of the slowest stage, where a stage's time is the larger of its
compute time and the time to move its boundary activations, counted as
``2 * bytes / bandwidth`` (activations forward and gradients back share the
estimate). Here, without replication::

    stage i..j costs  max( F+B (i..j),  2 c_j )
    E[q][i] = min_j max( cost(i..j), E[q-1][j+1] )     (suffix from layer i, q stages)

Its memory check assumes, as the brief and PipeDream's 1F1B analysis do,
that a stage keeps one copy of its activations *and* one weight version
per stage from it to the end of the pipeline (in-flight = stages
downstream, inclusive), so the stage that starts a q-stage suffix is
charged ``q * (A + W)`` bytes, with A the saved activations and W the
parameter bytes (PipeDream's own model: no weight factor). Partitions
whose charge exceeds M are rejected inside the DP.

The periodic schedule is then put on top (``best_schedule``): our rules
(docs/model.md, "Plan") decide the real period and memory. If PipeDream's
partition does not fit under our rules, the memory-blind schedule is
returned with a "does not fit" note (as for the baselines); if PipeDream's
DP itself finds nothing under M, the plan is infeasible and says how much
memory PipeDream's own model needs at least.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(4)))
>>> plan_pipedream(ch, Target.of(2, memory_model="paper")).assignment
(0, 0, 1, 1)
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from workbench.model.chain import Chain
from workbench.model.plan import Plan, infeasible_plan
from workbench.model.target import Target
from workbench.model.tolerances import MEMORY_SLACK
from workbench.model.units import format_bytes
from workbench.planners.baselines import schedule_on_top
from workbench.planners.partition import StageSums, suffix_bounds

__all__ = ["plan_pipedream", "pipedream_partition", "pipedream_memory_need"]


def pipedream_partition(chain: Chain, platform: Target, *, memory: float | None = None
                        ) -> tuple[float, list[tuple[int, int]]] | None:
    """PipeDream's straight-pipeline DP: (its estimated slowest-stage time, partition), or None.

    ``memory`` defaults to the platform's limit. At most P stages; among
    equal estimates the one with fewest stages.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 10, 10) for i in range(4)))
    >>> pipedream_partition(ch, Target.of(2, memory_model="paper"))
    (4.0, [(0, 1), (2, 3)])
    >>> pipedream_partition(ch, Target.of(2, memory_model="paper"), memory=50) is None
    True
    """
    t = StageSums(chain, platform)
    L = t.L
    M = platform.memory_limit if memory is None else float(memory)
    M = M * (1 + MEMORY_SLACK)
    cost = np.maximum(t.FB, 2 * t.c[None, :])
    cost = np.where(t.upper, cost, np.inf)
    charge = t.A + t.W                                       # one copy of activations and weights
    # q = 1: the last stage i..L-1
    E = [np.where(charge[:, L - 1] <= M, t.FB[:, L - 1], np.inf)]
    args: list[np.ndarray] = [np.full(L, L - 1)]
    for q in range(2, min(platform.devices, L) + 1):
        down = np.concatenate([E[-1][1:], [np.inf]])        # down[j] = E[q-1][j+1]
        m = np.maximum(cost, down[None, :])
        m[:, L - 1] = np.inf                                 # a non-last stage cannot end at the end
        m = np.where(q * charge <= M, m, np.inf)             # PipeDream's memory check: q stages downstream
        arg = np.argmin(m, axis=1)
        E.append(m[np.arange(L), arg])
        args.append(arg)
    finals = [e[0] for e in E]
    q = int(np.argmin(finals)) + 1
    if not math.isfinite(finals[q - 1]):
        return None
    return float(finals[q - 1]), suffix_bounds(args, q)


def pipedream_memory_need(chain: Chain, platform: Target) -> float:
    """The least M under which PipeDream's DP finds a partition (its own memory model).

    Candidate values are the charges ``q * (A + W)`` of every stage; the
    answer is the smallest candidate the DP accepts (bisection: acceptance is
    monotone in M).
    """
    t = StageSums(chain, platform)
    L = t.L
    charge = (t.A + t.W)[t.upper]
    qs = np.arange(1, min(platform.devices, L) + 1)
    cands = np.unique((qs[:, None] * charge[None, :]).ravel())
    lo, hi = 0, len(cands) - 1
    if pipedream_partition(chain, platform, memory=cands[hi]) is None:
        return math.inf
    while lo < hi:
        mid = (lo + hi) // 2
        if pipedream_partition(chain, platform, memory=cands[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    return float(cands[lo])


def plan_pipedream(chain: Chain, platform: Target, *, allocation: str = "contiguous",
                   time_limit: float | None = None, **options: Any) -> Plan:
    """PipeDream's partition with the periodic schedule on top (see the module docstring)."""
    t0 = time.perf_counter()
    notes = ["contiguous (straight pipeline): allocation 'general' ignored"] if allocation == "general" else []
    found = pipedream_partition(chain, platform)
    if found is None:
        need = pipedream_memory_need(chain, platform)
        return infeasible_plan(
            chain, platform, "pipedream",
            f"PipeDream's partitioner finds no partition under {format_bytes(platform.memory_limit)}: "
            f"its memory model (stage charged (A+W) x stages downstream) needs at least {format_bytes(need)}",
            allocation=allocation, solve_seconds=time.perf_counter() - t0)
    estimate, bounds = found
    notes.append(f"PipeDream's estimate of the slowest stage: {estimate:.6g} s")
    plan = schedule_on_top(chain, platform, bounds, "pipedream", notes=notes, t_start=t0)
    return plan.with_(extra={**plan.extra, "pipedream_estimate": estimate})
