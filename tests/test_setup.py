"""The set-up files agree with each other."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(lines):
    out = {}
    for line in lines:
        line = line.strip().lstrip("-").strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s#]+)$", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_environment_yml_matches_requirements():
    req = pins((ROOT / "requirements.txt").read_text().splitlines())
    env = pins((ROOT / "environment.yml").read_text().splitlines())
    assert req, "requirements.txt pins nothing"
    assert req == env


def test_torch_pinned_exactly():
    req = pins((ROOT / "requirements.txt").read_text().splitlines())
    assert req["torch"] == "2.13.0"


def test_readme_opens_with_the_two_commands():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "make lab" in head and "make test" in head


def test_ci_calls_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_test_runs_the_linter_before_the_tests():
    target = (ROOT / "Makefile").read_text().split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert target.index("ruff check .") < target.index("pytest")
    assert "ruff" in pins((ROOT / "requirements.txt").read_text().splitlines())


def _make_lab_dry_run(tmp_path, uid):
    """``make -n lab`` with ``id -u`` answering ``uid`` (a stand-in ``id`` first on PATH): the command it would run."""
    import os
    import shutil
    import subprocess

    if shutil.which("make") is None:
        import pytest

        pytest.skip("make is not installed")
    fake = tmp_path / f"uid{uid}"
    fake.mkdir()
    (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (fake / "id").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    env.pop("LAB_FLAGS", None)
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "lab"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if "jupyter-lab" in line]


def test_make_lab_allows_root_only_as_root(tmp_path):
    as_root = _make_lab_dry_run(tmp_path, 0)
    as_user = _make_lab_dry_run(tmp_path, 1000)
    assert len(as_root) == 1 and "--allow-root" in as_root[0] and as_root[0].rstrip().endswith("notebooks/")
    assert len(as_user) == 1 and "--allow-root" not in as_user[0]


def _pyproject():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_pyproject_declares_every_requirement_pinned_as_requirements_txt_pins_it():
    """The package's dependencies and extras together are exactly requirements.txt (same pins): a plain
    ``pip install -e .`` gets what the package imports, ``make setup`` (requirements.txt, then --no-deps) the same."""
    req = pins((ROOT / "requirements.txt").read_text().splitlines())
    project = _pyproject()
    declared = pins(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared.update(pins(extra))
    assert declared == req
    core = pins(project["dependencies"])
    assert {"torch", "numpy", "pandas", "pyomo", "highspy", "plotly", "tqdm"} <= set(core)
    assert {"dask", "distributed"} <= set(pins(project["optional-dependencies"]["dask"]))


def test_the_package_imports_only_what_it_declares():
    """Every third-party module the package imports is a declared dependency (core or extra)."""
    import ast
    import sys

    known = {"torch", "numpy", "pandas", "pyarrow", "pyomo", "highspy", "plotly", "kaleido", "ipywidgets", "tqdm",
             "transformers", "dask", "distributed", "IPython"}   # IPython comes with ipywidgets
    found = set()
    for path in (ROOT / "workbench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            found |= {n.split(".")[0] for n in names}
    third_party = {n for n in found if n not in sys.stdlib_module_names and n != "workbench"}
    assert third_party <= known, third_party - known
    declared = set(pins(_pyproject()["dependencies"]))
    for extra in _pyproject()["optional-dependencies"].values():
        declared |= set(pins(extra))
    assert {n.lower() for n in known - {"IPython"}} <= declared
