"""The command line (workbench.front.cli): bad input is refused with one line and exit 2, before any work."""

from __future__ import annotations

import json

import pytest

from workbench.front.cli import build_parser, main
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import PLANNERS
from workbench.profiles import write_profile
from workbench.schedules.builder import build_schedule

MS = 1e-3


@pytest.fixture
def files(tmp_path):
    chain = Chain(tuple(Layer(f"l{i}", 1 * MS, 2 * MS, 100, 10) for i in range(6)), input_bytes=10,
                  meta={"network": "toy"})
    prof = tmp_path / "toy.csv"
    write_profile(chain, prof)
    plat = Target.of(3, memory=1000, bandwidth=20000, memory_model="paper")
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
    # an infinite link went into the plan JSON as Infinity, which check then refused; --gpu '' was ignored
    (["--bandwidth", "inf"], "argument --bandwidth: inf is not finite"),
    (["--node-bandwidth", "inf", "--devices-per-node", "2"], "argument --node-bandwidth: inf is not finite"),
    (["--host-bandwidth", "inf"], "argument --host-bandwidth: inf is not finite"),
    (["--gpu", ""], "argument --gpu: an empty name"),
    # named the wrong thing: "value must be positive", and an empty profile read as the current folder's graph.txt
    (["--bandwidth", "0"], "argument --bandwidth: must be positive, got '0'"),
    (["--profile", ""], "argument --profile: an empty profile name"),
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
    (["--json", ""], "--json: an empty file name"),      # was: "--json : is a folder"
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


def test_running_out_of_memory_is_one_line_and_exit_3(files, capsys, monkeypatch):
    """A memory cap that an allocation would exceed (a MemoryError anywhere in the planner) stops with one line."""
    prof, _, _ = files

    def greedy(*a, **k):
        raise MemoryError("Unable to allocate 706. KiB for an array")

    monkeypatch.setitem(PLANNERS, "dp", greedy)
    rc = main(["plan", "--profile", str(prof), "--devices", "3", "--memory", "1000", "--memory-model", "paper"])
    err = capsys.readouterr().err
    assert rc == 3 and err.count("\n") == 1 and err.startswith("error: out of memory: plan needed more memory")
    assert "Traceback" not in err


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


# ---------------------------------------------------------------------------------------------
# the fault audit's loose ends (issue 27.5): one clear line, exit 2, before any work
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,pattern", [
    (["largest", "--memory", "inf"], "argument --memory: inf is not a memory size above 0 and finite"),
    (["largest", "--memory", "0"], "argument --memory: 0 is not a memory size above 0 and finite"),
    (["largest", "--devices", "100000"], "argument --devices: 100000 is not in 1..64"),
    (["largest", "--time-limit", "-1"], "argument --time-limit: -1 is not a positive finite number"),
    (["run", "plan.json", "--backend", "mpi-x"], "argument --backend: invalid choice: 'mpi-x'"),
    (["plan", "--profile", "resnet50", "--devices", "2", "--method", "gpipe", "--micro-batches", "1000000000"],
     "argument --micro-batches: 1000000000 is not in 1..10000"),
    (["reproduce", "--workers", "0"], "argument --workers: 0 is not in 1..1024"),
])
def test_out_of_range_options_are_refused_by_the_parser(capsys, argv, pattern):
    _refused(capsys, argv, pattern)


@pytest.mark.parametrize("extra,pattern", [
    (["--device", "cuda:7"] if __import__("torch").cuda.device_count() < 8 else ["--device", "cuda:99"],
     "--device cuda"),
    (["--device", "tpu9"], "--device tpu9: not a device to profile on; give cpu, cuda or cuda:N"),
    (["--device", "meta"], "--device meta: not a device to profile on"),
    (["--set", "layers=-1"], "model 'gpt': layers=-1 is not a whole number of at least 1"),
    (["--set", "heads=0"], "model 'gpt': heads=0 is not a whole number of at least 1"),
    (["--set", "dropout=1.5"], "model 'gpt': dropout=1.5 is not a rate in [0, 1)"),
])
def test_profile_refuses_devices_and_options_it_cannot_use_before_profiling(tmp_path, capsys, monkeypatch, extra,
                                                                           pattern):
    import workbench.profiles.profiler as profiler

    monkeypatch.setattr(profiler, "profile_zoo", lambda *a, **k: pytest.fail("profiling started"))
    assert main(["profile", "--model", "gpt", "--out", str(tmp_path / "p.csv")] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and pattern in err[0]


def test_cuda_without_a_gpu_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["profile", "--model", "mlp", "--device", "cuda", "--out", str(tmp_path / "p.csv")]) == 2
    assert "--device cuda: " in capsys.readouterr().err and not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("command", ["check", "simulate", "run"])
