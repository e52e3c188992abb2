"""workbench.model.training_setup: the training set-up as a value, read from and written to a plan's memory_setup,
resolved once per command and once per torchrun rank."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.training_setup import (
    DATA_PARALLEL_KEYS,
    DEFAULT_BANDWIDTH,
    SETUP_KEYS,
    SETUP_OPTIONS,
    TrainingSetup,
    recorded_link,
)
from workbench.planners import plan as run_planner

DOCS = Path(__file__).resolve().parents[1] / "docs" / "model.md"


def _chain(n: int = 4) -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1e-3 * (i + 1), 2e-3 * (i + 1), 1e3, 4e3, 1e5) for i in range(n)))


@pytest.mark.parametrize("setup", [TrainingSetup(), TrainingSetup(optimizer="sgd", precision="bf16", zero_grad="zeros"),
                                   TrainingSetup(memory_model="paper", weight_factor=3.0, weights="single")])
def test_a_setup_written_reads_back_as_itself(setup):
    written = setup.memory_setup(estimated=["grad_bytes"])
    assert TrainingSetup.from_memory_setup(written) == setup
    assert TrainingSetup.from_memory_setup(json.loads(json.dumps(written))) == setup     # through JSON
    assert ("estimated" in written) == (not setup.paper) and "dp" not in written     # the layout's, not the set-up's


def test_a_plan_records_its_layouts_data_parallel_group_and_is_read_back_with_it(tmp_path):
    """A plan made for ranks of a data-parallel group records ``dp`` and ``zero`` beside the set-up; the command
    line's target of that plan has them in its layout again (and the set-up without them)."""
    from types import SimpleNamespace

    from workbench.front.planning import platform_from_args
    from workbench.model.training_setup import recorded_data_parallel

    target = Target.of(2, optimizer="adamw", weights="single", dp=4, zero=2)
    made = run_planner(_chain(), target, "1f1b", micro_batches=4)
    made.to_json(tmp_path / "p.json")
    read = Plan.from_json(tmp_path / "p.json")
    assert (read.setup["dp"], read.setup["zero"]) == recorded_data_parallel(read.setup) == (4, 2)
    assert TrainingSetup.from_memory_setup(read.setup) == replace(target.setup, precision="fp32")
    args = SimpleNamespace(devices=2, latency=0.0, memory=None, bandwidth=None)
    again = platform_from_args(args, read)
    assert (again.devices, again.layout.dp, again.layout.zero, again.platform.devices) == (2, 4, 2, 8)
    assert "dp" not in TrainingSetup.from_memory_setup({}).memory_setup() and recorded_data_parallel({}) == (1, 0)


@pytest.mark.parametrize("platform", [Target.of(2, optimizer="sgd", precision="bf16", zero_grad="zeros",
                                               weights="single"),
                                      Target.of(2, memory_model="paper", weight_factor=2.0)])
def test_a_plans_memory_setup_is_its_targets_training_setup(platform, tmp_path):
    """What a planner records reads back (through the plan's JSON) as the set-up of the target it planned for, and
    writes back as the very keys it recorded."""
    made = run_planner(_chain(), platform, "dp")
    made.to_json(tmp_path / "p.json")
    read = Plan.from_json(tmp_path / "p.json").setup
    setup = TrainingSetup.from_memory_setup(read)
    assert setup == platform.setup
    assert setup.memory_setup(read.get("estimated", ())) == read


def test_what_a_plan_that_predates_a_key_used():
    assert TrainingSetup.from_memory_setup({}) == TrainingSetup(memory_model="paper")          # no set-up at all
    assert TrainingSetup.from_memory_setup(None).memory_model == "paper"
    old = TrainingSetup.from_memory_setup({"memory_model": "full", "optimizer": "sgd", "precision": None})
    assert (old.zero_grad, old.weights, old.precision) == ("zeros", "stash", None)          # zeroed in place then


