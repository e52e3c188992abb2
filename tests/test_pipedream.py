"""PipeDream graph.txt loader: totals against an independent parse, cuts, errors, CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.front.cli import main
from workbench.model.graph import linearisation_summary
from workbench.paths import peer_profiles_dir
from workbench.profiles import load_profile
from workbench.profiles.pipedream import (
    PipeDreamFormatError,
    load_pipedream_chain,
    parse_pipedream_text,
    read_pipedream_graph,
)

NETS = ["alexnet", "vgg16", "gnmt", "resnet18", "resnet50", "inception_v3", "resnet101", "densenet121",
        "nasnetamobile"]
PEER = peer_profiles_dir()
needs_peer = pytest.mark.skipif(PEER is None, reason="PipeDream profiles (data/profiles/pipedream) not found")


def raw_sums(path: Path) -> dict[str, float]:
    """Independent tiny parse: sums of the four fields, Input nodes' times dropped."""
    f = b = p = 0.0
    n = e = 0
    for line in path.read_text().splitlines():
        if line.startswith("\t"):
            e += 1
            continue
        n += 1
        desc = line.split(" -- ")[1]
        vals = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[0-9.]+)", line))
        if not desc.startswith("Input"):
            f += float(vals["forward_compute_time"])
            b += float(vals["backward_compute_time"])
        p += float(vals["parameter_size"])
    return {"f": f, "b": b, "p": p, "nodes": n, "edges": e}


@needs_peer
@pytest.mark.parametrize("net", NETS)
def test_peer_profile_totals(net):
    path = PEER / net / "graph.txt"
    chain = load_pipedream_chain(path)
    raw = raw_sums(path)
    assert len(chain) == raw["nodes"]
    assert len(chain.graph.edges) == raw["edges"]
    assert chain.forward.sum() * 1e3 == pytest.approx(raw["f"], rel=1e-9, abs=1e-9)
    assert chain.backward.sum() * 1e3 == pytest.approx(raw["b"], rel=1e-9, abs=1e-9)
    assert chain.weights.sum() == pytest.approx(raw["p"], rel=1e-12)
    assert chain.meta["network"] == net and "7db6a1c" in chain.meta["source"]
    assert chain.graph is not None and "linearisation" in chain.meta
    # chain order is topological
    pos = {l.name: i for i, l in enumerate(chain.layers)}
    assert all(pos[a] < pos[b] for a, b in chain.graph.edges)


@needs_peer
def test_zero_input_flag_and_batch_sizes():
    path = PEER / "alexnet" / "graph.txt"
    zeroed = read_pipedream_graph(path)
    kept = read_pipedream_graph(path, zero_input=False)
    assert float(zeroed.meta["input_time_zeroed_ms"]) == pytest.approx(635.902)
    assert kept.total_compute - zeroed.total_compute == pytest.approx(0.635902)
    assert zeroed.meta["batch_size"] == "256"
    assert read_pipedream_graph(PEER / "resnet18").meta["batch_size"].startswith("256")
    assert read_pipedream_graph(PEER / "gnmt").meta["batch_size"] == "64"


@needs_peer
def test_vgg16_cuts_are_outputs():
    chain = load_profile("pipedream/vgg16")
    g = chain.graph
    # a chain, except that the flatten reads the batch size from a Size node:
    # node32 (MaxPool) feeds node33 (Size(0)) and node34 (View(-1)).
    assert len(g.edges) == len(g)
    assert set(g.successors["node32"]) == {"node33", "node34"}
    for i in range(len(chain) - 1):
        v = chain.layers[i].name
        expect = g.node[v].output_bytes + (g.node["node32"].output_bytes if v == "node33" else 0.0)
        assert chain.cut(i) == expect


@needs_peer
def test_gnmt_multi_output_summed():
    g = read_pipedream_graph(PEER / "gnmt")
    assert g.node["node7"].output_bytes == 6291456.0 + 131072.0 + 131072.0
    assert sum(1 for n in g.nodes if n.is_input) == 3


