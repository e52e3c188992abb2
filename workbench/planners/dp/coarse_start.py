"""A first plan for dp on long chains: the exact DP on blocks of layers, its partition timed on the layers.

On a long chain whose memory limit binds, one probe of the memory DP (:mod:`workbench.planners.dp.memory_dp`)
costs about the layers times the longest stage at that period, and the period search may need a probe far above
the optimum before it finds any plan (50,000 layers on 64 devices at 256 GiB: 68 s for that probe, the optimum
12.19 s found after 628 s). On blocks of about ten layers the same DP costs about a hundredth: its plan, a
partition of the layers on block boundaries, is timed exactly on the layers
(:func:`workbench.planners.dp.contiguous.partition_period`) and starts the period search as its incumbent
(:func:`workbench.bisection.least_feasible`, ``start``): under a time limit dp returns it with its gap, and the
search below it stays exact.

>>> from workbench.model.chain import Chain, Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 1) for i in range(10)))
>>> equal_blocks(ch, 3)
[(0, 3), (4, 6), (7, 9)]
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from workbench.model.chain import Chain

__all__ = ["equal_blocks", "block_start", "LAYERS_PER_BLOCK", "MIN_LAYERS"]

#: layers per block of the first plan
LAYERS_PER_BLOCK = 10
#: chains shorter than this plan without it
MIN_LAYERS = 5_000

Bounds = list[tuple[int, int]]


def equal_blocks(chain: Chain, blocks: int) -> Bounds:
    """``blocks`` consecutive groups of about equal compute (fewer if layers of no compute fall together), in O(L)
    (:func:`workbench.planners.blocks.block_groups` weighs cuts too, at a cost quadratic in the layers)."""
    L = len(chain)
    pre = np.cumsum(chain.forward + chain.backward)
    targets = pre[-1] * np.arange(1, blocks) / blocks
    ends = np.unique(np.clip(np.searchsorted(pre, targets, side="left"), 0, L - 2))
    starts = np.concatenate([[0], ends + 1])
    return [(int(a), int(b)) for a, b in zip(starts, np.concatenate([ends, [L - 1]]))]


def block_start(chain: Chain, plan_blocks: Callable[[Chain], Sequence[tuple[int, int]] | None],
                period_of: Callable[[Bounds], float]) -> tuple[Bounds, float] | None:
    """The partition ``plan_blocks`` finds on the blocks of :func:`equal_blocks` (None: none), on the layers, and
    its exact period there (``period_of``); None when it finds none or it does not fit on the layers."""
    groups = equal_blocks(chain, max(2, len(chain) // LAYERS_PER_BLOCK))
    found = plan_blocks(chain.coarsen(groups))
    if not found:
        return None
    bounds = [(groups[a][0], groups[b][1]) for a, b in found]
    period = period_of(bounds)
    return (bounds, period) if math.isfinite(period) else None
