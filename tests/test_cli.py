"""The command line (workbench.front.cli): bad input is refused with one line and exit 2, before any work."""

from __future__ import annotations

import json

import pytest

from workbench.front.cli import build_parser, main
from workbench.model.chain import Chain, Layer, Platform
from workbench.profiles import write_profile
from workbench.verify.schedule import build_schedule

MS = 1e-3


@pytest.fixture
def files(tmp_path):
    chain = Chain(tuple(Layer(f"l{i}", 1 * MS, 2 * MS, 100, 10) for i in range(6)), input_bytes=10,
                  meta={"network": "toy"})
    prof = tmp_path / "toy.csv"
    write_profile(chain, prof)
    plat = Platform(3, memory=1000, bandwidth=20000, memory_model="paper")
    plan = tmp_path / "plan.json"
    build_schedule(chain, plat, [0, 0, 1, 1, 2, 2], 8 * MS, method="builder").to_json(plan)
    return prof, plan, tmp_path


def _refused(capsys, argv, pattern):
    with pytest.raises(SystemExit) as e:   # argparse refuses it
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert pattern in err and "Traceback" not in err


@pytest.mark.parametrize("extra,pattern", [
    (["--time-limit", "0"], "argument --time-limit: 0 is not a positive finite number"),
    (["--time-limit", "-3"], "argument --time-limit: -3 is not a positive finite number"),
    (["--time-limit", "nan"], "argument --time-limit: nan is not a positive finite number"),
    (["--time-limit", "inf"], "argument --time-limit: inf is not a positive finite number"),
    (["--devices", "1000000000"], "argument --devices/-P: 1000000000 is not in 1..65536"),
    (["--micro-batches", "0"], "argument --micro-batches: 0 is not in 1.."),
    (["--memory", "lots"], "argument --memory: cannot read 'lots'"),
    (["--latency", "-1"], "argument --latency: -1 is not a non-negative finite number"),
])
def test_bad_plan_options_are_refused_by_the_parser(files, capsys, extra, pattern):
    prof, _, _ = files
    _refused(capsys, ["plan", "--profile", str(prof), "--devices", "3"] + extra, pattern)


def _never_plan(monkeypatch):
    import workbench.planners as planners

    def boom(*a, **k):
        raise AssertionError("planning ran")

    monkeypatch.setattr(planners, "plan", boom)