def test_a_plan_nested_100000_deep_is_one_line(files, capsys, command):
    prof, _, tmp = files
    deep = tmp / "deep.json"
    deep.write_text('{"period": ' + "[" * 100_000 + "]" * 100_000 + "}")
    extra = {"check": ["--profile", str(prof)], "simulate": ["--profile", str(prof), "--out", str(tmp / "t.csv")],
             "run": ["--out", str(tmp / "run")]}[command]
    assert main([command, str(deep)] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "deep.json: nested too deep to be a plan" in err[0]


def test_plan_exits_1_when_the_checker_rejects_its_plan(files, capsys, monkeypatch):
    """As `check` does: a plan that breaks a rule (here the re-check's verdict, planted) is not a success."""
    import workbench.planners as planners

    prof, _, tmp = files
    real = planners.plan

    def rejected(*a, **k):
        p = real(*a, **k)
        return p.with_(extra={**p.extra, "violations": ["rule 8 (host link): device 0 ..."]})

    monkeypatch.setattr(planners, "plan", rejected)
    argv = ["plan", "--profile", str(prof), "--devices", "3", "--activations", "offload", "--json", str(tmp / "o.json")]
    assert main(argv) == 1
    assert "INVALID: the checker rejects this plan" in capsys.readouterr().out
    monkeypatch.setattr(planners, "plan", real)
    assert main(argv) == 0


def test_simulate_refuses_an_unwritable_output_before_simulating(files, capsys, monkeypatch):
    """A read-only or full disk is said of the user's path, before the work (the probe of check_outputs)."""
    import errno

    import workbench.io as io
    import workbench.schedules.simulate as sim

    prof, plan, tmp = files

    def full(path, folder=False):
        raise io._cannot_write(path, OSError(errno.ENOSPC, "No space left on device", str(tmp / ".t.csv.1.x.tmp")))

    monkeypatch.setattr(io, "check_writable", full)
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: pytest.fail("simulated"))
    assert main(["simulate", str(plan), "--profile", str(prof), "--out", str(tmp / "t.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {tmp / 't.csv'}: cannot write it (no space left on the device)"


def test_simulate_writes_its_two_files_as_a_pair(files, capsys, disk_full_at):
    """The memory file failing leaves both files of the previous run as they were (fsyncs: the output probe,
    the trace, then the memory file)."""
    prof, plan, tmp = files
    argv = ["simulate", str(plan), "--profile", str(prof), "--bandwidth", "20000B/s", "--out", str(tmp / "t.csv")]
    assert main(argv) == 0
    before = {p: p.read_bytes() for p in (tmp / "t.csv", tmp / "t.memory.csv")}
    disk_full_at(3)
    assert main(argv[:-1] + [str(tmp / "t.csv"), "--batches", "7"]) == 2
    assert "t.memory.csv: cannot write it (no space left on the device)" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before


def test_a_real_memory_cap_is_one_line_and_exit_3(files):
    """Under ``ulimit -v`` numpy's own import fails (a MemoryError, or at 60-100 MB the loader's "failed to map
    segment"): it came out as a traceback from the package's import (the audit: 300 MB); now the command says
    ``error: out of memory`` in one line and exits 3."""
    import os
    import resource
    import subprocess
    import sys

    prof, _, _ = files

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    for limit in (60 * 2**20, 100 * 2**20):
        out = subprocess.run([sys.executable, "-m", "workbench", "plan", "--profile", str(prof), "--devices", "3"],
                             preexec_fn=cap, capture_output=True, text=True,
                             env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        err = out.stderr.strip().splitlines()
        assert out.returncode == 3 and len(err) == 1 and err[0].startswith("error: out of memory"), out.stderr[-2000:]


@pytest.mark.parametrize("key", ["node_bandwidth", "bandwidth", "host_bandwidth"])
def test_a_plan_recording_a_link_of_zero_bytes_per_second_is_one_line(tmp_path, capsys, key):
    """`check` and `simulate` of a torch-schedule plan whose recorded links say 0 (a hand-edited
    ``memory_setup``): a ZeroDivisionError traceback before; one line naming the file and the plan's key (the plan
    file's reader, workbench.model.plan_json), exit 2."""
    chain = Chain(tuple(Layer(f"l{i}", 1 * MS, 2 * MS, 100, 10, 1000) for i in range(8)), input_bytes=10,
                  meta={"network": "toy"})
    prof = tmp_path / "toy.csv"
    write_profile(chain, prof)
    assert main(["plan", "--profile", str(prof), "--devices", "4", "--method", "zbv", "--devices-per-node", "2",
                 "--node-bandwidth", "1GB/s", "--json", str(tmp_path / "p.json"), "-q"]) == 0
    d = json.loads((tmp_path / "p.json").read_text())
    d["memory_setup"][key] = 0
    (tmp_path / "p.json").write_text(json.dumps(d))
    capsys.readouterr()
    for extra in (["check"], ["simulate", "--out", str(tmp_path / "t.csv")]):
        assert main([extra[0], str(tmp_path / "p.json"), "--profile", str(prof)] + extra[1:]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {tmp_path / 'p.json'}: memory_setup.{key}: 0 is not a positive bandwidth (bytes per "
                       "second; null: infinite)"], err


@pytest.mark.parametrize("method", ["dp", "ilp", "pipedream"])
def test_micro_batches_of_a_periodic_method_is_refused_not_ignored(files, capsys, method):
    """dp planned as if --micro-batches 8 had not been given (exit 0, the same plan): now one line saying why."""
    prof, _, tmp = files
    assert main(["plan", "--profile", str(prof), "--devices", "2", "--method", method, "--micro-batches", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --micro-batches: method '{method}' plans a periodic schedule")
    assert "gpipe, 1f1b" in err[0]
    assert main(["plan", "--profile", str(prof), "--devices", "2", "--method", "gpipe", "--micro-batches", "8"]) == 0


def test_largest_says_nothing_fits_and_exits_2(tmp_path, capsys):
    """`largest --memory 1KiB` printed a table of size 0 and NaN and exited 0; an infeasible answer exits 2 with
    one error line naming the smallest models, as `plan` does for a plan that cannot fit."""
    assert main(["largest", "--memory", "1KiB", "--quick", "--devices", "2", "--family", "width",
                 "--out", str(tmp_path / "t.csv")]) == 2
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: nothing fits in 1.00 KiB per device: no method fits even the "
                                               "smallest model (width: 7.05 M parameters"), err
    assert "nan" not in said.out and not (tmp_path / "t.csv").exists()
