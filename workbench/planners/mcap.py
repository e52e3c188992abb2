"""``mcap``: the memory-balanced partition (after mCAP, Dreuning et al., Middleware 2022), our
schedule on top.

mCAP partitions a pipeline so that the devices' *peak memory* is balanced, for the
one-forward-one-backward (1F1B) schedule of PipeDream, where the stage that starts a suffix
of q stages holds q mini-batches in flight. Here, with the workbench's memory model
(:mod:`workbench.model.memory`, each stage alone on its device)::

    stage i..j starting a q-stage suffix needs   mem(i, j, q) = q A + static + (q-1) stash + extra
    G[q][i] = min_j max( mem(i, j, q), G[q-1][j+1] )              (suffix from layer i)

an exact bottleneck DP over partitions into P stages (every device used, as mCAP; fewer
stages would hold fewer mini-batches but leave devices idle) gives the least largest peak M*;
a second bottleneck DP, over the partitions whose every stage needs at most M* (1 + 1e-9),
gives the least slowest-stage time ``max(F + B, c)`` among them. The
periodic schedule is then put on top as for the other baselines
(:func:`workbench.planners.baselines.schedule_on_top`: the least period that fits the limit,
where in-flight counts can fall below 1F1B's). The partition does not depend on the limit.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 10, 100) for i in range(4)), input_bytes=10)
>>> mcap_partition(ch, Target.of(2, memory_model="paper"))   # two in flight x 100 on the first stage; 3 x 100 after
(300.0, [(0, 0), (1, 3)])
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import square_terms
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.tolerances import MEMORY_SLACK
from workbench.model.units import format_bytes
from workbench.planners.baselines import schedule_on_top
from workbench.planners.partition import boundary_costs, suffix_bounds

__all__ = ["plan_mcap", "mcap_partition"]


def _suffix_bottleneck(cost: list[np.ndarray], L: int, P: int) -> tuple[float, list[tuple[int, int]]]:
    """Minimise the largest ``cost[q-1][i, j]`` (stage i..j starting a q-stage suffix) over
    partitions into exactly min(P, L) stages."""
    G = [cost[0][:, L - 1].copy()]
    args: list[np.ndarray] = [np.full(L, L - 1)]
    for q in range(2, min(P, L) + 1):
        down = np.concatenate([G[-1][1:], [np.inf]])         # down[j] = G[q-1][j+1]
        m = np.maximum(cost[q - 1], down[None, :])
        m[:, L - 1] = np.inf                                  # a non-last stage cannot end at the last layer
        arg = np.argmin(m, axis=1)
        G.append(m[np.arange(L), arg])
        args.append(arg)
    return float(G[-1][0]), suffix_bounds(args, len(G))


def mcap_partition(chain: Chain, platform: Target) -> tuple[float, list[tuple[int, int]]]:
    """(the least largest device memory under 1F1B in-flight counts, a partition reaching it with the
    least slowest stage among such partitions)."""
    L, P = len(chain), platform.devices
    sq = square_terms(layer_terms(chain, platform))
    upper = np.arange(L)[None, :] >= np.arange(L)[:, None]
    mem = [np.where(upper, sq.memory(np.full((L, L), float(q))), np.inf) for q in range(1, min(P, L) + 1)]
    peak, _ = _suffix_bottleneck(mem, L, P)
    pf = np.concatenate([[0.0], np.cumsum(chain.forward + chain.backward)])
    fb = pf[1:][None, :] - pf[:-1][:, None]
    time_cost = np.maximum(fb, boundary_costs(chain, platform)[None, :])
    tol = peak * (1 + MEMORY_SLACK) if math.isfinite(peak) else peak
    cost = [np.where(upper & (m <= tol), time_cost, np.inf) for m in mem]
    _, bounds = _suffix_bottleneck(cost, L, P)
    return peak, bounds


def plan_mcap(chain: Chain, platform: Target, *, allocation: str = "contiguous",
              time_limit: float | None = None, **options: Any) -> Plan:
    """The memory-balanced partition with the periodic schedule on top (see the module docstring)."""
    t0 = time.perf_counter()
    notes = ["contiguous (straight pipeline): allocation 'general' ignored"] if allocation == "general" else []
    peak, bounds = mcap_partition(chain, platform)
    notes.append(f"mcap: largest device memory under 1F1B in-flight counts {format_bytes(peak)}")
    plan = schedule_on_top(chain, platform, bounds, "mcap", notes=notes, t_start=t0)
    return plan.with_(extra={**plan.extra, "mcap_peak": peak})
