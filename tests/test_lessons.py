"""viz.lessons: the numbers the notebooks' text states, checked against independent computations (the plan's
own in-flight counts, the checker, brute force over contiguous allocations, sums over a trace's operations)."""

import math

import numpy as np
import pandas as pd
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.model.trace import MEMORY_COLUMNS, Trace
from workbench.planners import plan
from workbench.schedules.simulate import simulate
from workbench.verify.check import check
from workbench.viz.lessons import (
    flush_wait,
    in_flight,
    memory_steps,
    replay_error_ranges,
    same_order,
    stage_names,
    stash_cost,
)
from workbench.viz.notebook import teaching_chain, three_schedules

MiB = 2**20
PAPER = Target.of(4, bandwidth="10GB/s", memory_model="paper")
#: the limits notebook 02 sweeps ("When memory is short")
LIMITS = [None, "700MiB", "420MiB", "350MiB", "290MiB", "250MiB"]


def _trace(rows, devices=1):
    ops = pd.DataFrame([dict(device=d, stage=d, first=d, last=d, kind=k, batch=b, start=s, end=e)
                        for d, k, b, s, e in rows])
    return Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), devices)


def test_in_flight_counts_started_and_unfinished_mini_batches():
    # F0 F1 F2, then B0 ends exactly when F3 starts: B0's end frees its slot first, so never 4
    rows = [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "F", 2, 2, 3), (0, "B", 0, 3, 4), (0, "F", 3, 4, 5),
            (0, "B", 1, 5, 6), (0, "B", 2, 6, 7), (0, "B", 3, 7, 8)]
    assert in_flight(_trace(rows), 0) == 3
    assert in_flight(_trace(rows, devices=2), 1) == 0


def test_in_flight_of_a_simulated_plan_is_the_plans_k():
    """The simulator's trace holds each stage's mini-batches exactly as the plan counts them (rule 7's k)."""
    chain = teaching_chain()
    for limit in (None, "420MiB"):
        p = plan(chain, PAPER.with_(memory=math.inf if limit is None else limit), "dp")
        trace = simulate(p, chain, PAPER, batches=max(s.in_flight for s in p.stages) + 6)
        assert [in_flight(trace, s.device) for s in p.stages] == [s.in_flight for s in p.stages]


def test_flush_wait_by_hand():
    # one device: two forwards, a pause, two backwards
    t = _trace([(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 5, 7), (0, "B", 1, 7, 9)])
    w = flush_wait(t)
    assert (w.held, w.work, w.round_trip, w.idle) == (2, 3.0, 7.0, 3.0)
    assert w.waits_for_round_trip                                 # 7 > 2 micro-batches x 3 of work


def test_1f1b_is_slower_than_gpipe_on_the_teaching_chain_because_of_its_cap():
    """Notebook 02's lesson, independently: GPU 0's idle time from the gaps between its operations."""
    traces = three_schedules(teaching_chain(), PAPER, micro_batches=8)
    gpipe, ofob = traces["GPipe"], traces["1F1B"]
    assert ofob.period > gpipe.period
    for trace in (gpipe, ofob):
        ops = trace.ops[(trace.ops.device == 0) & trace.ops.kind.isin(["F", "B"])].sort_values("start")
        gaps = (ops.start.to_numpy()[1:] - ops.end.to_numpy()[:-1]).clip(min=0).sum()
        assert flush_wait(trace).idle == pytest.approx(gaps)
    assert flush_wait(gpipe).held == 8 and flush_wait(ofob).held == 4
    assert flush_wait(ofob).waits_for_round_trip and not flush_wait(gpipe).waits_for_round_trip
    # with as many micro-batches as GPUs 1F1B's cap never binds, and it is not slower
    few = three_schedules(teaching_chain(), PAPER, micro_batches=4)
    assert few["1F1B"].period <= few["GPipe"].period


@pytest.fixture(scope="module")
def steps():
    return memory_steps(teaching_chain(), PAPER, LIMITS)


def test_every_limit_of_the_sweep_changes_the_plan_and_costs_time(steps):
    assert steps["changed"].iloc[1:].all() and not steps["changed"].iloc[0]
    assert steps["period"].is_monotonic_increasing and steps["period"].is_unique
    assert steps["gpus"].tolist() == [4, 3, 4, 3, 4, 0] and steps["stages"].iloc[-1] == "no plan fits"


