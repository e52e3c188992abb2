"""Blocks of layers: a chain cut into B consecutive groups of balanced compute and cheap cuts.

Long chains are planned on blocks where an exact search over every layer costs too much: the ILP
solves on them (:mod:`workbench.planners.ilp.coarse`, which maps a block plan back to the layers with
:mod:`workbench.planners.ilp.coarsen`), ``dp`` with ``activations="auto"`` restricts its stage
boundaries to them on long chains (:mod:`workbench.planners.dp.auto`), and the explorer draws long
chains by them.

>>> from workbench.model.chain import Chain, Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 1) for i in range(8)))
>>> block_groups(ch, 4)
[(0, 1), (2, 3), (4, 5), (6, 7)]
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.target import Target

__all__ = ["block_groups"]


def block_groups(chain: Chain, blocks: int, platform: Target | None = None, *,
                 comm_weight: float = 1.0, required: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Cut ``chain`` into ``blocks`` consecutive groups (fewer only if the chain is shorter), as
    ``(first, last)`` pairs. ``required``: layers after which a cut is forced (e.g. the cuts of
    the fine DP's plan, so that plan stays expressible on the blocks).

    A DP over cut positions minimises ``sum over blocks (compute / target - 1)^2
    + comm_weight * sum over cuts (comm time / target)`` with ``target`` =
    total compute / blocks: balanced blocks, cheap cuts. With a finite memory
    limit a block whose minimal footprint (one mini-batch in flight) exceeds
    it is not allowed when avoidable.
    """
    L = len(chain)
    B = max(1, min(int(blocks), L))
    if B >= L:
        return [(i, i) for i in range(L)]
    comp = chain.forward + chain.backward
    pre = np.concatenate([[0.0], np.cumsum(comp)])
    total = pre[-1]
    target = total / B if total > 0 else 1.0
    if platform is not None:
        comm = np.array([platform.comm_time(chain.cut(l)) for l in range(L)])
        lin = linear_terms(layer_terms(chain, platform))
        foot = lin.a + lin.w0             # each layer's memory with one mini-batch in flight
        M = platform.memory_limit
    else:
        cb = chain.cuts
        comm = cb / cb.max() * target * 0.1 if cb.max() > 0 else np.zeros(L)
        foot = np.zeros(L)
        M = math.inf
    fpre = np.concatenate([[0.0], np.cumsum(foot)])
    INF = math.inf
    req = sorted(set(int(r) for r in required if 0 <= r < L - 1))
    B = max(B, len(req) + 1)        # every required cut ends a block
    # D[q][j] = best cost of covering layers 0..j-1 with q blocks
    D = np.full((B + 1, L + 1), INF)
    arg = np.zeros((B + 1, L + 1), dtype=int)
    D[0][0] = 0.0
    i = np.arange(L)
    # earliest start of a block ending at j-1: just after the last required cut before j-1
    first_start = np.zeros(L + 1, dtype=int)
    for j in range(1, L + 1):
        r = [x for x in req if x < j - 1]
        first_start[j] = r[-1] + 1 if r else 0
    for q in range(1, B + 1):
        for j in range(q, L + 1):
            starts = i[first_start[j]:j]  # block starts at s, covers s..j-1
            if len(starts) == 0:
                continue
            bc = pre[j] - pre[starts]
            cost = (bc / target - 1.0) ** 2
            if math.isfinite(M):
                cost = cost + np.where(fpre[j] - fpre[starts] > M, 1e6, 0.0)
            cut_pen = comm_weight * comm[j - 1] / target if j < L else 0.0
            tot = D[q - 1][starts] + cost + cut_pen
            s = int(np.argmin(tot))
            D[q][j], arg[q][j] = tot[s], int(starts[s])
    q = B if math.isfinite(D[B][L]) else int(np.argmin(D[1:, L])) + 1
    groups = []
    j = L
    while q > 0:
        s = arg[q][j]
        groups.append((int(s), int(j - 1)))
        j, q = s, q - 1
    return groups[::-1]
