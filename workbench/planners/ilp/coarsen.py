"""Coarsening: cut a chain into blocks of layers, and map a plan on the blocks back to the layers.

Real networks have 40 to 1,000 layers; the ILP is exact but grows with the
chain. :func:`block_groups` cuts the chain into B blocks of balanced compute,
preferring cuts that send few bytes and refusing blocks that alone exceed the
memory limit; a plan of ``chain.coarsen(groups)`` expands to the fine chain
(:func:`expand_plan`): a block plan's stages are runs of whole blocks, with the
same sums (F, B, saved, weights) and the same cut after them, so its period
and start times are valid for the fine chain as they are (re-checked).

The ILP on blocks, and what it costs, is :mod:`workbench.planners.ilp.coarse`.

>>> from workbench.model.chain import Chain, Layer
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 1) for i in range(8)))
>>> block_groups(ch, 4)
[(0, 1), (2, 3), (4, 5), (6, 7)]
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from workbench.model.chain import Chain, Platform
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.plan import Plan, make_plan, stages_of

__all__ = ["block_groups", "expand_assignment", "expand_plan"]



def block_groups(chain: Chain, blocks: int, platform: Platform | None = None, *,
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
        M = platform.memory
    else:
        cb = chain.cuts
        comm = cb / cb.max() * target * 0.1 if cb.max() > 0 else np.zeros(L)
        foot = np.zeros(L)
        M = math.inf
    fpre = np.concatenate([[0.0], np.cumsum(foot)])
    INF = math.inf
    # D[q][j] = best cost of covering layers 0..j-1 with q blocks
    D = np.full((B + 1, L + 1), INF)
    arg = np.zeros((B + 1, L + 1), dtype=int)
    D[0][0] = 0.0
    i = np.arange(L)
    req = sorted(set(int(r) for r in required if 0 <= r < L - 1))
    B = max(B, len(req) + 1)
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


def expand_assignment(groups: Sequence[tuple[int, int]], block_assignment: Sequence[int]) -> list[int]:
    """Layer assignment from a block assignment."""
    out: list[int] = []
    for (a, b), d in zip(groups, block_assignment):
        out.extend([int(d)] * (b - a + 1))
    return out


def expand_plan(plan: Plan, chain: Chain, platform: Platform, groups: Sequence[tuple[int, int]]) -> Plan:
    """The fine-chain plan of a block plan: same period, same stage start times."""
    asg = expand_assignment(groups, plan.assignment)
    runs = stages_of(asg)
    assert len(runs) == len(plan.stages)
    return make_plan(chain, platform, plan.period, asg, [s.fwd_start for s in plan.stages],
                     [s.bwd_start for s in plan.stages], method=plan.method, allocation=plan.allocation,
                     status=plan.status, gap=plan.gap, notes=plan.notes)
