"""Flushed plans run on torch.distributed (gloo, CPU): torch's multi-stage schedules with torch's own schedule
classes, GPipe and 1F1B in the workbench's order. A run's ``steps`` counts mini-batches: two optimizer steps of the
plan's micro-batches each run the plan's order, the gradients summed over both equal one process's, every rank's
peak (MemTracker) is within 5 % of the prediction and never more than 2 % above it; a count that leaves a partial
step is refused in one line before any rank starts.

No timing is asserted (the machine is shared). ``benchmarks/memory.py --schedules`` runs the same on larger models.
"""

from __future__ import annotations

import pytest

from workbench.methods import METHODS
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.runtime.engine import Workload, grad_error, reference_gradients, run_plan
from workbench.schedules.order_memory import engine_extra
from workbench.schedules.torch_orders import torch_order

SCHEDULES = [m.name for m in METHODS if m.torch_class]
TIMEOUT = 120


@pytest.fixture(scope="module")
def gpt():
    """A GPT of 4 (2 ranks) or 6 (4 ranks) blocks, width 64: its profile (split measured) and workload."""
    from workbench.profiles.profiler import profile_zoo

    out = {}
    for P, layers in ((2, 4), (4, 6)):
        cfg = {"layers": layers, "d_model": 64, "heads": 2, "seq_len": 64, "vocab": 1024}
        out[P] = (profile_zoo("gpt", 2, repeats=1, warmup=0, **cfg), Workload.zoo("gpt", 2, **cfg))
    return out