def test_docs_table_names_every_key_of_memory_setup():
    """docs/model.md's memory_setup table has a row for every key a plan writes (the set-up's, a layout's
    data-parallel group, and the links planners.plan adds)."""
    from workbench.planners import platform_links

    text = DOCS.read_text()
    table = text[text.index("`memory_setup` (`workbench.model.plan.memory_setup`"):]
    table = table[:table.index("\n\n", table.index("| key |"))]
    rows = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", table, re.M))
    documented = {k for row in rows for k in row if k}
    links = platform_links(Target.on("h100-sxm", 16, devices_per_node=8))
    written = set(SETUP_KEYS) | set(DATA_PARALLEL_KEYS) | {"estimated", "host_bandwidth"} | set(links)  # host: offload
    assert written - documented == set() and documented - written == set()


def test_the_default_link_and_a_recorded_infinite_one():
    from workbench.front.cli import build_parser
    from workbench.front.planning import platform_from_args
    from workbench.model.units import parse_bandwidth
    from workbench.runtime.session import platform_for_run

    args = build_parser().parse_args(["plan", "--profile", "x", "--devices", "2"])
    plan = Plan(1.0, (0,), (), 1, setup={"memory_model": "full"})
    assert platform_from_args(args).bandwidth == platform_for_run(plan).bandwidth == parse_bandwidth(DEFAULT_BANDWIDTH)
    infinite = Plan(1.0, (0,), (), 2, setup={"memory_model": "full", "bandwidth": None, "devices_per_node": 1,
                                             "node_bandwidth": None})
    assert platform_from_args(args, infinite).bandwidth == math.inf          # null: infinite, read one way by both
    p = platform_for_run(infinite)
    assert (p.bandwidth, p.node_bandwidth, p.devices_per_node) == (math.inf, math.inf, 1)
    assert recorded_link({}, "host_bandwidth", 1.0) == 1.0


@pytest.fixture
def resolutions(monkeypatch):
    """Counts the calls of TrainingSetup.resolve."""
    calls: list[object] = []
    real = TrainingSetup.resolve.__func__

    def counted(cls, args, plan=None):
        calls.append(plan)
        return real(cls, args, plan)

    monkeypatch.setattr(TrainingSetup, "resolve", classmethod(counted))
    return calls


def test_plan_and_check_resolve_the_setup_once(tmp_path, resolutions, capsys):
    from workbench.front.cli import main
    from workbench.profiles import write_profile

    write_profile(_chain(), tmp_path / "c.csv")
    assert main(["plan", "--profile", str(tmp_path / "c.csv"), "--devices", "2", "--optimizer", "sgd",
                 "--json", str(tmp_path / "p.json")]) == 0
    assert len(resolutions) == 1
    resolutions.clear()
    assert main(["check", str(tmp_path / "p.json"), "--profile", str(tmp_path / "c.csv")]) == 0
    assert len(resolutions) == 1 and resolutions[0] is not None


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory) -> Path:
    """The zoo MLP's profile (batch size 4), written as a CSV."""
    from workbench.profiles import write_profile
    from workbench.profiles.profiler import profile_zoo

    path = tmp_path_factory.mktemp("mlp") / "mlp.csv"
    write_profile(profile_zoo("mlp", 4, repeats=1, warmup=0), path)
    return path


class _Started(Exception):
    """Raised where a torchrun rank would start its work."""


def test_a_torchrun_rank_resolves_the_setup_once(tmp_path, resolutions, monkeypatch, mlp_profile):
    """The torchrun entry, one rank of one, up to where the rank would start its work."""
    from workbench.front.cli import main as cli
    from workbench.runtime import engine, worker

    prof = mlp_profile
    assert cli(["plan", "--profile", str(prof), "--devices", "1", "--json", str(tmp_path / "p.json")]) == 0
    resolutions.clear()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")

    def started(*a, **k):
        raise _Started

    monkeypatch.setattr(worker, "_setup", started)
    with pytest.raises(_Started):
        engine.main([str(tmp_path / "p.json"), "--model", "mlp", "--batch-size", "4", "--profile", str(prof),
                     "--out", str(tmp_path / "run")])
    assert len(resolutions) == 1


