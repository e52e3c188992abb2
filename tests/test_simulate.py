"""The simulator: periods and memory on the trace against the plan and the textbook formulas."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from instances import py_chain, py_contiguous
from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan, stages_of
from workbench.model.target import Target
from workbench.model.trace import MEMORY_COLUMNS, OP_COLUMNS
from workbench.schedules.builder import Scheduler, best_schedule, build_schedule, one_in_flight_memory
from workbench.schedules.simulate import simulate, simulate_flushed
from workbench.verify.check import check


def _rule7_per_device(plan, chain, plat) -> np.ndarray:
    return np.array(plan.memory)


def _plans(seed: int):
    """A random valid plan (contiguous or general, at a random period or the best one) and its instance."""
    rng = random.Random(seed)
    L, P = rng.randint(2, 8), rng.randint(2, 4)
    chain = py_chain(rng, L)
    general = seed % 2 == 1
    assign = [rng.randrange(P) for _ in range(L)] if general else py_contiguous(rng, L, P)
    plat = Target.of(P, bandwidth=rng.choice([math.inf, 4.0, 20.0]), weights=rng.choice(["stash", "single"]),
                    weight_factor=rng.choice([1.0, 4.0]), memory_model="paper")
    sch = Scheduler(chain, plat, assign)
    if rng.random() < 0.5:
        plan = build_schedule(chain, plat, assign, sch.load_period * rng.uniform(1.0, 2.0))
    else:
        lim = max(one_in_flight_memory(chain, plat, assign)) * rng.uniform(1.0, 1.6)
        plat = plat.with_(memory=lim)
        plan = best_schedule(chain, plat, assign)
    assert check(plan, chain, plat) == []
    return chain, plat, plan


@pytest.mark.parametrize("seed", range(30))
def test_periodic_trace_runs_as_planned(seed):
    chain, plat, plan = _plans(seed)
    N = 25
    trace = simulate(plan, chain, plat, batches=N)
    assert list(trace.ops.columns) == OP_COLUMNS and list(trace.memory.columns) == MEMORY_COLUMNS + ["transient"]
    assert trace.meta["max_delay"] == pytest.approx(0.0, abs=1e-9 * plan.period)
    # steady period measured on the trace = the plan's period
    assert trace.steady_period() == pytest.approx(plan.period, rel=1e-9)
    # every stage's forward and backward of batch i at the plan's start + i*T
    ops = trace.ops
    for s, st in enumerate(plan.stages):
        for kind, t0 in (("F", st.fwd_start), ("B", st.bwd_start)):
            sel = ops[(ops.stage == s) & (ops.kind == kind)].sort_values("batch")
            assert sel["batch"].tolist() == list(range(N))
            assert np.allclose(sel["start"].to_numpy(), t0 + plan.period * np.arange(N))
            assert (sel["device"] == st.device).all()
    # the trace's peak memory: equal to rule 7 on one-stage devices, never above it
    peak = trace.peak_memory()
    per_dev = {}
    for st in plan.stages:
        per_dev[st.device] = per_dev.get(st.device, 0) + 1
    for p in range(plat.devices):
        assert peak[p] <= plan.memory[p] * (1 + 1e-9)
        if per_dev.get(p) == 1:
            assert peak[p] == pytest.approx(plan.memory[p], rel=1e-9)


def test_no_two_operations_of_a_device_overlap_on_the_trace():
    for seed in range(10):
        chain, plat, plan = _plans(seed)
        ops = simulate(plan, chain, plat, batches=15).ops
        comp = ops[ops.kind.isin(["F", "B"]) & (ops.end > ops.start)]
        for _, g in comp.groupby("device"):
            g = g.sort_values("start")
            assert (g["start"].to_numpy()[1:] >= g["end"].to_numpy()[:-1] - 1e-9 * plan.period).all()


def test_memory_rows_are_a_step_function_with_stashed_versions():
    # The hand instance of tests/test_check.py: k = 3, 2, 1; A = 20, W = 200 per stage.
    chain = Chain(tuple(Layer(f"l{i}", 1e-3, 2e-3, 100, 10) for i in range(6)), input_bytes=10)
    plat = Target.of(3, memory=1000, bandwidth=20000, memory_model="paper")
    plan = build_schedule(chain, plat, [0, 0, 1, 1, 2, 2], 8e-3)
    trace = simulate(plan, chain, plat, batches=12)
    mem = trace.memory
    assert np.allclose(mem["total"], mem["activations"] + mem["weights"])
    for p, g in mem.groupby("device"):
        assert (np.diff(g["time"].to_numpy()) > 0).all()
        assert g["activations"].iloc[-1] == 0  # drained
    d0 = mem[mem.device == 0]
    assert d0["activations"].max() == 60 and d0["weights"].max() == 200 + 2 * 200
    assert d0["weights"].min() == 200
    single = simulate(plan, chain, plat.with_(weights="single"), batches=12)
    assert single.peak_memory().tolist() == [260, 240, 220]
    sends = trace.ops[trace.ops.kind == "send"]
    assert len(sends) == 12 * 4 and np.allclose(sends["end"] - sends["start"], 0.5e-3)


def test_an_invalid_plan_slips_on_the_trace():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 1, 1) for i in range(4)))
    plat = Target.of(2, memory_model="paper")
    # backward of stage 0 overlaps its forward modulo T = 6
    plan = make_plan(chain, plat, 6.0, [0, 0, 1, 1], [0.0, 2.0], [7.0, 4.0])
    assert any(v.rule == 5 for v in check(plan, chain, plat))
    trace = simulate(plan, chain, plat, batches=10)
    assert trace.meta["max_delay"] > 0


def _uniform_chain(S: int, F: float, B: float, A: float) -> Chain:
    return Chain(tuple(Layer(f"l{i}", F, B, 10, A) for i in range(S)), input_bytes=A)


@pytest.mark.parametrize("m", [1, 2, 4, 7])
@pytest.mark.parametrize("S", [1, 2, 4])
def test_flushed_textbook_activations_and_makespan(m, S):
    chain = _uniform_chain(S, 1.0, 2.0, 3.0)
    plat = Target.of(S, memory_model="paper")
    assign = list(range(S))
    g = simulate_flushed(chain, plat, assign, m, kind="gpipe")
    o = simulate_flushed(chain, plat, assign, m, kind="1f1b")
    for s in range(S):
        acts_g = g.memory[g.memory.device == s]["activations"].max()
        acts_o = o.memory[o.memory.device == s]["activations"].max()
        assert acts_g == pytest.approx(m * 3.0)
        assert acts_o == pytest.approx(min(m, S - s) * 3.0)
    # both run (m + S - 1) forwards and backwards slots on identical stages
    assert g.makespan == pytest.approx((m + S - 1) * 3.0)
    assert o.makespan == pytest.approx((m + S - 1) * 3.0)
    assert g.period == pytest.approx(g.makespan / m)
    assert g.peak_memory()[0] == pytest.approx(m * 3.0 + 10)


@pytest.mark.parametrize("seed", range(10))
def test_flushed_random_stages_hold_the_textbook_counts(seed):
    rng = random.Random(seed)
    L, P = rng.randint(2, 8), rng.randint(2, 4)
    chain = py_chain(rng, L)
    assign = py_contiguous(rng, L, P)
    plat = Target.of(P, bandwidth=rng.choice([math.inf, 5.0]), weight_factor=2.0, memory_model="paper")
    runs = stages_of(assign)
    S = len(runs)
    m = rng.randint(1, 6)
    for kind in ("gpipe", "1f1b"):
        t = simulate_flushed(chain, plat, assign, m, kind=kind, flushes=2)
        assert sorted(t.ops[t.ops.kind == "F"]["batch"].unique()) == list(range(2 * m))
        assert t.period == pytest.approx(t.makespan / (2 * m))
        for s, (a, b) in enumerate(runs):
            c = chain.stage_costs(a, b)
            n = m if kind == "gpipe" else min(m, S - s)
            p = assign[a]
            assert t.peak_memory()[p] == pytest.approx(n * c.saved + 2.0 * c.weights)
        # dependencies hold: stage s+1's forward of j starts after stage s's forward of j plus the transfer
        ops = t.ops
        for s in range(S - 1):
            cs = chain.stage_costs(*runs[s], plat).comm
            f0 = ops[(ops.stage == s) & (ops.kind == "F")].set_index("batch")["end"]
            f1 = ops[(ops.stage == s + 1) & (ops.kind == "F")].set_index("batch")["start"]
            assert (f1 >= f0 + cs - 1e-9).all()


def test_simulate_dispatches_flushed_plans():
    chain = _uniform_chain(3, 1.0, 2.0, 3.0)
    plat = Target.of(3, memory_model="paper")
    plan = make_plan(chain, plat, 4.5, [0, 1, 2], [0, 0, 0], [0, 0, 0]).with_(schedule="1f1b", micro_batches=4)
    t = simulate(plan, chain, plat, batches=8)
    assert t.meta["flushes"] == 2 and t.meta["schedule"] == "1f1b"
    with pytest.raises(ValueError, match="micro_batches"):
        simulate(plan.with_(micro_batches=None), chain, plat)


def _good_plan():
    chain = _uniform_chain(4, 1.0, 2.0, 3.0)
    plat = Target.of(4, memory_model="paper")
    return chain, plat, build_schedule(chain, plat, [0, 1, 2, 3], 3.0)


def _with_stage(plan, i, **kw):
    from dataclasses import replace

    st = list(plan.stages)
    st[i] = replace(st[i], **kw)
    return plan.with_(stages=tuple(st))


def _with_device(plan, i, d):
    a = list(plan.assignment)
    a[plan.stages[i].first:plan.stages[i].last + 1] = [d] * (plan.stages[i].last - plan.stages[i].first + 1)
    return _with_stage(plan, i, device=d).with_(assignment=tuple(a))


@pytest.mark.parametrize("spoil,pattern", [
    (lambda p: p.with_(period=-1.0), r"period must be positive and finite, got -1\.0"),
    (lambda p: _with_device(p, 0, -1), r"layer 0 .* is on device -1, not one of 0\.\.3"),
    (lambda p: _with_device(p, 3, 7), r"layer 3 .* is on device 7, not one of 0\.\.3"),
    (lambda p: _with_device(p, 1, 1.5), r"is on device 1\.5, not one of 0\.\.3"),
    (lambda p: _with_stage(p, 2, fwd_start=math.nan), r"stage 2 has a non-finite start time"),
    (lambda p: p.with_(assignment=p.assignment[:-1]), r"the assignment has 3 entries for a chain of 4 layers"),
])
def test_simulate_refuses_a_plan_that_breaks_the_structural_rules(spoil, pattern):
    from workbench.verify.check import PlanStructureError

    chain, plat, plan = _good_plan()
    simulate(plan, chain, plat, batches=4)
    with pytest.raises(PlanStructureError, match=pattern) as e:
        simulate(spoil(plan), chain, plat, batches=4)
    assert str(e.value).startswith("cannot simulate this plan") and e.value.violations
def test_policies_run_as_planned_with_recompute_inside_the_backward():
    """A plan with recompute and offload: the trace keeps the plan's period and memory; each R operation lies
    inside its stage's backward and lasts that layer's forward; host transfers fit the gap (rule 8)."""
    from workbench.model.activations import apply_policies
    from workbench.planners import plan as run_planner

    chain = Chain(tuple(Layer(f"l{i}", 0.5 + 0.1 * i, 1.0, 10, 40, 200) for i in range(6)), input_bytes=40)
    plat = Target.of(3, optimizer="sgd", host_bandwidth=400)
    pol = ("recompute", "offload", "keep", "recompute", "offload", "keep")
    p = run_planner(chain, plat, "dp", activations=pol)
    tr = simulate(p, chain, plat, batches=8)
    assert tr.meta["max_delay"] == 0 and tr.steady_period() == pytest.approx(p.period)
    assert tr.peak_memory().tolist() == pytest.approx(list(p.memory))
    ops = tr.ops
    eff = apply_policies(chain, pol)
    for _, r in ops[ops.kind == "R"].iterrows():
        b = ops[(ops.kind == "B") & (ops.stage == r.stage) & (ops.batch == r.batch)].iloc[0]
        assert b.start - 1e-12 <= r.start and r.end <= b.end + 1e-12
    rec = ops[ops.kind == "R"].assign(d=lambda o: o.end - o.start).groupby(["stage", "batch"]).d.sum()
    for (stage, _), total in rec.items():
        s = p.stages[int(stage)]
        assert total == pytest.approx(sum(chain[l].forward for l in range(s.first,
                                                                          s.last + 1) if pol[l] == "recompute"))
    n_rc = sum(1 for s in p.stages for l in range(s.first, s.last + 1) if pol[l] == "recompute")
    assert len(ops[ops.kind == "R"]) == n_rc * 8
    host = ops[ops.kind.isin(["offload", "prefetch"])]
    assert len(host) and (host.end - host.start).min() > 0
    assert eff[3].backward == pytest.approx(chain[3].backward + chain[3].forward)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_the_steady_period_of_a_flushed_plan_is_its_plans_period(kind):
    """Issue 25: resnet50, 16 batches on 4 devices: simulate reported GPipe's stage-0 forward spacing (319 ms),
    below the lower bound, for a plan of 961.84 ms per micro-batch; the flushed run's period is its makespan
    over its micro-batches, which the plan records."""
    from workbench.planners import plan
    from workbench.profiles import load_profile

    chain = load_profile("resnet50")
    plat = Target.of(4, bandwidth="12GB/s")
    p = plan(chain, plat, kind)
    for batches in (16, 32):
        trace = simulate(p, chain, plat, batches=batches)
        assert trace.steady_period() == pytest.approx(p.period, rel=1e-12)
        assert trace.steady_period() >= p.lower_bound
