"""Tests for workbench.planners.ilp.options: a misspelt option is an error naming it."""

from __future__ import annotations

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.planners.budget import PhaseShares
from workbench.planners.ilp.options import COARSEN_ABOVE, IlpOptions
from workbench.planners.ilp.planner import plan_ilp

CHAIN = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
PLAT = Target.of(2, memory=10_000, memory_model="paper")


def test_an_unknown_option_is_refused_by_name_everywhere():
    with pytest.raises(ValueError, match="ilp has no option 'serach_seconds'"):
        plan_ilp(CHAIN, PLAT, serach_seconds=3)
    with pytest.raises(ValueError, match="'micro_batches'"):
        run_planner(CHAIN, PLAT, "ilp", micro_batches=4)      # a flushed schedule's option
    with pytest.raises(ValueError, match="cover_share"):
        IlpOptions(cover_share=0.0)
    with pytest.raises(ValueError, match="activations"):
        IlpOptions(activations="recompute")


def test_options_reach_the_solve_and_the_registry():
    lines: list[str] = []
    p = run_planner(CHAIN, PLAT, "ilp", allocation="general", progress=lines.append, deterministic=True, cover=False)
    assert p.status == "optimal" and lines and lines[-1].startswith("ilp: optimal")
    assert p.extra["deterministic"] is True
    given = IlpOptions(cover=False, shares=PhaseShares(local_search=0.1))
    assert plan_ilp(CHAIN, PLAT, options=given, rel_gap=1e-3).period == p.period


def test_blocks_coarsen_long_chains_only():
    assert IlpOptions().blocks(COARSEN_ABOVE) == 0 and IlpOptions().blocks(COARSEN_ABOVE + 1) == COARSEN_ABOVE
    assert IlpOptions(coarsen=False).blocks(1000) == 0 and IlpOptions(coarsen=8).blocks(8) == 0