def test_run_resolves_the_setup_once_before_its_ranks_start(tmp_path, resolutions, monkeypatch, mlp_profile):
    """`run` of a 2-device plan, up to where its 2 ranks would start (a whole run: tests/test_runtime.py)."""
    from workbench.front import running
    from workbench.front.cli import main
    from workbench.profiles import load_profile
    from workbench.schedules.builder import best_schedule

    plan = best_schedule(load_profile(str(mlp_profile)), Target.of(2, bandwidth=DEFAULT_BANDWIDTH), [0, 0, 0, 1, 1])
    plan.to_json(tmp_path / "p.json")

    def started(*a, **k):
        raise _Started

    monkeypatch.setattr(running, "run_and_compare", started)
    with pytest.raises(_Started):
        main(["run", str(tmp_path / "p.json"), "--profile", str(mlp_profile), "--model", "mlp", "--batch-size", "4",
              "--steps", "6", "--out", str(tmp_path / "run")])
    assert len(resolutions) == 1


FULL = {"memory_model": "full", "weights": "single", "optimizer": "sgd", "precision": "bf16", "zero_grad": "none"}


def _options(**given):
    from types import SimpleNamespace

    return SimpleNamespace(**{key: given.get(key) for key, _, _ in SETUP_OPTIONS})


@pytest.mark.parametrize("key,option,value", [("weights", "--weights", "stash"), ("optimizer", "--optimizer", "adam"),
                                              ("zero_grad", "--zero-grad", "zeros")])
def test_a_contradicting_option_names_both_values(key, option, value):
    plan = Plan(1.0, (0,), (), 1, setup=dict(FULL))
    with pytest.raises(ValueError, match=f"{option} {value} contradicts the plan, made with .* {FULL[key]}"):
        TrainingSetup.resolve(_options(**{key: value}), plan)


def test_an_agreeing_option_a_precision_left_open_and_no_plan():
    plan = Plan(1.0, (0,), (), 1, setup=dict(FULL))
    assert TrainingSetup.resolve(_options(weights="single"), plan).weights == "single"
    assert TrainingSetup.resolve(_options(precision="bf16"), Plan(1.0, (0,), (), 1, setup={**FULL, "precision": None}))\
        .precision == "bf16"                                                    # left to the profile: taken
    assert TrainingSetup.resolve(_options(optimizer="adam")).optimizer == "adam"    # no plan: the option is taken
    with pytest.raises(ValueError, match="--weight-factor belongs to the paper"):
        TrainingSetup.resolve(_options(weight_factor=2.0))


def test_a_layout_run_resolves_the_setup_once_before_its_ranks_start(tmp_path, resolutions, monkeypatch, mlp_profile):
    """`run` of a dp 2 layout plan (workbench.parallel.run), up to where its ranks would start."""
    from workbench.front.cli import main
    from workbench.model.layout import Layout
    from workbench.parallel.run import launch
    from workbench.profiles import load_profile
    from workbench.schedules.builder import best_schedule

    plan = best_schedule(load_profile(str(mlp_profile)), Target.of(1, bandwidth=DEFAULT_BANDWIDTH), [0] * 5)
    d = plan.to_dict()
    d["parallel"] = Layout(dp=2).to_dict()
    (tmp_path / "p.json").write_text(json.dumps(d))

    def started(*a, **k):
        raise _Started

    monkeypatch.setattr(launch, "run_layout", started)
    with pytest.raises(_Started):
        main(["run", str(tmp_path / "p.json"), "--profile", str(mlp_profile), "--model", "mlp", "--batch-size", "4",
              "--out", str(tmp_path / "run")])
    assert len(resolutions) == 1 and resolutions[0] is not None
