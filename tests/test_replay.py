"""Isolated replays (runtime/replay.py): each device's program alone, on CPU here.

The replay must run the device's exact program (order, in-flight
mini-batches, weight versions); no messages are exchanged. Its memory is
allocator level (MemTracker on CPU): the parameters and gradient buffers of
the device's stages to the byte, and no less than rule 7. No timing is asserted.
"""

from __future__ import annotations

import math

import pytest

from workbench.model.target import Target
from workbench.runtime.engine import Workload
from workbench.runtime.replay import load_replays, replay_devices, replay_report
from workbench.schedules.program import unroll

STEPS = 6


@pytest.fixture(scope="module")
def mlp():
    from workbench.profiles.profiler import profile_zoo

    return profile_zoo("mlp", 4, repeats=1, warmup=1), Workload.zoo("mlp", 4)


def _weights(wl, first, last):
    model = wl.build()
    return sum(p.numel() * p.element_size() for l in range(first, last + 1) for p in model[l].parameters())


def _check_resident(res, plan, wl, devices):
    """Each replayed device holds its stages' parameters and (zero_grad zeros) gradient buffers, to the byte."""
    for d in devices:
        w = sum(_weights(wl, st.first, st.last) for st in plan.stages if st.device == d)
        b = res.meta["memory_breakdown"][d]
        # parameters: fewer where weight stashing moved the live weights to new storage (filed elsewhere)
        assert b["Parameter"] <= w and b["Gradient"] == w and b["Total"] == res.meta["memory_peak"][d]


def _plan(chain, devices, assignment, loop="zeros"):
    from workbench.schedules.builder import best_schedule

    plan = best_schedule(chain, Target.of(devices, zero_grad=loop), assignment)
    assert plan.feasible
    return plan


def test_replay_runs_each_program_alone_with_rule7_memory(mlp):
    chain, wl = mlp
    plan = _plan(chain, 2, [0, 0, 0, 1, 1])
    assert plan.stages[0].in_flight >= 2
    res = replay_devices(plan, wl, STEPS, device="cpu", timeout=60, zero_grad="zeros")
    ops = res.trace.ops
    assert set(ops["kind"]) == {"F", "B", "step"}       # no send or receive: nothing travels
    steps, backs = ops[ops["kind"] == "step"], ops[ops["kind"] == "B"]
    assert len(steps) == len(backs)                      # one optimizer step inside every backward
    inside = steps.merge(backs, on=["device", "stage", "batch"], suffixes=("", "_b"))
    assert len(inside) == len(steps) and (inside["start"] >= inside["start_b"]).all() \
        and (inside["end"] <= inside["end_b"]).all()
    progs = unroll(plan, STEPS)
    for d in range(2):
        mine = ops[(ops["device"] == d) & ops["kind"].isin(["F", "B"])].sort_values("start")
        assert [(r.stage, r.kind, r.batch) for r in mine.itertuples()] == [(o.stage, o.kind, o.batch)
                                                                          for o in progs[d]]
        assert (mine["start"].to_numpy()[1:] >= mine["end"].to_numpy()[:-1] - 1e-9).all()
    # allocator level: the resident state to the byte, and more than rule 7 counts
    rep = replay_report(plan, chain, res)
    assert list(rep["device"]) == [0, 1]
    _check_resident(res, plan, wl, [0, 1])
    # the memory model's prediction (docs/model.md "Memory") within 5 %, give or take 8 KiB (a tiny model)
    assert ((rep["measured_memory"] - rep["predicted_memory"]).abs() <= 0.05 * rep["predicted_memory"] + 8192).all()
    assert (rep["measured_busy"] > 0).all()
    assert rep["allocator_peak"].isna().all()            # no allocator statistics on the CPU
    assert res.meta["isolated"] is True
    # the forwards alone: part of the busy time; on a CPU the thread's CPU time is (at most) its wall time
    assert ((rep["measured_forward"] > 0) & (rep["measured_forward"] < rep["measured_busy"])).all()
    assert ((rep["forward_cpu"] > 0) & (rep["forward_cpu"] <= rep["measured_forward"] * 1.05 + 1e-4)).all()
    for r in rep.itertuples():
        st = plan.stages[r.device]
        assert r.predicted_forward == pytest.approx(chain.stage_costs(st.first, st.last).forward)


