"""graph_dp.best_order: brute force on small DAGs, PipeDream's published optima, compression bounds."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from workbench.model.target import Target
from workbench.paths import peer_profiles_dir
from workbench.planners.dp.graph import best_order, chain_bottleneck, stage_values
from workbench.profiles.pipedream import Graph, Node, read_pipedream_graph

PEER = peer_profiles_dir()
needs_peer = pytest.mark.skipif(PEER is None, reason="peer profiles (../shared/peer-profiles/pipedream) not found")


def random_dag(rng: random.Random, n: int, p_edge: float, zero_frac: float = 0.2) -> Graph:
    nodes = []
    for i in range(n):
        w = 0 if rng.random() < zero_frac else rng.randint(1, 9)
        f = rng.randint(0, w)
        nodes.append(Node(f"v{i}", "", float(f), float(w - f), float(rng.randint(1, 5)), 0.0))
    edges = [(f"v{i}", f"v{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < p_edge]
    return Graph(tuple(nodes), tuple(edges), "rand")


def topo_orders(g: Graph):
    ids = [n.id for n in g.nodes]
    for perm in itertools.permutations(ids):
        pos = {v: i for i, v in enumerate(perm)}
        if all(pos[a] < pos[b] for a, b in g.edges):
            yield perm


def brute(g: Graph, P: int, platform: Target | None = None) -> float:
    """Min over all topological orders and all splits into <= P contiguous parts (independent of graph_dp)."""
    best = math.inf
    n = len(g)
    for perm in topo_orders(g):
        comp = [g.node[v].compute for v in perm]
        cuts = []
        for i in range(n - 1):
            done = set(perm[: i + 1])
            cuts.append(sum(g.node[v].output_bytes for v in done if any(s not in done for s in g.successors[v])))
        for k in range(0, min(P, n) ):
            for ends in itertools.combinations(range(n - 1), k):
                bounds = [-1, *ends, n - 1]
                cost = max(sum(comp[a + 1:b + 1]) for a, b in zip(bounds, bounds[1:]))
                if platform is not None and ends:
                    cost = max(cost, max(platform.comm_time(cuts[e]) for e in ends))
                best = min(best, cost)
    return best


def check_result(g: Graph, r, P: int, platform=None):
    g.check_order(r.order)  # topological, all nodes
    assert [v for st in r.stages for v in st] == r.order
    assert 1 <= len(r.stages) <= P
    assert max(stage_values(g, r.stages, platform)) == pytest.approx(r.value)
    assert r.value <= r.default_value + 1e-9
    assert r.value >= r.lower_bound - 1e-9


@pytest.mark.parametrize("seed", range(60))
def test_random_dags_match_brute_force(seed):
    rng = random.Random(seed)
    g = random_dag(rng, rng.randint(2, 7), rng.choice([0.2, 0.35, 0.5]))
    for P in (1, 2, 3):
        r = best_order(g, P)
        check_result(g, r, P)
        assert r.exact
        assert r.value == pytest.approx(brute(g, P)), (seed, P)


@pytest.mark.parametrize("seed", range(25))
def test_random_dags_with_communication(seed):
    rng = random.Random(1000 + seed)
    g = random_dag(rng, rng.randint(2, 6), 0.35)
    plat = Target.of(3, bandwidth=rng.choice([1.0, 2.0, 0.5]), memory_model="paper")
    for P in (2, 3):
        r = best_order(g, P, platform=plat)
        check_result(g, r, P, plat)
        if r.exact:
            assert r.value == pytest.approx(brute(g, P, plat)), (seed, P)
        else:
            assert r.value >= brute(g, P, plat) - 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_forced_compression_stays_within_bound(seed):
    rng = random.Random(500 + seed)
    # wide graphs: a source, 3 parallel paths, a sink -> many down-sets
    n_paths, length = 3, rng.randint(2, 3)
    nodes = [Node("s", "", 1.0, 0.0, 1.0, 0.0)]
    edges = []
    for p in range(n_paths):
        prev = "s"
        for i in range(length):
            v = f"p{p}_{i}"
            nodes.append(Node(v, "", float(rng.randint(1, 9)), 0.0, 1.0, 0.0))
            edges.append((prev, v))
            prev = v
        edges.append((prev, "t"))
    nodes.append(Node("t", "", 1.0, 0.0, 1.0, 0.0))
    g = Graph(tuple(nodes), tuple(edges), "wide")
    P = rng.choice([2, 3, 4])
    exact = best_order(g, P)
    small = best_order(g, P, block_states=16)
    assert exact.exact
    check_result(g, small, P)
    assert small.states < exact.states
    assert exact.value - 1e-9 <= small.value <= exact.value + small.bound + 1e-9
    if n_paths * length <= 7:
        assert exact.value == pytest.approx(brute(g, P))


def test_chain_bottleneck_against_enumeration():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 8)
        w = [float(rng.randint(0, 9)) for _ in range(n)]
        P = rng.randint(1, 4)
        best = min(
            max(sum(w[a + 1:b + 1]) for a, b in zip([-1, *ends], [*ends, n - 1]))
            for k in range(min(P, n)) for ends in itertools.combinations(range(n - 1), k)
        )
        v, ends = chain_bottleneck(w, P)
        assert v == best
        assert ends[-1] == n - 1 and len(ends) <= P
        bounds = [-1, *ends]
        assert max(sum(w[a + 1:b + 1]) for a, b in zip(bounds, bounds[1:])) == v


# PipeDream's optimum (straight pipeline, no communication, input nodes zeroed), ms
PIPEDREAM = {
    "vgg16": (370.9, 216.4, 159.5),
    "resnet50": (221.9, 111.5, 56.7),
    "resnet101": (206.1, 103.9, 52.1),
    "densenet121": (163.1, 82.0, 41.6),
    "gnmt": (45.9, 25.9, 19.0),
}


@needs_peer
@pytest.mark.parametrize("net", sorted(PIPEDREAM))
def test_reproduces_pipedream(net):
    g = read_pipedream_graph(PEER / net)
    for P, expect in zip((2, 4, 8), PIPEDREAM[net]):
        r = best_order(g, P)
        assert r.exact, r.compression
        check_result(g, r, P)
        assert abs(r.value * 1e3 - expect) <= 0.05 + 1e-9, (net, P, r.value * 1e3)
        # the optimal stages, re-linearised, are contiguous in the chain
        chain = g.linearise(r.order)
        ends = [sum(len(s) for s in r.stages[: k + 1]) - 1 for k in range(len(r.stages))]
        firsts = [0] + [e + 1 for e in ends[:-1]]
        assert max(chain.stage_costs(a, b).compute for a, b in zip(firsts, ends)) == pytest.approx(r.value)


@needs_peer
def test_resnet_order_matters():
    g = read_pipedream_graph(PEER / "resnet18")
    r = best_order(g, 8)
    assert r.value * 1e3 == pytest.approx(35.2, abs=0.05)
    assert r.default_value > r.value * 1.04  # one fixed order loses here


@needs_peer
@pytest.mark.parametrize("net", ["inception_v3", "nasnetamobile"])
def test_large_graphs_finish(net):
    g = read_pipedream_graph(PEER / net)
    r = best_order(g, 4)
    check_result(g, r, 4)
    assert r.states <= 200_000
    assert r.bound >= 0.0 and r.compression
