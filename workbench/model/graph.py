"""The DAG type: a profiled network as nodes and edges, its topological order, and the chain linearised from it.

A :class:`Graph` holds one :class:`Node` per profiled module (times in
seconds, sizes in bytes) and edges ``(producer, consumer)``. Graph readers
(:mod:`workbench.profiles.pipedream`) build one; :meth:`Graph.linearise`
turns it into a :class:`~workbench.model.chain.Chain` (``chain.graph`` is the
graph) whose cut after position i counts *every* producer whose output
crosses it, so a skip connection costs what it really costs; graph-aware
planners (:mod:`workbench.planners.dp.graph`) search other topological
orders.

>>> g = Graph((Node("a", "A", 0.1, 0.2, 4, 0), Node("b", "B", 0.1, 0.1, 2, 0), Node("c", "C", 0.1, 0.1, 1, 0)),
...           (("a", "b"), ("a", "c"), ("b", "c")), "abc")
>>> g.topological_order(), g.linearise().cut_bytes   # after b, both a's and b's outputs cross
(['a', 'b', 'c'], (4.0, 6.0))
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Sequence

from workbench.model.chain import Chain, Layer

__all__ = ["Node", "Graph", "priority_topological_order", "linearisation_summary"]


def priority_topological_order(indegree: dict, successors: Mapping, priority) -> list:
    """Kahn's algorithm taking, among the ready nodes, the one of least ``(priority(v), v)``.

    ``indegree`` maps every node to its number of predecessors and is consumed
    (on return, nodes left with a positive count lie on a cycle); the result
    is shorter than the graph exactly when there is a cycle.

    >>> priority_topological_order({"a": 0, "b": 0, "c": 2}, {"a": ["c"], "b": ["c"], "c": []}, lambda v: -ord(v))
    ['b', 'a', 'c']
    """
    heap = [(priority(v), v) for v, d in indegree.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, v = heapq.heappop(heap)
        order.append(v)
        for w in successors[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(heap, (priority(w), w))
    return order


@dataclass(frozen=True)
class Node:
    """One profiled module. Times in seconds, sizes in bytes (whole mini-batch).

    ``output_bytes`` sums all outputs when the file lists several
    (GNMT's LSTMs: ``[6291456.0; 131072.0; 131072.0]``).
    """

    id: str
    description: str
    forward: float
    backward: float
    output_bytes: float
    weight_bytes: float
    is_input: bool = False

    @property
    def compute(self) -> float:
        """forward + backward, seconds."""
        return self.forward + self.backward


@dataclass(frozen=True)
class Graph:
    """A profiled DAG: nodes in file order, edges ``(producer, consumer)``.

    >>> g = Graph((Node("a", "A", 0.1, 0.2, 4, 0), Node("b", "B", 0.1, 0.1, 2, 0)), (("a", "b"),), "ab")
    >>> g.successors["a"], g.predecessors["b"]
    (('b',), ('a',))
    """

    nodes: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]
    name: str = "graph"
    meta: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "edges", tuple((str(a), str(b)) for a, b in self.edges))
        object.__setattr__(self, "meta", dict(self.meta))
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"graph {self.name!r}: duplicate node ids {dup}")
        known = set(ids)
        for a, b in self.edges:
            if a not in known or b not in known:
                raise ValueError(f"graph {self.name!r}: edge {a} -> {b} names an unknown node")
            if a == b:
                raise ValueError(f"graph {self.name!r}: self-loop on {a}")

    # ----- structure -------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def node(self) -> dict[str, Node]:
        """id -> Node."""
        return {n.id: n for n in self.nodes}

    @cached_property
    def index(self) -> dict[str, int]:
        """id -> position in the file."""
        return {n.id: i for i, n in enumerate(self.nodes)}

    @cached_property
    def successors(self) -> dict[str, tuple[str, ...]]:
        """id -> consumers of its output (duplicate edges counted once, file order)."""
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for a, b in self.edges:
            if b not in out[a]:
                out[a].append(b)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def predecessors(self) -> dict[str, tuple[str, ...]]:
        """id -> producers of its inputs (duplicate edges counted once, file order)."""
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for a, b in self.edges:
            if a not in out[b]:
                out[b].append(a)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def total_compute(self) -> float:
        return float(sum(n.compute for n in self.nodes))

    def _priority(self, node_id: str) -> tuple[float, int]:
        m = re.search(r"(\d+)$", node_id)
        return (float(m.group(1)) if m else math.inf, self.index[node_id])

    def topological_order(self) -> list[str]:
        """A deterministic topological order of all nodes.

        Rule: Kahn's algorithm that always takes, among the ready nodes, the one
        with the smallest node number (``node17`` -> 17; ties and unnumbered ids
        by file position). PipeDream's profiler numbers nodes in the order the
        forward pass creates them, so this is the order the network executes:
        a branch (an Inception tower, a residual path) is finished before the
        next starts, and branches that rejoin soon stay close. Raises on a cycle.
        Iterative, so graphs of any size are fine.

        >>> Graph((Node("node2", "", 0, 0, 0, 0), Node("node1", "", 0, 0, 0, 0)), ()).topological_order()
        ['node1', 'node2']
        """
        indeg = {n.id: len(self.predecessors[n.id]) for n in self.nodes}
        order = priority_topological_order(indeg, self.successors, self._priority)
        if len(order) != len(self.nodes):
            stuck = sorted((i for i, d in indeg.items() if d > 0), key=self._priority)[:5]
            raise ValueError(f"graph {self.name!r} has a cycle (through e.g. {', '.join(stuck)})")
        return order

    def check_order(self, order: Sequence[str]) -> list[str]:
        """``order`` as a list, after checking it is a topological order of all nodes."""
        order = [str(o) for o in order]
        pos: dict[str, int] = {}
        for i, v in enumerate(order):
            if v not in self.node:
                raise ValueError(f"order names {v!r}, which is not a node of graph {self.name!r}")
            if v in pos:
                raise ValueError(f"order lists {v!r} twice (positions {pos[v]} and {i})")
            pos[v] = i
        if len(pos) != len(self.nodes):
            missing = [n.id for n in self.nodes if n.id not in pos][:5]
            raise ValueError(f"order has {len(pos)} of {len(self.nodes)} nodes; missing e.g. {missing}")
        for a, b in self.edges:
            if pos[a] > pos[b]:
                raise ValueError(
                    f"order is not topological: {a} (position {pos[a]}) feeds {b} (position {pos[b]})")
        return order

    def cut_bytes_of(self, order: Sequence[str]) -> list[float]:
        """Bytes crossing the cut after each position but the last (each producer counted once)."""
        pos = {v: i for i, v in enumerate(order)}
        # producer v is live across cuts pos[v] .. last_use(v)-1
        diff = [0.0] * (len(order) + 1)
        for v in order:
            succ = self.successors[v]
            if succ:
                last = max(pos[w] for w in succ)
                diff[pos[v]] += self.node[v].output_bytes
                diff[last] -= self.node[v].output_bytes
        cuts, run = [], 0.0
        for i in range(len(order) - 1):
            run += diff[i]
            cuts.append(max(run, 0.0))
        return cuts

    def linearise(self, order: Sequence[str] | None = None) -> Chain:
        """One chain layer per node, in ``order`` (default :meth:`topological_order`).

        Layer fields: forward/backward/weights from the node; ``activation_bytes``
        its output; ``saved_bytes`` the sum of its producers' outputs (what it
        reads), or, for a source node whose input the file does not give, its own
        output size. ``cut_bytes[i]`` sums the outputs of the nodes at positions
        <= i that feed a node after i. ``chain.graph`` is this graph.
        """
        order = self.topological_order() if order is None else self.check_order(order)
        layers = []
        for v in order:
            n = self.node[v]
            preds = self.predecessors[v]
            saved = sum(self.node[p].output_bytes for p in preds) if preds else n.output_bytes
            layers.append(Layer(v, n.forward, n.backward, n.weight_bytes, n.output_bytes, float(saved)))
        input_bytes = float(sum(n.output_bytes for n in self.nodes if n.is_input))
        chain = Chain(tuple(layers), input_bytes, tuple(self.cut_bytes_of(order)), dict(self.meta), self)
        return chain.with_meta(linearisation=linearisation_summary(self, chain,
                                                                   default=order == self.topological_order()))


def linearisation_summary(graph: Graph, chain: Chain, *, default: bool | None = None) -> str:
    """How ``graph`` became ``chain``: counts, the order rule, multi-edge cuts, the largest cut.

    >>> g = Graph((Node("a", "", 0, 0, 4, 0), Node("b", "", 0, 0, 2, 0)), (("a", "b"),), "ab")
    >>> linearisation_summary(g, g.linearise()).splitlines()[0]
    'ab: 2 nodes, 1 edges -> chain of 2 layers (one per node)'
    """
    order = [l.name for l in chain.layers]
    if default is None:
        default = order == graph.topological_order()
    pos = {v: i for i, v in enumerate(order)}
    # number of producers live across each cut
    diff = [0] * (len(order) + 1)
    for v in order:
        succ = graph.successors[v]
        if succ:
            diff[pos[v]] += 1
            diff[max(pos[w] for w in succ)] -= 1
    live, run = [], 0
    for i in range(len(order) - 1):
        run += diff[i]
        live.append(run)
    multi = sum(1 for x in live if x > 1)
    rule = ("default order: Kahn's algorithm, smallest node number first (the forward pass's execution order)"
            if default else "order given by the caller (e.g. a graph planner)")
    lines = [f"{graph.name}: {len(graph)} nodes, {len(graph.edges)} edges -> chain of {len(chain)} layers "
             "(one per node)",
             f"  {rule}"]
    if live:
        big = max(range(len(live)), key=lambda i: chain.cut(i))
        lines.append(f"  {multi} of {len(live)} cuts carry more than one producer's output (skip connections, "
                     f"branches); at most {max(live)} producers cross one cut")
        lines.append(f"  largest cut: {chain.cut(big) / 2**20:.1f} MiB after position {big} ({order[big]})")
    zeroed = graph.meta.get("input_time_zeroed_ms")
    if graph.meta.get("zero_input") == "False":
        lines.append("  input nodes' data-loading time kept (zero_input=False)")
    elif zeroed is not None:
        lines.append(f"  input nodes' data-loading time zeroed: {zeroed} ms (as PipeDream's planner does)")
    return "\n".join(lines)