@pytest.mark.parametrize("extra,pattern", [
    (["--allocation", "general"], "--allocation general: method 'dp' plans contiguous allocations only"),
    (["--allocation", "general", "--method", "pipedream"], "method 'pipedream' plans contiguous allocations only"),
    (["--json", "{tmp}"], "is a folder; give a file name"),
    (["--json", "{tmp}/missing/plan.json"], "missing does not exist"),
    (["--method", "magic"], "unknown method 'magic'"),
])
def test_bad_plan_requests_are_refused_before_planning(files, capsys, monkeypatch, extra, pattern):
    prof, _, tmp = files
    _never_plan(monkeypatch)
    argv = ["plan", "--profile", str(prof), "--devices", "3"] + [x.format(tmp=tmp) for x in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and pattern in err and "Traceback" not in err


def test_general_allocation_with_the_ilp_runs_with_progress_on_stderr(files, capsys):
    prof, _, tmp = files
    argv = ["plan", "--profile", str(prof), "--devices", "3", "--method", "ilp", "--allocation", "general",
            "--time-limit", "5", "--json", str(tmp / "g.json")]
    assert main(argv) == 0
    assert json.loads((tmp / "g.json").read_text())["allocation"] == "general"
    cap = capsys.readouterr()
    assert "s] ilp: incumbent dp" in cap.err and "ilp:" not in cap.out
    assert main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("spoil,pattern", [
    (lambda d: d.update(period=-1.0), "the period must be positive and finite, got -1.0"),
    (lambda d: (d["assignment"].__setitem__(0, -1), d["stages"][0].update(device=-1)), "is on device -1"),
    (lambda d: (d["assignment"].__setitem__(5, 7), d["stages"][2].update(device=7)), "is on device 7, not one of 0..2"),
    (lambda d: d["stages"][1].update(device=1.5), "stages[1].device: 1.5 is not a whole number"),
    (lambda d: d["stages"][1].update(fwd_start="NaN"), "non-finite number NaN"),
    (lambda d: d.update(devices=1e9), "devices: 1000000000 is out of range"),
])
def test_simulate_refuses_broken_plans(files, capsys, spoil, pattern):
    prof, plan, tmp = files
    d = json.loads(plan.read_text())
    spoil(d)
    bad = tmp / "bad.json"
    bad.write_text(json.dumps(d).replace('"NaN"', "NaN"))
    assert main(["simulate", str(bad), "--profile", str(prof), "--bandwidth", "20000B/s",
                 "--out", str(tmp / "t.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and pattern in err and "Traceback" not in err
    assert not (tmp / "t.csv").exists()


@pytest.mark.parametrize("command", ["check", "simulate"])
def test_non_object_plan_files_are_refused(files, capsys, command):
    prof, _, tmp = files
    (tmp / "list.json").write_text("[1, 2]")
    extra = ["--out", str(tmp / "t.csv")] if command == "simulate" else []
    assert main([command, str(tmp / "list.json"), "--profile", str(prof)] + extra) == 2
    assert "a plan is a JSON object, got a list" in capsys.readouterr().err


def test_check_prints_a_legend_with_the_grid(files, capsys):
    prof, plan, _ = files
    assert main(["check", str(plan), "--profile", str(prof), "--memory", "600", "--bandwidth", "20000B/s"]) == 1
    out = capsys.readouterr().out
    assert "rules: 0 structure, 1 allocation" in out and "X: the rule is broken on that device" in out


def test_a_bad_profile_is_one_line(tmp_path, capsys):
    (tmp_path / "p.csv").write_text("name,forward_ms,backward_ms,weight_bytes,activation_bytes\nx,1e300,1,1,1\n")
    assert main(["plan", "--profile", str(tmp_path / "p.csv"), "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "forward_ms 1e+300" in err and "Traceback" not in err


def _options(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((name, a) for a in sub._actions if not isinstance(a, argparse._HelpAction))


def test_every_option_has_help_and_the_help_points_to_the_repo():
    parser = build_parser()
    missing = [f"{cmd} {a.option_strings or a.dest}" for cmd, a in _options(parser) if not a.help]
    assert missing == []
    text = parser.format_help()
    assert "docs/model.md" in text and "DESIGN.md" not in text


def test_check_simulate_and_run_take_the_plans_set_up(tmp_path, capsys):
    """A plan records its training set-up (memory_setup: weights, optimizer, precision, zero_grad); check,
    simulate and run compute with it, and an option that contradicts it is refused in one line naming both."""
    import json

    import numpy as np
    import pandas as pd

    from test_memory import measured_chain
    from workbench.front.cli import main
    from workbench.profiles import write_profile

    chain = measured_chain(np.random.default_rng(3), 4).with_meta(network="toy")
    prof = tmp_path / "toy.csv"
    write_profile(chain, prof)
    out = tmp_path / "p.json"
    assert main(["plan", "--profile", str(prof), "--devices", "2", "--weights", "single", "--optimizer", "sgd",
                 "--zero-grad", "zeros", "--json", str(out)]) == 0
    setup = json.loads(out.read_text())["memory_setup"]
    assert (setup["weights"], setup["optimizer"], setup["zero_grad"]) == ("single", "sgd", "zeros")
    capsys.readouterr()
    assert main(["check", str(out), "--profile", str(prof)]) == 0          # no option repeated
    trace = tmp_path / "t.csv"
    assert main(["simulate", str(out), "--profile", str(prof), "--out", str(trace)]) == 0
    peaks = pd.read_csv(tmp_path / "t.memory.csv").groupby("device")["total"].max().tolist()
    assert peaks == pytest.approx(json.loads(out.read_text())["memory"])
    capsys.readouterr()
    for option, value, recorded in (("--weights", "stash", "single"), ("--zero-grad", "none", "zeros"),
                                    ("--optimizer", "adam", "sgd"), ("--precision", "bf16", "fp32")):
        for command in (["check", str(out), "--profile", str(prof)],
                        ["simulate", str(out), "--profile", str(prof), "--out", str(trace)],
                        ["run", str(out), "--profile", str(prof), "--model", "mlp"]):
            assert main(command + [option, value]) == 2, (command[0], option)
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"{option} {value}" in err[0] and recorded in err[0], err
    # the same value as the plan's is no contradiction; default plans use torch's default loop
    assert main(["check", str(out), "--profile", str(prof), "--weights", "single", "--zero-grad", "zeros"]) == 0
    assert main(["plan", "--profile", str(prof), "--devices", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["memory_setup"]["zero_grad"] == "none"