def test_each_step_is_valid_and_optimal_against_brute_force(steps):
    chain = teaching_chain()
    for r in steps.itertuples():
        if not r.gpus:
            assert not plan(chain, PAPER.with_(memory=r.limit), "brute", allocation="contiguous").feasible
            continue
        platform = PAPER.with_(memory=r.limit)
        assert not check(r.plan, chain, platform)
        brute = plan(chain, platform, "brute", allocation="contiguous")
        assert r.period == pytest.approx(brute.period, rel=1e-6)
        if r.gpus < PAPER.devices:   # an idle GPU: the same period on fewer GPUs, by brute force too
            fewer = plan(chain, platform.with_(devices=r.gpus), "brute", allocation="contiguous")
            assert fewer.period == pytest.approx(r.period, rel=1e-6)


def test_what_sets_the_period(steps):
    chain = teaching_chain()
    for r in steps[steps["gpus"] > 0].itertuples():
        loads = [chain.stage_costs(s.first, s.last).compute / r.period for s in r.plan.stages]
        assert r.busiest == pytest.approx(max(loads))
        assert (r.limited_by == "compute") == (max(loads) > 1 - 1e-6)
        assert r.limited_by in ("compute", "memory")
    assert steps["bound_by"].iloc[1] == "GPU 1's compute" and steps["stages"].iloc[1] == stage_names(
        steps["plan"].iloc[1], chain) == "conv1–conv2 | conv3–conv4 | conv5–fc8"


def test_stash_cost_counts_k_minus_one_weight_copies():
    ch = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 40 * MiB, 8 * MiB) for i in range(6)), input_bytes=8 * MiB)
    platform = Target.of(3, bandwidth="10GB/s", memory_model="paper")
    df = stash_cost(ch, platform, [None, "400MiB", "300MiB", "60MiB"])
    assert (df["single"] <= df["stash"]).all()
    free = plan(ch, platform.with_(weights="stash"), "dp")
    first = free.stages[0]
    stash_by_hand = (first.in_flight - 1) * ch.stage_costs(first.first, first.last).weights
    assert df["stashed_gpu0"].iloc[0] == pytest.approx(stash_by_hand) and stash_by_hand > 0
    assert math.isinf(df["stash"].iloc[-1])                        # nothing fits in 60 MiB
    assert df["ratio"].iloc[0] == pytest.approx(1.0)


def test_stashing_on_gpt2_small_costs_time_under_a_limit():
    """Notebook 02's weight-stashing lesson: free without a limit, up to twice the period under one."""
    from workbench.profiles import load_profile

    df = stash_cost(load_profile("gpt-small"), Target.of(4, bandwidth="12GB/s", memory_model="paper"),
                    [None, "400MiB"])
    assert df["ratio"].iloc[0] == pytest.approx(1.0) and df["stashed_gpu0"].iloc[0] > 256 * MiB
    assert df["ratio"].iloc[1] > 1.5


def test_replay_error_ranges_per_network():
    df = pd.DataFrame({"run": ["net-P2", "net-P2", "net-P4-ilp", "other-P1"],
                       "predicted_busy": [1.0, 2.0, 4.0, 1.0], "measured_busy": [1.5, 1.0, 4.0, 0.9],
                       "allocator_over_predicted": [1.0, 1.2, 0.8, 2.0]})
    got = replay_error_ranges(df, "network")
    assert got.loc["net"].tolist() == pytest.approx([-0.5, 0.5, 0.8, 1.2])
    assert got.loc["other"].tolist() == pytest.approx([-0.1, -0.1, 2.0, 2.0])
    assert list(replay_error_ranges(df).index) == ["net-P2", "net-P4-ilp", "other-P1"]


def test_the_committed_runs_keep_the_predicted_order():
    """Notebook 05's text: the measured run is the predicted one stretched, in the same order on every device."""
    from workbench.paths import DATA_DIR

    runs = sorted((DATA_DIR / "runs").glob("*-P*/attempt*"))
    assert runs
    for run in runs:
        predicted = Trace.load(run / "predicted.csv")
        measured = Trace.load(run / "measured.csv", source="measured")
        assert all(same_order(predicted, measured)), run
    # and a swapped pair is seen
    swapped = measured.ops.copy()
    i, j = swapped.index[:2]
    swapped.loc[[i, j], "start"] = swapped.loc[[j, i], "start"].to_numpy()
    if not np.isclose(*swapped.loc[[i, j], "start"]) and swapped.loc[i, "device"] == swapped.loc[j, "device"]:
        assert not all(same_order(predicted, Trace(swapped, measured.memory, measured.devices)))
