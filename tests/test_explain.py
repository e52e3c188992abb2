"""workbench.model.explain: a plan says why devices are idle and why memory sets its period (issue 39: a
64-GPU plan left GPUs idle without a word; gpt-small on 4 GPUs at 1 GiB ran at the one-device period, "optimal",
without saying why)."""

from __future__ import annotations

import dataclasses
import json

from workbench.front.cli import main
from workbench.model.chain import Chain, Layer
from workbench.model.explain import IDLE, MEMORY, explain, idle_note, memory_note
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.profiles import load_profile
from workbench.verify.check import check


def test_gpt_small_at_1gib_says_memory_sets_the_one_device_period(tmp_path, capsys):
    """The plan's period is a mini-batch's whole round trip (every stage holds one); the note names the stage
    that cannot hold a second, and that is so: the checker (which re-derives memory from docs/model.md) rejects
    the plan with that stage holding two; the remedy it names (one weight version) is faster."""
    chain = load_profile("gpt-small")
    platform = Target.of(4, memory="1GiB", bandwidth="12GB/s")
    plan = run_planner(chain, platform, "dp")
    assert plan.status == "optimal" and all(st.in_flight == 1 for st in plan.stages)
    note = memory_note(plan, chain, platform)
    assert note.startswith(f"{MEMORY} stage 0 (layers 0-0, GPU0) holds 1 mini-batch in flight, and 2 would need")
    assert "the split only makes the model fit" in note and "--weights single" in note
    two = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], in_flight=2),) + plan.stages[1:])
    assert any(v.rule == 7 and v.device == 0 for v in check(two, chain, platform))
    single = run_planner(chain, platform.with_(weights="single"), "dp")
    assert single.period < plan.period / 2
    assert main(["plan", "--profile", "gpt-small", "--devices", "4", "--memory", "1GiB",
                 "--json", str(tmp_path / "p.json")]) == 0
    assert f"  {note}" in capsys.readouterr().out
    assert note in json.loads((tmp_path / "p.json").read_text())["notes"]


def test_idle_devices_are_said_with_the_reason(tmp_path, capsys):
    """Llama-3-70B (fake profile, H100s) on 64 GPUs: dp's optimum leaves two idle; a chain of 3 layers on 5
    devices leaves 2; a plan that uses every device says nothing."""
    chain = load_profile("fake/llama3-70b-h100-sxm")
    argv = ["plan", "--profile", "fake/llama3-70b-h100-sxm", "--devices", "64", "--gpu", "h100-sxm",
            "--json", str(tmp_path / "p.json")]
    assert main(argv) == 0
    d = json.loads((tmp_path / "p.json").read_text())
    used = {s["device"] for s in d["stages"]}
    idle = [n for n in d["notes"] if n.startswith(IDLE)]
    assert len(used) < 64 and len(idle) == 1
    assert idle[0].startswith(f"{IDLE} {64 - len(used)} of 64 (GPU{min(set(range(64)) - used)}")
    assert f"  {idle[0]}" in capsys.readouterr().out
    assert len(chain) > 64 and "no plan of this method that uses them is faster" in idle[0]
    small = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 4) for i in range(3)))
    plan = run_planner(small, Target.of(5), "dp")
    assert idle_note(plan, small) == f"{IDLE} 2 of 5 (GPU3, GPU4) hold no stage: the chain has only 3 layers, one a " \
                                     "device at most"
    big = Chain(tuple(Layer(f"l{i}", f, 2 * f, 10, 4) for i, f in enumerate([10, 1, 1, 1, 1, 1])))
    assert idle_note(run_planner(big, Target.of(4), "dp"), big) == (
        f"{IDLE} 2 of 4 (GPU2, GPU3) hold no stage: the period is already the largest layer's time (30.000 s): no "
        "plan goes below it, with more stages or not")
    full = run_planner(small, Target.of(3), "dp")
    assert explain(full, small, Target.of(3)) == full