@needs_peer
def test_resnet_cut_inside_residual_block_counts_both_edges():
    chain = load_profile("pipedream/resnet18")
    g = chain.graph
    order = [l.name for l in chain.layers]
    pos = {v: i for i, v in enumerate(order)}
    # find a producer with two consumers (block input feeding the main path and the skip)
    checked = 0
    for v in order:
        succ = g.successors[v]
        if len(succ) < 2:
            continue
        first, last = sorted(pos[w] for w in succ)[0], sorted(pos[w] for w in succ)[-1]
        if last - first < 2:
            continue
        i = first  # cut after the first node of the main path: v's output still needed later
        u = order[i]
        live = {x for x in order[: i + 1] if any(pos[w] > i for w in g.successors[x])}
        assert v in live and u in live and len(live) >= 2
        assert chain.cut(i) == pytest.approx(sum(g.node[x].output_bytes for x in live))
        assert chain.cut(i) >= g.node[v].output_bytes + g.node[u].output_bytes
        checked += 1
    assert checked >= 4


def toy() -> str:
    return "\n".join([
        "node1 -- Input -- forward_compute_time=7.0, backward_compute_time=0.0, "
        "activation_size=10.0, parameter_size=0.0",
        "node2 -- Conv -- forward_compute_time=1.0, backward_compute_time=2.0, "
        "activation_size=4.0, parameter_size=16.0",
        "node3 -- ReLU -- forward_compute_time=0.5, backward_compute_time=0.5, "
        "activation_size=5.0, parameter_size=0.0",
        "node4 -- Conv -- forward_compute_time=1.5, backward_compute_time=0.5, "
        "activation_size=6.0, parameter_size=8.0",
        "node5 -- Add -- forward_compute_time=0.0, backward_compute_time=0.0, "
        "activation_size=7.0, parameter_size=0.0",
        "\tnode1 -- node2", "\tnode2 -- node3", "\tnode2 -- node4", "\tnode3 -- node5", "\tnode4 -- node5",
    ])


def test_toy_linearisation_by_hand():
    g = parse_pipedream_text(toy(), name="toy")
    assert g.topological_order() == ["node1", "node2", "node3", "node4", "node5"]
    c = g.linearise()
    assert c.cut_bytes == (10.0, 4.0, 4.0 + 5.0, 5.0 + 6.0)
    assert [c.saved(i) for i in range(5)] == [10.0, 10.0, 4.0, 4.0, 11.0]
    assert c[0].forward == 0.0 and c.input_bytes == 10.0
    assert c.total_compute == pytest.approx(0.006)
    # another valid order recomputes the cuts
    c2 = g.linearise(["node1", "node2", "node4", "node3", "node5"])
    assert c2.cut_bytes == (10.0, 4.0, 4.0 + 6.0, 5.0 + 6.0)
    assert "order given by the caller" in c2.meta["linearisation"]
    s = linearisation_summary(g, c)
    assert "5 nodes, 5 edges" in s and "2 of 4 cuts" in s


def test_bad_orders_rejected():
    g = parse_pipedream_text(toy(), name="toy")
    with pytest.raises(ValueError, match="not topological"):
        g.linearise(["node1", "node3", "node2", "node4", "node5"])
    with pytest.raises(ValueError, match="missing"):
        g.linearise(["node1", "node2"])
    with pytest.raises(ValueError, match="twice"):
        g.linearise(["node1", "node2", "node2", "node4", "node5"])
    with pytest.raises(ValueError, match="not a node"):
        g.linearise(["node1", "node2", "node3", "node4", "nodeX"])


@pytest.mark.parametrize("bad, line, what", [
    ("node9 -- Conv -- forward_compute_time=abc, backward_compute_time=1, activation_size=1, parameter_size=0",
     6, "not a number"),
    ("node9 -- Conv -- forward_compute_time=1, backward_compute_time=-1, activation_size=1, parameter_size=0",
     6, ">= 0"),
    ("node9 -- Conv -- forward_compute_time=1, activation_size=1, parameter_size=0", 6, "lacks"),
    ("node9 Conv", 6, "not a node line"),
    ("\tnode1 node2", 6, "not an edge line"),
    ("\tnode1 -- node77", 6, "unknown node"),
])
def test_bad_lines_name_file_and_line(tmp_path, bad, line, what):
    lines = toy().split("\n")
    lines.insert(5, bad)
    p = tmp_path / "net" / "graph.txt"
    p.parent.mkdir()
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(PipeDreamFormatError, match=what) as e:
        read_pipedream_graph(p)
    assert f"{p}:{line}" in str(e.value)


