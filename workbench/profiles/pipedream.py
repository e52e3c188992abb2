"""PipeDream ``graph.txt`` profiles: the DAG, and a chain linearised from it.

PipeDream (msr-fiddle/pipedream, commit 7db6a1c) publishes per-layer
profiles as a graph: node lines

    nodeN -- <description> -- forward_compute_time=<ms>, backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>

and tab-started edge lines ``\\tnodeA -- nodeB`` (A's output feeds B). See
``data/profiles/pipedream/README.md``. :func:`read_pipedream_graph` keeps the
DAG (:class:`Graph`); :meth:`Graph.linearise` turns it into a
:class:`~workbench.chain.Chain` whose cut after position i counts *every*
edge that crosses it (each producer once), so a skip connection costs what it
really costs when a stage boundary falls inside its block.

>>> g = parse_pipedream_text('''node1 -- Input -- forward_compute_time=5.0, backward_compute_time=0.0, activation_size=8.0, parameter_size=0.0
... node2 -- Conv -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=4.0, parameter_size=16.0
... node3 -- ReLU -- forward_compute_time=0.5, backward_compute_time=0.5, activation_size=4.0, parameter_size=0.0
... node4 -- Add -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=4.0, parameter_size=0.0
... \\tnode1 -- node2
... \\tnode2 -- node3
... \\tnode2 -- node4
... \\tnode3 -- node4''', name="toy")
>>> g.topological_order()
['node1', 'node2', 'node3', 'node4']
>>> chain = g.linearise()
>>> chain.cut_bytes   # after node3 both node2's and node3's outputs cross
(8.0, 4.0, 8.0)
>>> chain[0].forward   # the Input node's data-loading time is zeroed
0.0
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Mapping, Sequence

from ..chain import Chain, Layer

__all__ = [
    "priority_topological_order",
    "Node", "Graph", "PipeDreamFormatError", "read_pipedream_graph", "parse_pipedream_text",
    "load_pipedream_chain", "linearisation_summary", "SOURCE", "BATCH_SIZES",
]

SOURCE = "PipeDream profile, msr-fiddle/pipedream 7db6a1c"

#: Mini-batch sizes of the published profiles (README of the peer profiles;
#: image networks inferred from the classifier output, gnmt per PipeDream's README).
BATCH_SIZES: dict[str, int] = {
    "resnet50": 128, "resnet101": 64, "inception_v3": 128, "densenet121": 64,
    "vgg16": 128, "alexnet": 256, "gnmt": 64,
}


class PipeDreamFormatError(ValueError):
    """A ``graph.txt`` line that cannot be read; the message names file and line."""



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
        return chain.with_meta(linearisation=linearisation_summary(self, chain, default=order == self.topological_order()))


# ----- reading ------------------------------------------------------------
_NODE_RE = re.compile(r"^(\S+) -- (.*) -- (forward_compute_time=.*)$")
_EDGE_RE = re.compile(r"^\t\s*(\S+)\s+--\s+(\S+)\s*$")
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def _number(text: str, where: str, what: str) -> float:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        parts = [p for p in re.split(r"[;,]", text[1:-1]) if p.strip()]
        if not parts:
            raise PipeDreamFormatError(f"{where}: {what} is an empty list")
        return sum(_number(p, where, what) for p in parts)
    try:
        v = float(text)
    except ValueError:
        raise PipeDreamFormatError(f"{where}: {what} is not a number: {text!r}") from None
    if math.isnan(v) or math.isinf(v) or v < 0:
        raise PipeDreamFormatError(f"{where}: {what} must be finite and >= 0, got {text!r}")
    return v


def _parse_node(line: str, where: str) -> Node:
    m = _NODE_RE.match(line)
    if not m:
        raise PipeDreamFormatError(
            f"{where}: not a node line ('nodeN -- description -- forward_compute_time=..., ...'): {line[:80]!r}")
    node_id, desc, rest = m.group(1), m.group(2).strip(), m.group(3)
    values: dict[str, str] = {}
    # split on ", key=" so that lists "[a; b]" (and any commas inside them) stay whole
    for part in re.split(r",\s*(?=[a-z_]+=)", rest):
        if "=" not in part:
            raise PipeDreamFormatError(f"{where}: cannot read field {part!r}")
        k, v = part.split("=", 1)
        values[k.strip()] = v
    missing = [f for f in _FIELDS if f not in values]
    if missing:
        raise PipeDreamFormatError(f"{where}: node {node_id} lacks {', '.join(missing)}")
    f, b, a, w = (_number(values[k], where, k) for k in _FIELDS)
    return Node(node_id, desc, f / 1e3, b / 1e3, a, w, desc.startswith("Input"))


def _infer_batch_size(name: str, nodes: Sequence[Node], succ: Mapping[str, Sequence[str]]) -> str:
    if name in BATCH_SIZES:
        return str(BATCH_SIZES[name])
    for n in nodes:  # an fp32 classifier at a sink: output = batch * classes * 4
        m = re.search(r"out_features=(\d+)", n.description)
        if m and not succ.get(n.id) and n.description.startswith("Linear"):
            classes = int(m.group(1))
            q = n.output_bytes / (4 * classes)
            if q >= 1 and abs(q - round(q)) < 1e-9:
                return f"{int(round(q))} (inferred from the classifier output, fp32)"
    return "unknown"


def parse_pipedream_text(text: str, *, name: str = "graph", zero_input: bool = True,
                         filename: str = "<text>") -> Graph:
    """Parse the text of a ``graph.txt``; errors name ``filename`` and the line number."""
    nodes: list[Node] = []
    edges: list[tuple[str, str]] = []
    edge_lines: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        where = f"{filename}:{lineno}"
        if line.startswith("\t") or line.startswith("    "):
            m = _EDGE_RE.match("\t" + line.lstrip())
            if not m:
                raise PipeDreamFormatError(f"{where}: not an edge line ('\\tnodeA -- nodeB'): {line.strip()[:80]!r}")
            edges.append((m.group(1), m.group(2)))
            edge_lines.append(lineno)
        else:
            nodes.append(_parse_node(line, where))
    if not nodes:
        raise PipeDreamFormatError(f"{filename}: no node lines")
    seen: dict[str, int] = {}
    for n in nodes:
        if n.id in seen:
            raise PipeDreamFormatError(f"{filename}: node {n.id} defined twice")
        seen[n.id] = 1
    for (a, b), lineno in zip(edges, edge_lines):
        for v in (a, b):
            if v not in seen:
                raise PipeDreamFormatError(f"{filename}:{lineno}: edge names unknown node {v}")
    zeroed = 0.0
    if zero_input:
        fixed = []
        for n in nodes:
            if n.is_input and (n.forward or n.backward):
                zeroed += n.compute
                n = Node(n.id, n.description, 0.0, 0.0, n.output_bytes, n.weight_bytes, True)
            fixed.append(n)
        nodes = fixed
    succ: dict[str, list[str]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    meta = {
        "network": name,
        "source": SOURCE,
        "batch_size": _infer_batch_size(name, nodes, succ),
        "file": filename,
        "input_nodes": ",".join(n.id for n in nodes if n.is_input),
        "zero_input": str(bool(zero_input)),
        "input_time_zeroed_ms": f"{zeroed * 1e3:.3f}",
    }
    g = Graph(tuple(nodes), tuple(edges), name, meta)
    g.topological_order()  # raises on a cycle
    return g


def read_pipedream_graph(path: str | Path, *, zero_input: bool = True) -> Graph:
    """Read a PipeDream ``graph.txt`` (or a folder holding one).

    The network name is the folder's name. With ``zero_input`` (the default,
    as PipeDream's planner does) the Input nodes' data-loading time is set to
    0; ``meta["input_time_zeroed_ms"]`` says how much was removed.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "graph.txt"
    try:
        text = p.read_text()
    except OSError as e:
        raise PipeDreamFormatError(f"{p}: cannot read ({e.strerror or e})") from e
    return parse_pipedream_text(text, name=p.parent.name or "graph", zero_input=zero_input, filename=str(p))


def load_pipedream_chain(path: str | Path, zero_input: bool = True) -> Chain:
    """Read a ``graph.txt`` and linearise it in the default topological order."""
    return read_pipedream_graph(path, zero_input=zero_input).linearise()


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
    lines = [f"{graph.name}: {len(graph)} nodes, {len(graph.edges)} edges -> chain of {len(chain)} layers (one per node)",
             f"  {rule}"]
    if live:
        big = max(range(len(live)), key=lambda i: chain.cut(i))
        lines.append(f"  {multi} of {len(live)} cuts carry more than one producer's output (skip connections, branches); "
                     f"at most {max(live)} producers cross one cut")
        lines.append(f"  largest cut: {chain.cut(big) / 2**20:.1f} MiB after position {big} ({order[big]})")
    zeroed = graph.meta.get("input_time_zeroed_ms")
    if graph.meta.get("zero_input") == "False":
        lines.append("  input nodes' data-loading time kept (zero_input=False)")
    elif zeroed is not None:
        lines.append(f"  input nodes' data-loading time zeroed: {zeroed} ms (as PipeDream's planner does)")
    return "\n".join(lines)
