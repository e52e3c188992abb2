"""The method registry (workbench.methods) is the one place methods are listed; each consumer reads it, and each
method does what its record says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from workbench import methods as registry
from workbench.methods import LINEUPS, METHODS, VARIANTS, lineup, method, names, variant
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.verify.check import check

ROOT = Path(__file__).resolve().parents[1]
#: every name a method or a sweep variant goes by
NAMES = {m.name for m in METHODS} | {a for m in METHODS for a in m.aliases} | {v.key for v in VARIANTS}


def _is_literal_annotation(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``Literal["gpipe", "1f1b"]``: a type, which Python cannot build from the registry."""
    up = parents.get(node)
    return isinstance(up, ast.Subscript) and getattr(up.value, "id", getattr(up.value, "attr", "")) == "Literal"


def method_tables(path: Path) -> list[str]:
    """Collection literals in ``path`` that name two or more methods (nested ones counted with their outermost)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found, inside = [], set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)) or id(node) in inside:
            continue
        if _is_literal_annotation(node, parents):
            continue
        named = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in NAMES}
        if len(named) >= 2:
            inside |= {id(n) for n in ast.walk(node)}
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(named)}")
    return found


def test_no_module_but_the_registry_lists_methods():
    files = [p for d in ("workbench", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    found = [t for p in files if p != ROOT / "workbench" / "methods.py" for t in method_tables(p)]
    assert not found, "method tables outside workbench/methods.py:\n" + "\n".join(found)
    assert method_tables(ROOT / "workbench" / "methods.py")  # the scan does find the registry's own tables


def test_the_consumers_read_the_registry():
    from workbench import planners
    from workbench.experiments import METHOD_KEYS, METHOD_LABELS, Settings, largest
    from workbench.experiments import figures as results
    from workbench.experiments.complexity import SCALING_METHODS
    from workbench.front import cli, demo
    from workbench.viz import compare, explorer

    assert set(planners.PLANNERS) == {m.name for m in METHODS} and all(map(callable, planners.PLANNERS.values()))
    assert planners.get_planner("dp").__name__ == "plan_dp" and planners.get_planner("ilp").__name__ == "plan_ilp"
    assert planners.GENERAL_METHODS == {m.name for m in METHODS if "general" in m.allocations} == {"ilp", "brute"}
    assert planners.AUTO_METHODS == names(auto_activations=True)
    assert METHOD_KEYS == {v.key: (v.method, v.allocation) for v in VARIANTS}
    assert METHOD_LABELS == {v.key: v.label for v in VARIANTS}
    assert Settings(networks=()).methods == tuple(v.key for v in VARIANTS)
    assert set(results.METHOD_STYLES) == {v.key for v in VARIANTS}
    assert all(results.METHOD_STYLES[v.key][0] == v.colour for v in VARIANTS)
    assert explorer.SLOW_METHODS == set(names(slow=True)) and explorer.COARSE_METHODS == set(names(blocks=True))
    assert set(explorer.available_methods()) == {m.name for m in METHODS}
    assert compare.METHOD_COLORS["madpipe"] == compare.METHOD_COLORS["dp"] == method("dp").colour
    assert demo.DEMO_METHODS == tuple(m for m, _ in lineup("demo"))
    assert SCALING_METHODS == lineup("scaling")
    assert {(m[1], m[2]) for m in largest.METHODS} == set(lineup("largest"))
    helps = {a.dest: a.help for a in cli.build_parser()._subparsers._group_actions[0].choices["plan"]._actions}
    assert all(m.name in helps["method"] for m in METHODS)


def test_records_are_consistent():
    assert len({m.name for m in METHODS}) == len(METHODS)
    assert len({v.key for v in VARIANTS}) == len(VARIANTS) and len({v.label for v in VARIANTS}) == len(VARIANTS)
    assert sorted(v.layer for v in VARIANTS) == list(range(len(VARIANTS)))
    for m in METHODS:
        assert m.family in ("periodic", "flushed") and set(m.allocations) <= {"contiguous", "general"}
        assert m.colour.startswith("#")
    for v in VARIANTS:
        assert v.allocation in method(v.method).allocations
    for study, pairs in LINEUPS.items():
        for name, allocation in pairs:
            assert allocation in method(name).allocations, (study, name)
    with pytest.raises(ValueError, match="unknown method 'x'"):
        method("x")
    with pytest.raises(KeyError):
        variant("uniform")


def _tiny() -> tuple[Chain, Target]:
    ch = Chain(tuple(Layer(f"l{i}", 1.0 + (i % 3), 2.0, 40 + 10 * i, 20) for i in range(6)), input_bytes=20)
    return ch, Target.of(3, bandwidth=100.0, memory_model="paper")


@pytest.mark.parametrize("name", [m.name for m in METHODS])
def test_each_method_does_what_its_record_says(name):
    from workbench.planners import plan

    m, (ch, plat) = method(name), _tiny()
    for allocation in m.allocations:
        p = plan(ch, plat, name, allocation=allocation, time_limit=20)
        assert p.feasible and p.method == name
        assert p.schedule == (name if m.family == "flushed" else "periodic")
        assert registry.flushed(p.schedule) == (m.family == "flushed")
        if m.family == "periodic":
            assert not check(p, ch, plat)
        if m.exact:  # exact methods agree with the exhaustive search over what they search
            ref = plan(ch, plat, "brute", allocation=allocation)
            assert p.status == "optimal" and p.period == pytest.approx(ref.period, rel=1e-6)
    if m.auto_activations:
        assert plan(ch, plat, name, activations="auto", time_limit=20).feasible
