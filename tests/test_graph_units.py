"""Tests for workbench.planners.dp.graph_units: units of a DAG, forced cuts, down-set families, checked against
brute force over every subset of small random DAGs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workbench.planners.dp.graph_units import Units, block_family, forced_splits, words, zero_merges


def random_dag(seed: int, n: int, p: float = 0.3, zero: float = 0.0):
    """Nodes 0..n-1 in a topological order (edges i -> j, i < j) with random weights, some zero."""
    rng = np.random.default_rng(seed)
    edges = {(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p}
    weight = {i: 0.0 if rng.random() < zero else float(rng.integers(1, 10)) for i in range(n)}
    return n, edges, weight


def units_of(n, edges, weight) -> Units:
    return Units({i: [i] for i in range(n)}, dict(weight), {i: {a for a, b in edges if b == i} for i in range(n)},
                 {i: {b for a, b in edges if a == i} for i in range(n)})


def closure(n, edges) -> list[set[int]]:
    """Ancestors of each node (brute force: Floyd-Warshall style)."""
    anc = [{a for a, b in edges if b == i} for i in range(n)]
    for k in range(n):
        for i in range(n):
            if k in anc[i]:
                anc[i] |= anc[k]
    return anc


def down_sets(n, edges) -> set[int]:
    """Every subset of the nodes closed under predecessors, as a bit mask (brute force over 2^n)."""
    out = set()
    for mask in range(1 << n):
        if all(not (mask >> b) & 1 or (mask >> a) & 1 for a, b in edges):
            out.add(mask)
    return out


def test_merge_contracts_an_edge():
    U = units_of(4, {(0, 1), (1, 2), (0, 3), (3, 2)}, {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0})
    U.lossy.add(1)
    U.merge(0, 1)
    assert U.members == {0: [0, 1], 2: [2], 3: [3]} and U.weight[0] == 3.0
    assert U.pred == {0: set(), 2: {0, 3}, 3: {0}} and U.succ == {0: {2, 3}, 2: set(), 3: {2}}
    assert U.lossy == {0}
    assert U.topo() == [0, 3, 2]


def test_copy_and_restrict_are_independent():
    U = units_of(3, {(0, 1), (1, 2)}, {0: 1.0, 1: 1.0, 2: 1.0})
    V = U.copy()
    V.merge(0, 1)
    assert sorted(U.members) == [0, 1, 2]
    R = U.restrict([1, 2])
    assert R.pred == {1: set(), 2: {1}} and R.succ == {1: {2}, 2: set()}


@pytest.mark.parametrize("seed", range(20))
def test_zero_merges_keep_the_weight_and_a_dag(seed):
    n, edges, weight = random_dag(seed, 9, zero=0.4)
    U = units_of(n, edges, weight)
    merged = zero_merges(U)
    assert len(U.members) == n - merged
    assert sorted(m for ms in U.members.values() for m in ms) == list(range(n))
    assert sum(U.weight.values()) == pytest.approx(sum(weight.values()))
    assert len(U.topo()) == len(U.members)                       # still acyclic
    # no zero unit is left with a single neighbour on either side
    assert not [u for u, w in U.weight.items() if w == 0 and (len(U.pred[u]) == 1 or len(U.succ[u]) == 1)]
    # every edge of the unit graph is an edge between some members
    owner = {m: u for u, ms in U.members.items() for m in ms}
    for u, ss in U.succ.items():
        for s in ss:
            assert any(owner[a] == u and owner[b] == s for a, b in edges)


def test_forced_splits_on_a_chain_and_a_diamond():
    assert forced_splits(units_of(3, {(0, 1), (1, 2)}, {i: 1.0 for i in range(3)})) == [[0], [1], [2]]
    diamond = units_of(4, {(0, 1), (0, 2), (1, 3), (2, 3)}, {i: 1.0 for i in range(4)})
    assert forced_splits(diamond) == [[0], [1, 2], [3]]
    assert forced_splits(units_of(2, set(), {0: 1.0, 1: 1.0})) == [[0, 1]]     # two sources: no cut


@pytest.mark.parametrize("seed", range(30))
def test_forced_splits_are_exactly_the_prefixes_every_later_node_descends_from(seed):
    n, edges, weight = random_dag(seed, 10, p=0.35)
    blocks = forced_splits(units_of(n, edges, weight))
    order = [u for b in blocks for u in b]
    assert sorted(order) == list(range(n))
    anc = closure(n, edges)
    cuts = set(itertools.accumulate(len(b) for b in blocks[:-1]))
    for i in range(1, n):
        forced = all(u in anc[v] for u in order[:i] for v in order[i:])
        assert forced == (i in cuts), (i, blocks)


@pytest.mark.parametrize("seed", range(20))
def test_exact_family_is_every_down_set(seed):
    n, edges, weight = random_dag(seed, 9, p=0.25)
    fam = block_family(units_of(n, edges, weight), cap=10_000)
    assert len(fam) == 1
    nodes, masks, bound, _theta, kind = fam[0]
    assert (nodes, kind, bound) == (list(range(n)), "exact", 0.0)
    assert set(masks) == down_sets(n, edges) and len(masks) == len(set(masks))
    assert [bin(m).count("1") for m in masks] == sorted(bin(m).count("1") for m in masks)


@pytest.mark.parametrize("seed", range(12))
def test_a_small_cap_keeps_only_down_sets_and_covers_every_node_once(seed):
    n, edges, weight = random_dag(seed, 12, p=0.12)       # wide: many down-sets
    total = len(down_sets(n, edges))
    fam = block_family(units_of(n, edges, weight), cap=16)
    seen = []
    for nodes, masks, bound, _theta, kind in fam:
        seen += nodes
        assert kind in ("exact", "series", "relaxed", "fixed")
        assert 0 in masks and (1 << len(nodes)) - 1 in masks
        sub = {(nodes.index(a), nodes.index(b)) for a, b in edges if a in nodes and b in nodes}
        assert set(masks) <= down_sets(len(nodes), sub)
        assert bound == 0.0 if kind == "exact" else bound >= 0.0
        if kind in ("relaxed", "fixed"):
            assert math.isinf(bound)
    assert sorted(seen) == list(range(n))
    if len(fam) == 1 and fam[0][4] == "exact":
        assert len(fam[0][1]) == total


def test_series_contraction_of_a_path_beside_free_nodes():
    # a path 0 -> 1 -> 2 -> 3 (weight 1 each) beside 8 free nodes. Cut in two units (theta 2), the path leaves
    # 3 x 2^8 = 768 down-sets, over the cap of 600; merged whole (theta 4): 2 x 2^8 = 512, which fit. The one
    # lossy unit weighs 4 (width 1): the bound. The family adds the default order's prefixes {0}, {0,1}, {0,1,2}.
    n = 12
    edges = {(0, 1), (1, 2), (2, 3)}
    fam = block_family(units_of(n, edges, {i: 1.0 for i in range(n)}), cap=600)
    assert len(fam) == 1
    nodes, masks, bound, theta, kind = fam[0]
    assert (kind, bound, theta, len(masks)) == ("series", 4.0, 4.0, 512 + 3)
    assert 0b10 not in masks and 0b1111 | (1 << 11) in masks and 0b101 not in masks


def test_words_pack_masks_in_64_bit_words():
    masks = [0, 1, (1 << 64) | 5, (1 << 130) - 1]
    arr = words(masks, 130)
    assert arr.shape == (4, 3) and arr.dtype == np.uint64
    for m, row in zip(masks, arr):
        assert sum(int(w) << (64 * k) for k, w in enumerate(row)) == m
    assert words([3], 0).shape == (1, 1)