def _run_and_check(chain, wl, P: int, name: str):
    platform = Target.of(P, weights="single", optimizer="adam")
    plan = run_planner(chain, platform, name, micro_batches=2 * P)
    assert plan.fits and not plan.extra.get("violations")
    m = plan.micro_batches
    res = run_plan(plan, wl, 2 * m, weights="single", chain=chain, platform=platform, optimizer="adam",
                   timeout=TIMEOUT)
    assert res.meta["engine"] == "torch" and res.meta["optimizer_steps"] == [2] * P
    # every rank ran torch's order (the class computed it itself) in each of the two steps, one operation at a time
    _check_two_steps(res, torch_order(name, P, len(plan.stages) // P, m), m)
    assert grad_error(res.grads, reference_gradients(wl, 2 * m))[1] < 1e-6
    extra = engine_extra(plan, chain, platform, m)
    for d in range(P):
        predicted, measured = plan.memory[d] + extra[d], res.meta["memory_peak"][d]
        assert -0.02 <= predicted / measured - 1 <= 0.05, (name, d, predicted, measured)
    return plan, res


def _check_two_steps(res, order, m: int) -> None:
    """Each device ran ``order`` (its operations of one flush) on mini-batches 0..m-1, then on m..2m-1."""
    comp = res.trace.ops[res.trace.ops["kind"].isin(["F", "B", "I", "W"])]
    for d, ops in order.items():
        mine = comp[comp["device"] == d].sort_values("start")
        assert [f"{r.stage}{r.kind}{r.batch}" for r in mine.itertuples()] == \
            [f"{a.stage}{a.kind}{a.batch + k * m}" for k in (0, 1) for a in ops]


@pytest.mark.parametrize("name", SCHEDULES)
def test_two_ranks(gpt, name):
    chain, wl = gpt[2]
    _run_and_check(chain, wl, 2, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["interleaved-zb", "zbv"])
def test_four_ranks(gpt, name):
    """Four ranks: the looped layout's zero bubble, and the V whose last device holds the two middle stages."""
    chain, wl = gpt[4]
    plan, _ = _run_and_check(chain, wl, 4, name)
    assert len({s.device for s in plan.stages}) == 4


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_run_two_optimizer_steps_of_their_micro_batches(gpt, name):
    """6 mini-batches of a plan of 3 micro-batches: two flushes, each the plan's order on its own micro-batches,
    an optimizer step after each (torch's engine used to run them as one step, or crash on a count that is not
    a multiple); the gradients summed over both steps are one process's; memory as one step's prediction."""
    from workbench.schedules.program import flush_order

    chain, wl = gpt[2]
    platform = Target.of(2, weights="single", optimizer="adam")
    plan = run_planner(chain, platform, name, micro_batches=3)
    res = run_plan(plan, wl, 6, weights="single", optimizer="adam", timeout=TIMEOUT)
    assert res.meta["engine"] == "torch" and res.meta["optimizer_steps"] == [2, 2]
    _check_two_steps(res, flush_order(name, [s.device for s in plan.stages], 3), 3)
    assert grad_error(res.grads, reference_gradients(wl, 6))[1] < 1e-6
    extra = engine_extra(plan, chain, platform, 3)
    for d in range(2):
        predicted, measured = plan.memory[d] + extra[d], res.meta["memory_peak"][d]
        assert -0.02 <= predicted / measured - 1 <= 0.05, (name, d, predicted, measured)


@pytest.mark.parametrize("name", ["gpipe", "zbv"])
def test_a_partial_optimizer_step_is_refused_in_one_line_before_any_rank(gpt, name):
    """4 mini-batches of a plan of 3 micro-batches leave a step of 1: refused naming the counts that run (torch's
    engine raised torch's AssertionError in a rank for GPipe and 1F1B)."""
    chain, wl = gpt[2]
    plan = run_planner(chain, Target.of(2, weights="single"), name, micro_batches=4 if name == "zbv" else 3)
    m = plan.micro_batches
    with pytest.raises(ValueError, match=rf"partial step of 1; run --steps {m} \(1 step\) or {2 * m} \(2 steps\)"):
        run_plan(plan, wl, m + 1, weights="single", timeout=TIMEOUT)


def test_run_counts_mini_batches_for_every_flushed_plan(gpt, tmp_path, capsys):
    """`run` as a user types it: a GPipe plan of 3 micro-batches at the default --steps (torch's AssertionError
    "Got 21 ... microbatches" before) and a zbv plan of 4 at --steps 8 (refused before: "run it with --steps 4")
    run whole optimizer steps and say how many; neither says its plan "was made on another one" (run compared
    the plan on infinitely fast links); a count that leaves a partial step is one error line, exit 2."""
    import json

    from workbench.front.cli import main
    from workbench.profiles import write_profile

    chain, _ = gpt[2]
    prof = tmp_path / "gpt.csv"
    write_profile(chain, prof)
    for name, m, steps, said in (("gpipe", 3, [], "21 mini-batches of 2 (7 optimizer steps of 3)"),
                                 ("zbv", 4, ["--steps", "8"], "8 mini-batches of 2 (2 optimizer steps of 4)")):
        plan = tmp_path / f"{name}.json"
        assert main(["plan", "--profile", str(prof), "--devices", "2", "--method", name, "--micro-batches", str(m),
                     "--weights", "single", "--json", str(plan), "-q"]) == 0
        out = tmp_path / name
        capsys.readouterr()
        assert main(["run", str(plan), "--profile", str(prof), "--out", str(out)] + steps) == 0, name
        text = capsys.readouterr().out
        assert said in text and "made on another one" not in text, text
        s = json.loads((out / "summary.json").read_text())
        assert (s["optimizer_steps"], s["mini_batches_per_step"]) == (int(said.split()[4].strip("(")), m)
        assert s["max_grad_error"] < 1e-6 and all(s["steady_state"])
    assert main(["run", str(tmp_path / "gpipe.json"), "--profile", str(prof), "--steps", "4",
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --steps 4: a gpipe plan runs 3 micro-batches"), err


def test_the_pipedream_engine_and_a_replay_refuse_a_split_backward_in_one_line(gpt):
    """The PipeDream engine runs each backward whole: `run --engine pipedream` and `run --replay` of a zbv plan
    ended in a KeyError traceback in a rank; both are refused before any process starts."""
    from workbench.runtime.replay import replay_devices

    chain, wl = gpt[2]
    plan = run_planner(chain, Target.of(2, weights="single"), "zbv", micro_batches=4)
    with pytest.raises(ValueError, match="the PipeDream engine runs each backward whole; a zbv plan splits it"):
        run_plan(plan, wl, 4, weights="single", engine="pipedream", timeout=TIMEOUT)
    with pytest.raises(ValueError, match="a replay .* runs each backward whole"):
        replay_devices(plan, wl, 4, weights="single", timeout=TIMEOUT)
