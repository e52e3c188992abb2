"""The DAG type (workbench.model.graph): structure, checks, topological orders and the cuts of a linearisation."""

from __future__ import annotations

import itertools
import random

import pytest

from workbench.model.chain import Chain
from workbench.model.graph import Graph, Node


def node(i: str, out: float = 1.0) -> Node:
    return Node(i, i.upper(), 0.1, 0.2, out, 0.0)


def test_graph_dataclass_maps():
    g = Graph((node("a"), node("b"), node("c")), (("a", "b"), ("a", "c"), ("b", "c")), "g")
    assert g.successors["a"] == ("b", "c") and g.predecessors["c"] == ("a", "b")
    assert g.node["b"].description == "B" and g.index["c"] == 2 and len(g) == 3


@pytest.mark.parametrize("nodes, edges, what", [
    (("a", "a"), (), "duplicate node ids"),
    (("a", "b"), (("a", "x"),), "unknown node"),
    (("a", "b"), (("a", "a"),), "self-loop"),
])
def test_bad_graphs_are_refused(nodes, edges, what):
    with pytest.raises(ValueError, match=what):
        Graph(tuple(node(n) for n in nodes), edges, "bad")


def test_a_cycle_is_named():
    g = Graph((node("n1"), node("n2"), node("n3")), (("n1", "n2"), ("n2", "n3"), ("n3", "n2")), "loop")
    with pytest.raises(ValueError, match="has a cycle"):
        g.topological_order()


def test_cuts_of_every_order_count_each_live_producer_once():
    """On random DAGs, every topological order (checked by brute force over permutations) gives the cut bytes of
    the producers still needed after each position, and the chain carries the graph."""
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randint(2, 6)
        ids = [f"n{i}" for i in range(n)]
        edges = tuple((ids[i], ids[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4)
        g = Graph(tuple(node(v, float(rng.randint(1, 9))) for v in ids), edges, "r")
        for order in itertools.permutations(ids):
            pos = {v: k for k, v in enumerate(order)}
            if any(pos[a] > pos[b] for a, b in edges):
                with pytest.raises(ValueError, match="not topological"):
                    g.check_order(order)
                continue
            want = [sum(g.node[v].output_bytes for v in order[:k + 1] if any(pos[w] > k for w in g.successors[v]))
                    for k in range(n - 1)]
            chain = g.linearise(order)
            assert list(chain.cut_bytes) == want and isinstance(chain, Chain) and chain.graph is g