def test_replay_one_device_of_a_noncontiguous_plan(mlp):
    chain, wl = mlp
    plan = _plan(chain, 2, [0, 0, 1, 1, 0])
    res = replay_devices(plan, wl, STEPS, device="cpu", devices=[0], timeout=60, zero_grad="zeros")
    assert set(res.trace.ops["device"]) == {0}
    rep = replay_report(plan, chain, res)
    assert list(rep["device"]) == [0] and rep.loc[0, "stages"] == "0,2"
    _check_resident(res, plan, wl, [0])
    assert abs(rep.loc[0, "measured_memory"] - rep.loc[0, "predicted_memory"]) <= \
        0.05 * rep.loc[0, "predicted_memory"] + 8192
    assert math.isclose(rep.loc[0, "predicted_busy"],
                        chain.stage_costs(0, 1).compute + chain.stage_costs(4, 4).compute)


def test_bf16_replay_holds_half_the_float32_state():
    """Pure bf16 (tiny-gpt: int64 token ids, bf16 everything else): each device alone holds its stages'
    parameters and gradient buffers to the byte, half of float32's."""
    from workbench.profiles.profiler import profile_zoo

    chain = profile_zoo("tiny-gpt", 2, repeats=1, warmup=1, dtype="bfloat16")
    plan = _plan(chain, 2, [0, 0, 1, 1])
    steps = 2 * max(s.in_flight for s in plan.stages)
    runs = {}
    for dtype in ("bfloat16", "float32"):
        wl = Workload.zoo("tiny-gpt", 2, dtype=dtype)
        runs[dtype] = replay_devices(plan, wl, steps, device="cpu", timeout=60, zero_grad="zeros")
        _check_resident(runs[dtype], plan, wl, [0, 1])
    rep = replay_report(plan, chain, runs["bfloat16"])
    # the memory model's prediction (docs/model.md "Memory") within 5 %, give or take 8 KiB (a tiny model)
    assert ((rep["measured_memory"] - rep["predicted_memory"]).abs() <= 0.05 * rep["predicted_memory"] + 8192).all()
    assert (rep["measured_busy"] > 0).all()
    for d in range(2):
        half, full = (runs[t].meta["memory_breakdown"][d] for t in ("bfloat16", "float32"))
        assert 2 * half["Parameter"] == full["Parameter"] and 2 * half["Gradient"] == full["Gradient"]


def test_replay_rejects_bad_devices(mlp):
    chain, wl = mlp
    plan = _plan(chain, 2, [0, 0, 0, 1, 1])
    with pytest.raises(ValueError, match="not devices of the plan"):
        replay_devices(plan, wl, STEPS, device="cpu", devices=[2])


# ---------------------------------------------------------------------------------------------
# the committed H100 runs (data/runs/gpu-h100 in float32, gpu-h100-bf16 in bfloat16, made by
# scripts/gpu_validation.py)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder,dtype", [("gpu-h100", "float32"), ("gpu-h100-bf16", "bfloat16")])
def test_committed_gpu_runs_agree_with_their_profiles_and_the_checker(folder, dtype):
    import pandas as pd

    from workbench.model.plan import Plan
    from workbench.paths import DATA_DIR
    from workbench.profiles import load_profile
    from workbench.runtime.engine import grad_tolerance
    from workbench.verify.check import check

    root = DATA_DIR / "runs" / folder
    reps = load_replays(root)
    val = pd.read_csv(root / "validation.csv").set_index("run")
    assert set(reps["run"]) == set(val.index)
    for name, g in reps[reps["predicted_busy"] > 0].groupby("run"):  # devices with no stage left out
        plan = Plan.from_json((root / "runs" / name / "plan.json").read_text())
        chain = load_profile(f"h100/{val.loc[name, 'profile']}")
        assert "H100" in chain.meta["device"] and chain.meta["loss"].startswith("in the last layer")
        assert chain.meta["dtype"] == dtype and val.loc[name].get("dtype", "float32") == dtype
        platform = Target.of(plan.devices, memory=plan.memory_limit, bandwidth="12GB/s", memory_model="paper")
        assert check(plan, chain, platform) == [], name
        for r in g.itertuples():
            # the replay's prediction is the plan's, on the committed profile
            busy = sum(chain.stage_costs(st.first, st.last).compute for st in plan.stages if st.device == r.device)
            assert r.predicted_busy == pytest.approx(busy, rel=1e-9)
            assert r.predicted_memory == pytest.approx(plan.memory[r.device], rel=1e-9)
            assert r.allocator_peak > 0
        # the runtime holds what rule 7 counts: exactly with one stage per device, at most with several
        assert (g["measured_memory"] <= g["predicted_memory"] * (1 + 1e-9)).all()
        one = g["stages"].astype(str).str.count(",") == 0
        assert (g.loc[one, "memory_error"].abs() < 1e-9).all()
    # all processes on one GPU (gloo, host-staged messages, learning rate 0) against one process
    assert len(val["shared_max_grad_error"].dropna()) >= 5
    assert (val["shared_max_grad_error"].dropna() <= grad_tolerance(dtype)).all()


