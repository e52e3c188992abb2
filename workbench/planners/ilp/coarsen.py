"""Coarsening: map a plan on blocks of layers back to the layers.

Real networks have 40 to 1,000 layers; the ILP is exact but grows with the
chain. :func:`workbench.planners.blocks.block_groups` cuts the chain into B blocks of balanced compute,
preferring cuts that send few bytes and refusing blocks that alone exceed the
memory limit; a plan of ``chain.coarsen(groups)`` expands to the fine chain
(:func:`expand_plan`): a block plan's stages are runs of whole blocks, with the
same sums (F, B, saved, weights) and the same cut after them, so its period
and start times are valid for the fine chain as they are (re-checked).

The ILP on blocks, and what it costs, is :mod:`workbench.planners.ilp.coarse`.

>>> expand_assignment([(0, 1), (2, 4)], [1, 0])
[1, 1, 0, 0, 0]
"""

from __future__ import annotations

from typing import Sequence

from workbench.model.chain import Chain
from workbench.model.plan import Plan, make_plan, stages_of
from workbench.model.target import Target

__all__ = ["expand_assignment", "expand_plan"]


def expand_assignment(groups: Sequence[tuple[int, int]], block_assignment: Sequence[int]) -> list[int]:
    """Layer assignment from a block assignment."""
    out: list[int] = []
    for (a, b), d in zip(groups, block_assignment):
        out.extend([int(d)] * (b - a + 1))
    return out


def expand_plan(plan: Plan, chain: Chain, platform: Target, groups: Sequence[tuple[int, int]]) -> Plan:
    """The fine-chain plan of a block plan: same period, same stage start times."""
    asg = expand_assignment(groups, plan.assignment)
    runs = stages_of(asg)
    assert len(runs) == len(plan.stages)
    return make_plan(chain, platform, plan.period, asg, [s.fwd_start for s in plan.stages],
                     [s.bwd_start for s in plan.stages], method=plan.method, allocation=plan.allocation,
                     status=plan.status, gap=plan.gap, notes=plan.notes)
