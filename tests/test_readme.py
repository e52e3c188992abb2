"""README.md's "Plan a layout" commands run as written, from a fresh folder (each exit status 0): the story the
README tells is one a new user can follow. The run on CPU ranks (its comment gives its time) is marked slow."""

from __future__ import annotations

import shlex

import pytest

from workbench.front.cli import main
from workbench.paths import REPO_ROOT

PREFIX = ".venv/bin/python -m workbench "


def layout_commands() -> list[str]:
    """The ``workbench`` commands of the README's "Plan a layout" paragraph, continuation lines joined."""
    text = (REPO_ROOT / "README.md").read_text()
    part = text.split("**Plan a layout.**", 1)[1].split("\n\n`run` ", 1)[0]
    joined = part.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip().startswith(PREFIX)]


def test_the_readme_plans_checks_simulates_exports_and_runs_a_layout():
    commands = layout_commands()
    verbs = [shlex.split(c, comments=True)[3] for c in commands]
    assert verbs == ["plan", "plan", "check", "simulate", "export", "plan", "run"], verbs


@pytest.mark.parametrize("first,last,printed", [
    pytest.param(0, 5, ("chosen: TP", "valid (2 stages", "--tensor-model-parallel-size 2"), id="plan-check-export"),
    pytest.param(5, 7, ("max gradient error", "wrote build/small-run/summary.json"), id="run-on-cpu-ranks",
                 marks=pytest.mark.slow)])
def test_the_readme_layout_commands_run_as_written(tmp_path, monkeypatch, capsys, first, last, printed):
    pytest.importorskip("transformers")
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples")
    (tmp_path / "build").mkdir()
    monkeypatch.chdir(tmp_path)
    for command in layout_commands()[first:last]:
        argv = shlex.split(command, comments=True)[3:]
        assert main(argv) == 0, (command, capsys.readouterr().err[-2000:])
    out = capsys.readouterr().out
    assert all(p in out for p in printed), out[-3000:]
