"""The import graph of workbench/ has no cycle, and the package imports none of its own modules lazily
behind ``except ImportError``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "workbench"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """module -> the workbench modules it imports, anywhere in it (functions included; with ``type_only``, the
    imports under ``if TYPE_CHECKING:`` too)."""
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        skip = set() if type_only else _type_checking_only(tree)
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                names = [a.name for a in node.names]
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
                    break
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_import_graph_of_workbench_is_acyclic():
    graph = import_graph()
    assert len(graph) > 50 and "workbench.planners.dp.contiguous" in graph["workbench.planners.ilp.phases"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_cycle_even_through_type_only_imports_but_in_the_model():
    """A module that imports another only for its annotations still depends on it. The one such circle left
    is the model's own (chain.py and the memory model it validates the training set-up with)."""
    graph = import_graph(type_only=True)
    outside = {m: {n for n in deps if not n.startswith("workbench.model.")}
               for m, deps in graph.items() if not m.startswith("workbench.model.")}
    assert _cycle(outside) is None, " -> ".join(_cycle(outside))


def test_the_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_error_guards_around_the_package_itself():
    for path in (ROOT / "planners").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            caught = [ast.unparse(h.type or ast.Name("")) for h in getattr(node, "handlers", ())]
            if isinstance(node, ast.Try) and any("ImportError" in c for c in caught):
                assert False, f"{path.name}:{node.lineno}: an except ImportError guard"


def test_the_tree_is_the_architecture():
    """The package root keeps at most a dozen modules; the layers are folders (README, "Layout")."""
    root_modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root_modules) <= 12, root_modules
    for folder in ("model", "schedules", "verify", "planners", "planners/dp", "planners/ilp", "planners/evaluate",
                   "profiles", "runtime", "viz", "experiments", "front"):
        assert (ROOT / folder / "__init__.py").is_file(), folder
    graph = import_graph()
    model = [m for m in graph if m.startswith("workbench.model.")]
    # the model imports nothing above it: no planner, checker, runtime, view or front-end
    above = ("workbench.planners", "workbench.verify", "workbench.runtime", "workbench.viz", "workbench.front",
             "workbench.experiments", "workbench.profiles", "workbench.schedules")
    assert not [(m, n) for m in model for n in graph[m] if n.startswith(above)]
    # the studies draw with viz; viz never reaches back into the studies
    assert not [(m, n) for m in graph if m.startswith("workbench.viz") for n in graph[m]
                if n.startswith("workbench.experiments")]
    # the schedules build on the model; the checker imports nothing that builds, simulates or runs a plan: of the
    # schedules only the op record, the registry and torch's orders (what it replays; kept on disk), even transitively
    assert [(m, n) for m in graph if m.startswith("workbench.schedules") for n in graph[m]
            if n.startswith(above[:3])] == [("workbench.schedules.simulate", "workbench.verify.check")], \
        "the schedules import no planner or runtime, and of the checker only rules 0 and 1, which the simulator needs"
    reach = set()
    todo = [m for m in graph if m.startswith("workbench.verify")]
    while todo:
        for n in graph[todo.pop()] - reach:
            reach.add(n)
            todo.append(n)
    allowed = ("workbench.model.", "workbench.verify", "workbench.io", "workbench.methods", "workbench.schedules.ops",
               "workbench.schedules.registry", "workbench.schedules.torch_orders", "workbench.schedules")
    assert "workbench.schedules.registry" in reach and sorted(n for n in reach if not n.startswith(allowed)) == []
    assert not [n for n in reach if n.startswith("workbench.schedules.") and n.rsplit(".", 1)[1] not in
                ("ops", "registry", "torch_orders", "order_cache")]      # torch's orders, and those kept on disk
    # nothing below the front imports it
    assert not [(m, n) for m in graph if not m.startswith("workbench.front") and m != "workbench.__main__"
                for n in graph[m] if n.startswith("workbench.front")]


def long_pieces(root: Path = ROOT, max_lines: int = 500, max_function: int = 80) -> list[str]:
    """Modules of more than ``max_lines`` lines and functions (methods, nested ones) of more than
    ``max_function``, docstring included: ``path: what``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(root.parent).as_posix()
        if len(text.splitlines()) > max_lines:
            out.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > max_function:
                    out.append(f"{name}:{node.lineno}: {node.name} has {n} lines")
    return out


def test_no_module_over_500_lines_and_no_function_over_80():
    """The house rule (a module per idea, functions that fit on a screen), for the whole package."""
    assert long_pieces() == []
    assert long_pieces(max_lines=400, max_function=60)      # the check sees modules and functions
