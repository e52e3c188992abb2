"""PipeDream ``graph.txt`` profiles: the DAG, and a chain linearised from it.

PipeDream (msr-fiddle/pipedream, commit 7db6a1c) publishes per-layer
profiles as a graph: node lines

    nodeN -- <description> -- forward_compute_time=<ms>, backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>

and tab-started edge lines ``\\tnodeA -- nodeB`` (A's output feeds B). See
``data/profiles/pipedream/README.md``. :func:`read_pipedream_graph` keeps the
DAG (:class:`workbench.model.graph.Graph`, re-exported here); :meth:`Graph.linearise` turns it into a
:class:`~workbench.model.chain.Chain` whose cut after position i counts *every*
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
"""  # noqa: E501 (graph.txt lines cannot be wrapped)

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Mapping, Sequence

from workbench.model.chain import Chain
from workbench.model.graph import Graph, Node, linearisation_summary, priority_topological_order

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
    return "unknown (PipeDream's graph.txt does not record it, nor a classifier to infer it from)"


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