def test_bf16_profiles_halve_the_float32_bytes():
    """The committed H100 profiles of one network in both dtypes: weights and activations halve exactly;
    saved bytes halve but for what keeps its dtype (max-pool indices, int64 token ids, float32 scalars)."""
    from workbench.profiles import load_profile
    from workbench.profiles.compare import layer_ratios, profile_ratios

    for net in ("resnet50", "resnet101", "vgg16", "gpt-small", "gpt-medium"):
        a, b = load_profile(f"h100/{net}"), load_profile(f"h100/{net}-bf16")
        assert (a.meta["dtype"], b.meta["dtype"]) == ("float32", "bfloat16")
        assert a.meta["model_config"] == b.meta["model_config"] and a.meta["batch_size"] == b.meta["batch_size"]
        r = profile_ratios(a, b)
        assert r["weight_ratio"] == 0.5 and r["activation_ratio"] == 0.5
        assert 0.5 <= r["saved_ratio"] < 0.57, net
        per = layer_ratios(a, b)
        assert (per["saved_ratio"] >= 0.5).all() and (per["saved_ratio"] <= 1.0).all()


def test_run_summary_of_the_committed_runs():
    from workbench.paths import DATA_DIR
    from workbench.runtime.replay import run_summary

    for folder, dtype in [("gpu-h100", "float32"), ("gpu-h100-bf16", "bfloat16")]:
        s = run_summary(DATA_DIR / "runs" / folder)
        reps = load_replays(DATA_DIR / "runs" / folder)
        assert set(s.index) == set(reps["run"]) and (s["dtype"] == dtype).all()
        assert s["memory_exact"].all() and (s["busy_error_min"] <= s["busy_error_max"]).all()
        one = s[s["devices"] == 1]
        assert one["grad_error"].isna().all() and one["fits"].all()   # no limit, no shared run
        assert (s.loc[s["devices"] > 1, "grad_error"] <= s.loc[s["devices"] > 1, "grad_tolerance"]).all()
        r = "resnet50-P4"
        g = reps[(reps["run"] == r) & (reps["predicted_busy"] > 0)]
        assert s.loc[r, "busy_error_max"] == pytest.approx(g["busy_error"].max())
        assert s.loc[r, "fits"] == bool((g["allocator_peak"] <= g["memory_limit"]).all())


def test_replay_chart_draws_every_device():
    from workbench.paths import DATA_DIR
    from workbench.viz.compare import replay_chart

    df = load_replays(DATA_DIR / "runs" / "gpu-h100")
    fig = replay_chart(df)
    assert len(fig.data) == 3 and all(len(t.y) == len(df) for t in fig.data)
    assert list(fig.data[0].x) == pytest.approx(list(df["measured_busy"] / df["predicted_busy"]), nan_ok=True)
    # a device the plan leaves empty (vgg16-P4's GPU 3) is named as idle, not left as a bare row
    idle = [y for y in fig.data[0].y if y.endswith("(no layers: idle)")]
    assert idle == [f"{r} · GPU {d} (no layers: idle)" for r, d in zip(df["run"], df["device"])
                    if df.loc[(df["run"] == r) & (df["device"] == d), "stages"].isna().all()]
    assert "vgg16-P4 · GPU 3 (no layers: idle)" in idle


def test_load_replays_needs_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no runs"):
        load_replays(tmp_path)


def test_run_command_replay(tmp_path, mlp, capsys):
    import pandas as pd

    from workbench.front.cli import main
    from workbench.profiles import write_profile

    chain, _ = mlp
    from workbench.schedules.builder import best_schedule

    write_profile(chain, tmp_path / "mlp.csv")
    plan = best_schedule(chain, Target.of(2, bandwidth="12GB/s"), [0, 0, 0, 1, 1])   # valid for `check` (and run)
    plan.to_json(tmp_path / "plan.json")
    rc = main(["run", str(tmp_path / "plan.json"), "--model", "mlp", "--profile", str(tmp_path / "mlp.csv"),
               "--batch-size", "4", "--steps", "6", "--out", str(tmp_path / "r"), "--replay"])
    assert rc == 0
    rep = pd.read_csv(tmp_path / "r" / "replay.csv")
    assert list(rep["device"]) == [0, 1]
    assert ((rep["measured_memory"] - rep["predicted_memory"]).abs() <= 0.05 * rep["predicted_memory"] + 8192).all()
    assert "replayed alone" in capsys.readouterr().out
    assert not (tmp_path / "r" / "summary.json").exists()   # nothing ran together
