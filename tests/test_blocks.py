"""workbench.planners.blocks: a chain cut into balanced blocks with cheap cuts."""

from __future__ import annotations

import numpy as np
import pytest

from instances import block_chain, covers
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.blocks import block_groups


@pytest.mark.parametrize("L,B", [(10, 3), (37, 8), (50, 50), (5, 9)])
def test_groups_cover_in_order_with_the_requested_count(L, B):
    ch = block_chain(np.random.default_rng(L), L)
    g = block_groups(ch, B, Target.of(3, bandwidth=5.0, memory_model="paper"))
    assert covers(g, L)
    assert len(g) == min(B, L)


def test_groups_are_balanced_and_keep_required_cuts():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 1) for i in range(12)))
    assert block_groups(ch, 4) == [(0, 2), (3, 5), (6, 8), (9, 11)]
    g = block_groups(ch, 4, required=[0, 7])
    assert covers(g, 12) and len(g) == 4
    ends = {b for _, b in g}
    assert {0, 7} <= ends


def test_groups_prefer_cheap_cuts():
    # equal compute; the cut after layer 2 is free, the one after layer 3 costs a lot
    layers = [Layer(f"l{i}", 1.0, 1.0, 1, 1000.0) for i in range(8)]
    layers[2] = Layer("l2", 1.0, 1.0, 1, 0.0)
    ch = Chain(tuple(layers))
    g = block_groups(ch, 2, Target.of(2, bandwidth=100.0, memory_model="paper"))
    assert g == [(0, 2), (3, 7)]


def test_more_required_cuts_than_blocks_make_more_blocks():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 1) for i in range(6)))
    g = block_groups(ch, 2, required=[0, 2, 4])
    assert covers(g, 6) and {0, 2, 4} <= {b for _, b in g} and len(g) == 4