def test_cycle_and_duplicates_rejected(tmp_path):
    with pytest.raises(ValueError, match="cycle"):
        parse_pipedream_text(toy() + "\n\tnode5 -- node2")
    with pytest.raises(PipeDreamFormatError, match="defined twice"):
        parse_pipedream_text(toy().split("\n", 1)[0] + "\n" + toy())


def test_large_graph_no_recursion_limit():
    n = 5000
    lines = [f"node{i} -- L -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0"
             for i in range(1, n + 1)]
    lines += [f"\tnode{i} -- node{i + 1}" for i in range(1, n)]
    g = parse_pipedream_text("\n".join(lines), name="long")
    c = g.linearise()
    assert len(c) == n and c.cut_bytes[-1] == 1.0


def test_profile_info_cli(capsys):
    assert main(["profile-info", "pipedream/resnet50"]) == 0
    out = capsys.readouterr().out
    assert "layers: 177" in out and "193 edges" in out and "zeroed: 18.962 ms" in out
    raw = raw_sums(PEER / "resnet50" / "graph.txt")
    assert f"forward: {raw['f']:.3f} ms" in out
    assert main(["profile-info", str(PEER / "alexnet"), "--no-zero-input"]) == 0
    out = capsys.readouterr().out
    assert "forward: 680.703 ms" in out and "kept" in out


def test_profile_info_cli_csv_and_missing(tmp_path, capsys):
    p = tmp_path / "c.csv"
    p.write_text("name,forward_ms,backward_ms,weight_bytes,activation_bytes\na,1,2,100,40\nb,3,4,0,8\n")
    assert main(["profile-info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "layers: 2" in out and "forward: 4.000 ms" in out and "linearisation" not in out
    assert main(["profile-info", str(tmp_path / "nope.txt")]) != 0


TINY = Path(__file__).parent / "fixtures" / "pipedream" / "tiny"


def test_a_graph_whose_batch_size_is_unknown_loads_and_plans(tmp_path, capsys):
    # PipeDream's graphs record no batch size (squeezenet1_0, gnmt_large): main said "metadata, column
    # 'batch_size': not a number: 'unknown'" and refused them
    raw = raw_sums(TINY / "graph.txt")
    assert main(["profile-info", str(TINY)]) == 0
    out = capsys.readouterr().out
    assert "batch size: unknown (PipeDream's graph.txt does not record it" in out
    assert f"forward: {raw['f']:.3f} ms" in out and f"backward: {raw['b']:.3f} ms" in out
    assert main(["plan", "--profile", str(TINY / "graph.txt"), "--devices", "2", "--json", str(tmp_path / "p.json"),
                 "--quiet"]) == 0
    # written as a CSV, it still says so and loads again
    from workbench.profiles.csvio import batch_size_of, read_profile, write_profile

    chain = load_profile(TINY)
    write_profile(chain, tmp_path / "tiny.csv")
    again = read_profile(tmp_path / "tiny.csv")
    assert again.meta["batch_size"].startswith("unknown") and batch_size_of(again.meta) is None
    assert batch_size_of({"batch_size": "64 (per PipeDream's README)"}) == 64


@pytest.mark.parametrize("value", ["0", "2.5", "lots", "-3"])
def test_a_batch_size_other_than_a_whole_number_or_unknown_is_refused(tmp_path, capsys, value):
    p = tmp_path / "b.csv"
    p.write_text(f"# batch_size: {value}\nname,forward_ms,backward_ms,weight_bytes,activation_bytes\na,1,2,100,40\n")
    assert main(["profile-info", str(p)]) == 2
    assert "batch_size" in capsys.readouterr().err
