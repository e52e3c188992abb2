"""workbench.runtime.session: what `run` and the torchrun entry check before a run and conclude after it."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.model.training_setup import TrainingSetup
from workbench.planners import plan as run_planner
from workbench.runtime.session import check_plan_valid, platform_for_run


def _chain(n: int = 4) -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1e-3 * (i + 1), 2e-3 * (i + 1), 1e3, 4e3, 1e5) for i in range(n)))


def test_a_plan_the_checker_rejects_is_refused_naming_the_rule():
    chain, platform = _chain(), Target.of(2, optimizer="sgd")
    plan = run_planner(chain, platform, "dp")
    check_plan_valid(plan, chain, platform)                               # the planner's own plan passes
    fast = dataclasses.replace(plan, period=plan.period / 10)              # a hand-edited period no device keeps
    with pytest.raises(ValueError, match=r"plan.json breaks \d+ validity rule\(s\).*first: .*nothing was run"):
        check_plan_valid(fast, chain, platform, where="plan.json")


def test_the_run_platform_is_the_plans_memory_setup():
    chain = _chain()
    plan = run_planner(chain, Target.of(2, memory=1e9, optimizer="sgd", precision="bf16"), "dp")
    p = platform_for_run(plan)
    assert (p.devices, p.memory) == (2, 1e9)
    assert p.setup == TrainingSetup(optimizer="sgd", precision="bf16")
    assert platform_for_run(plan, optimizer="adam", weights="single").setup.optimizer == "adam"
    paper = run_planner(chain, Target.of(2, memory_model="paper", weight_factor=3.0), "dp")
    assert platform_for_run(paper).setup.memory_model == "paper" and platform_for_run(paper).setup.weight_factor == 3.0


@pytest.mark.parametrize("name", ["zbv", "1f1b"])
def test_the_run_platform_has_the_links_the_plan_was_made_on(name):
    """A flushed plan's period is its schedule's makespan on the plan's links: `run` compared it on infinitely
    fast ones and said a zbv plan, on the very profile it was made from, "was made on another one". Its links are
    check's: the plan's (its GPU's and nodes'), else 12GB/s (`plan`'s default, which the plan does not record)."""
    from workbench.verify.check import check

    chain = _chain()
    plan = run_planner(chain, Target.of(2, weights="single", bandwidth="12GB/s"), name, micro_batches=4)
    assert plan.feasible and check(plan, chain, platform_for_run(plan)) == []
    assert platform_for_run(plan).bandwidth == 12e9 and platform_for_run(plan, bandwidth="1GB/s").bandwidth == 1e9
    nodes = run_planner(_chain(8), Target.of(4, weights="single", gpu="h100-sxm", bandwidth="450GB/s",
                                            devices_per_node=2, node_bandwidth="25GB/s"), name, micro_batches=4)
    p = platform_for_run(nodes)
    assert (p.bandwidth, p.devices_per_node, p.node_bandwidth) == (450e9, 2, 25e9)
    assert nodes.feasible and check(nodes, _chain(8), p) == []


def test_the_torchrun_entry_refuses_bad_input_with_one_line_before_any_rank_works(tmp_path, monkeypatch, capsys):
    """A plan `check` rejects, and a plan for another world size: exit 2, one `error:` line, no process group."""
    from workbench.front.cli import main as cli
    from workbench.runtime import engine

    prof = tmp_path / "mlp.csv"
    assert cli(["profile", "--model", "mlp", "--batch-size", "4", "--repeats", "1", "--warmup", "0",
                "--out", str(prof)]) == 0
    assert cli(["plan", "--profile", str(prof), "--devices", "1", "--json", str(tmp_path / "p.json")]) == 0
    text = (tmp_path / "p.json").read_text()
    import json

    d = json.loads(text)
    d["period"] = d["period"] / 100
    (tmp_path / "bad.json").write_text(json.dumps(d))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr("torch.distributed.init_process_group", lambda *a, **k: pytest.fail("a rank started"))
    capsys.readouterr()
    argv = ["--model", "mlp", "--batch-size", "4", "--profile", str(prof), "--out", str(tmp_path / "run")]
    assert engine.main([str(tmp_path / "bad.json"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "validity rule" in err[0]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert engine.main([str(tmp_path / "p.json"), *argv]) == 2
    assert "torchrun started 2 ranks" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
