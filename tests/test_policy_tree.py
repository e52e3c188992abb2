"""Tests for workbench.planners.dp.policy_tree: versions' policy vectors kept as a tree of parents."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.planners.dp.policy_tree import PolicyTree


@pytest.mark.parametrize("seed", range(5))
def test_vectors_match_explicitly_kept_ones(seed):
    """Grow versions layer by layer, in batches, and compare every node's vector with a list kept alongside."""
    rng = np.random.default_rng(seed)
    tree = PolicyTree()
    explicit: dict[int, tuple[int, ...]] = {}
    first = [int(x) for x in rng.integers(0, 3, 3)]
    frontier = tree.add(np.full(3, -1), np.array(first))          # three stages' first layer
    for node, pol in zip(frontier, first):
        explicit[int(node)] = (pol,)
    for _layer in range(6):
        parents = rng.choice(frontier, size=int(rng.integers(1, 6)))
        if rng.random() < 0.5:
            pol = int(rng.integers(0, 3))
            ids = tree.add(parents, pol)                              # one policy for all
            policies = [pol] * len(parents)
        else:
            policies = [int(x) for x in rng.integers(0, 3, len(parents))]
            ids = tree.add(parents, np.array(policies))
        for node, parent, pol in zip(ids, parents, policies):
            explicit[int(node)] = explicit[int(parent)] + (pol,)
        frontier = ids
    for node, vec in explicit.items():
        assert tree.vector(node) == vec


def test_ids_are_consecutive_and_adding_after_reading_works():
    tree = PolicyTree()
    a = tree.add(np.array([-1, -1]), np.array([0, 2]))
    assert a.tolist() == [0, 1]
    assert tree.vector(1) == (2,)                 # flattens the tree ...
    b = tree.add(np.array([1, 0]), 1)             # ... which a later add must not leave stale
    assert b.tolist() == [2, 3]
    assert (tree.vector(2), tree.vector(3)) == ((2, 1), (0, 1))


def test_empty_tree_and_root_sentinel():
    assert PolicyTree().vector(-1) == ()
    tree = PolicyTree()
    assert tree.add(np.zeros(0, np.int64), 1).tolist() == []
    assert tree.vector(-1) == ()


def test_policies_must_broadcast_to_the_parents():
    with pytest.raises(ValueError):
        PolicyTree().add(np.array([-1, -1, -1]), np.array([0, 1]))
