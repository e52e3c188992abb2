"""Tests for workbench.front.planning: ``plan``, ``check`` and ``simulate`` from parsed command lines."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from workbench.front.cli import build_parser
from workbench.front.planning import (
    check_command,
    plan_command,
    platform_from_args,
    simulate_command,
)
from workbench.model.accelerators import accelerator
from workbench.model.plan import Plan
from workbench.model.training_setup import DEFAULT_BANDWIDTH, recorded_link


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """resnet50 on 2 devices by dp, written with ``plan --json``."""
    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert plan_command(parse("plan", "--profile", "resnet50", "--devices", "2", "--quiet", "--json",
                              str(path))) == 0
    return path


def test_platform_takes_the_gpu_memory_and_link_unless_given():
    gpu = accelerator("h100-sxm")
    p = platform_from_args(parse("plan", "--profile", "resnet50", "--devices", "4", "--gpu", "h100-sxm"))
    assert (p.devices, p.memory, p.bandwidth, p.gpu) == (4, gpu.memory, gpu.link_bandwidth, "h100-sxm")
    p = platform_from_args(parse("plan", "--profile", "resnet50", "--devices", "4", "--gpu", "h100-sxm",
                                 "--memory", "8GB", "--bandwidth", "3GB/s"))
    assert (p.memory, p.bandwidth) == (8e9, 3e9)


def test_platform_defaults_without_gpu():
    p = platform_from_args(parse("plan", "--profile", "resnet50", "--devices", "2"))
    assert math.isinf(p.memory) and p.bandwidth == 12e9 and p.gpu is None
    assert (p.setup.memory_model, p.setup.optimizer) == ("full", "adam")


def test_platform_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'h100'; known: .*h100-sxm"):
        platform_from_args(parse("plan", "--profile", "resnet50", "--devices", "2", "--gpu", "h100"))


def test_recorded_links():
    assert recorded_link({}, "bandwidth", DEFAULT_BANDWIDTH) == DEFAULT_BANDWIDTH
    assert math.isinf(recorded_link({"bandwidth": None}, "bandwidth", 1.0))   # JSON null: infinite
    assert recorded_link({"host_bandwidth": "2GB/s"}, "host_bandwidth", 1.0) == 2e9
    with pytest.raises(ValueError, match="^the plan's memory_setup bandwidth must be positive, got 0$"):
        recorded_link({"bandwidth": 0}, "bandwidth", 1.0)


def test_plan_json_is_a_contiguous_plan_of_the_profile(plan_file):
    d = json.loads(plan_file.read_text())
    assert d["devices"] == 2 and d["method"] == "dp"
    names = d["extra"]["layer_names"]
    assert len(names) == len(d["assignment"]) == 18
    a = d["assignment"]
    assert a == sorted(a) and set(a) == {0, 1}          # contiguous on both devices
    assert d["period"] >= d["lower_bound"] > 0


def test_check_accepts_the_plan_and_rejects_a_tampered_period(plan_file, tmp_path, capsys):
    assert check_command(parse("check", str(plan_file), "--profile", "resnet50")) == 0
    assert "valid (2 stages" in capsys.readouterr().out
    d = json.loads(plan_file.read_text())
    d["period"] *= 0.5                       # faster than the stages allow
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    assert check_command(parse("check", str(bad), "--profile", "resnet50")) == 1
    assert "INVALID" in capsys.readouterr().out


def test_check_takes_the_devices_from_the_plan(plan_file):
    args = parse("check", str(plan_file), "--profile", "resnet50")
    assert args.devices is None
    check_command(args)
    assert args.devices == Plan.from_json(plan_file).devices == 2


def test_check_without_profile_says_what_is_missing(plan_file):
    with pytest.raises(ValueError, match="^--profile is required to check or simulate a plan"):
        check_command(parse("check", str(plan_file)))


def test_simulate_reaches_the_plan_period(plan_file, tmp_path, capsys):
    out = tmp_path / "trace.csv"
    assert simulate_command(parse("simulate", str(plan_file), "--profile", "resnet50", "--out", str(out),
                                  "--batches", "6")) == 0
    trace = pd.read_csv(out)
    starts = trace[(trace.stage == 0) & (trace.kind == "F")].sort_values("batch").start.to_numpy()
    assert len(starts) == 6
    period = json.loads(plan_file.read_text())["period"]
    assert starts[-1] - starts[-2] == pytest.approx(period, rel=1e-6)     # the steady state's period
    assert f"wrote {out}" in capsys.readouterr().out


def test_plan_that_does_not_fit_exits_2(capsys):
    assert plan_command(parse("plan", "--profile", "resnet50", "--devices", "2", "--memory", "1MB",
                              "--quiet")) == 2
    assert "infeasible" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (("--method", "dp", "--micro-batches", "4"), "^--micro-batches: method 'dp' plans a periodic schedule"),
    (("--method", "gpipe", "--chunks", "2"), "^--chunks: method 'gpipe' puts one stage on each device"),
    (("--method", "dp", "--allocation", "general"), "^--allocation general: method 'dp' plans contiguous"),
    (("--method", "nosuch",), "nosuch"),
])
def test_plan_refuses_options_the_method_cannot_use(argv, message):
    with pytest.raises(ValueError, match=message) as e:
        plan_command(parse("plan", "--profile", "resnet50", "--devices", "2", "--quiet", *argv))
    assert "\n" not in str(e.value)


def test_plan_without_profile():
    args = parse("plan", "--devices", "2")
    with pytest.raises(ValueError, match=r"^plan: give --profile FILE"):
        plan_command(args)
