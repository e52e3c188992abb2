"""Where a measured period goes: parts computed by hand on a made-up trace, and the identities a real run keeps."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan
from workbench.model.target import Target
from workbench.model.trace import MEMORY_COLUMNS, OP_COLUMNS, Trace
from workbench.runtime.period_budget import CPU_PARTS, PARTS, per_operation, period_budget
from workbench.runtime.rank import CPU_COLUMNS

# two stages on two devices; every period of 10 s (times in seconds, made up so that each part is known):
#   device 0: F [0, 2] (CPU 1.5, thread clock 0), send [2, 2.5] (CPU 0.25), gap 0.5 (CPU 0.2),
#             recv [3, 4] (CPU 0), B [4, 8] (CPU 3.5, of which step 1.0 at [7, 8]), gap 2 (CPU 0.3)
#   device 1: recv [0, 2.5], F [2.5, 4.5] (CPU 2), B [4.5, 7.5] (CPU 3, step 0.5), send [7.5, 8] (CPU 0.5),
#             gap 2 (CPU 0)
PERIOD = 10.0


def _rows(i):
    t, c0, c1 = PERIOD * i, 5.75 * i, 5.5 * i       # each device's thread clock advances by its CPU per period
    ops = [(0, 0, "F", t, t + 2), (0, 0, "send", t + 2, t + 2.5), (0, 0, "recv", t + 3, t + 4),
           (0, 0, "B", t + 4, t + 8), (0, 0, "step", t + 7, t + 8),
           (1, 1, "recv", t, t + 2.5), (1, 1, "F", t + 2.5, t + 4.5), (1, 1, "B", t + 4.5, t + 7.5),
           (1, 1, "step", t + 7, t + 7.5), (1, 1, "send", t + 7.5, t + 8)]
    cpu = [(0, 0, "F", 1.5, c0), (0, 0, "send", 0.25, c0 + 1.5), (0, 0, "recv", 0.0, c0 + 1.95),
           (0, 0, "B", 3.5, c0 + 1.95), (0, 0, "step", 1.0, c0 + 4.45),
           (1, 1, "recv", 0.0, c1), (1, 1, "F", 2.0, c1), (1, 1, "B", 3.0, c1 + 2.0), (1, 1, "step", 0.5, c1 + 4.5),
           (1, 1, "send", 0.5, c1 + 5.0)]
    return ([(d, s, s, s, k, i, a, b) for d, s, k, a, b in ops], [(d, s, k, i, c, c0_) for d, s, k, c, c0_ in cpu])


def _made_up(batches=6):
    ch = Chain((Layer("a", 1.0, 2.5, 0, 8), Layer("b", 1.5, 2.0, 0, 8)))
    plan = make_plan(ch, Target.of(2), PERIOD, [0, 1], [0.0, 2.5], [6.5, 4.5])
    rows = [_rows(i) for i in range(batches)]
    ops = pd.DataFrame([r for o, _ in rows for r in o], columns=OP_COLUMNS)
    cpu = pd.DataFrame([r for _, c in rows for r in c], columns=CPU_COLUMNS)
    return ch, plan, Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), 2, source="measured"), cpu


def test_each_part_is_what_the_made_up_run_spent():
    ch, plan, trace, cpu = _made_up()
    b = period_budget(plan, ch, trace, cpu, warmup=1)
    assert b.attrs["measured_period"] == pytest.approx(PERIOD) and b.attrs["periods"] == 4
    want = {0: {"profile": 3.5, "engine": 1.5 - 1.0 + 3.5 - 1.0 - 2.5, "optimizer step": 1.0, "sending": 0.25,
                "between operations": 0.2 + 0.3, "waiting for a core": (2 - 1.5) + (4 - 3.5) + 0.25 + (2.5 - 0.5),
                "waiting for messages": 1.0},
            1: {"profile": 3.5, "engine": 2.0 - 1.5 + 3.0 - 0.5 - 2.0, "optimizer step": 0.5, "sending": 0.5,
                "between operations": 0.0, "waiting for a core": 0.0 + 0.0 + 0.0 + 2.0, "waiting for messages": 2.5}}
    for d, parts in want.items():
        for part, value in parts.items():
            assert b.loc[d, part] == pytest.approx(value, abs=1e-9), (d, part)
        assert b.loc[d, "layers now"] == 0 and b.loc[d, "as one stage"] == 0
    assert b.sum(axis=1).tolist() == pytest.approx([PERIOD, PERIOD])
    ops = per_operation(b)
    assert ops["operations per period"].tolist() == pytest.approx([2.0, 2.0])
    assert ops.loc[0, "optimizer step"] == pytest.approx(0.5)


def test_the_layers_timed_again_and_as_one_stage_come_out_of_the_engines_part():
    ch, plan, trace, cpu = _made_up()
    alone = Chain((Layer("a", 0.75, 2.0, 0, 8), Layer("b", 1.5, 2.0, 0, 8)))     # stage 0 faster now by 0.75 s
    b = period_budget(plan, ch, trace, cpu, warmup=1, alone=alone, stages_alone=[(1.0, 2.25), (1.5, 2.0)])
    plain = period_budget(plan, ch, trace, cpu, warmup=1)
    assert b.loc[0, "layers now"] == pytest.approx(-0.25 - 0.5)
    assert b.loc[0, "as one stage"] == pytest.approx(0.25 + 0.25)
    assert b.loc[0, "engine"] == pytest.approx(plain.loc[0, "engine"] + 0.75 - 0.5)
    assert b.loc[1, ["layers now", "as one stage"]].tolist() == [0, 0]
    assert (b.sum(axis=1) - plain.sum(axis=1)).abs().max() < 1e-9


def test_what_it_refuses():
    ch, plan, trace, cpu = _made_up()
    with pytest.raises(ValueError, match="no CPU times"):
        period_budget(plan, ch, trace, pd.DataFrame(columns=CPU_COLUMNS))
    with pytest.raises(ValueError, match="cpu_start"):
        period_budget(plan, ch, trace, cpu.drop(columns="cpu_start"))
    with pytest.raises(ValueError, match="lack some operations"):
        period_budget(plan, ch, trace, cpu[cpu["kind"] != "send"])
    with pytest.raises(ValueError, match="stage times"):
        period_budget(plan, ch, trace, cpu, stages_alone=[(1.0, 1.0)])
    with pytest.raises(ValueError, match="layers"):
        period_budget(plan, ch, trace, cpu, alone=Chain((Layer("a", 1, 1),)))
    ch2, plan2, trace2, cpu2 = _made_up(batches=2)
    with pytest.raises(ValueError, match="no steady window"):
        period_budget(plan2, ch2, trace2, cpu2, warmup=1)


@pytest.mark.parametrize("engine,weights", [("pipedream", "stash"), ("torch", "single")])
def test_a_real_run_adds_up_to_its_measured_period(engine, weights):
    from workbench.front.running import run_and_compare
    from workbench.profiles.profiler import profile_zoo
    from workbench.profiles.stages import time_stages
    from workbench.profiles.workload import Workload
    from workbench.schedules.builder import best_schedule

    wl = Workload.zoo("tiny-gpt", 2)
    chain = profile_zoo("tiny-gpt", 2, repeats=2, warmup=1, clock="cpu")
    platform = Target.of(2, weights=weights)
    plan = best_schedule(chain, platform, [0, 0, 1, 1])
    s = run_and_compare(plan, chain, platform, wl, 2, 12, replan=False, check_grads=False)
    assert s["engine"] == engine
    whole = time_stages(wl, plan.stages, warmup=1, repeats=2)
    b = period_budget(plan, chain, s["result"].trace, alone=chain, stages_alone=whole)
    assert list(b.columns) == list(PARTS) and len(CPU_PARTS) == 7
    assert b.attrs["measured_period"] == pytest.approx(s["measured_period"])
    assert (b.sum(axis=1) - b.attrs["measured_period"]).abs().max() < 1e-9
    slack = 1e-3 * b.attrs["measured_period"]      # clock granularity
    assert (b[["sending", "between operations", "waiting for messages", "optimizer step"]] >= 0).all().all()
    assert (b["waiting for a core"] >= -slack).all()          # a single thread's CPU time never exceeds its wall time
    assert ((b["optimizer step"] > 0) if engine == "pipedream" else (b["optimizer step"] == 0)).all()


def test_a_backward_in_two_parts_is_compute_too():
    """A zero-bubble schedule runs device 1's backward as I then W: the profile's part is the split backward
    (here the estimate: layer b has no weights, so W is 0 and I the whole backward)."""
    ch, plan, trace, cpu = _made_up()
    ops, cpu = trace.ops.copy(), cpu.copy()
    back = (ops["device"] == 1) & (ops["kind"] == "B")
    split = pd.concat([ops[back].assign(kind="I", end=ops[back]["start"] + 1.5),
                       ops[back].assign(kind="W", start=ops[back]["start"] + 1.5)])
    ops = pd.concat([ops[~back & ~((ops["device"] == 1) & (ops["kind"] == "step"))], split])
    cb = (cpu["device"] == 1) & (cpu["kind"] == "B")
    cpu_split = pd.concat([cpu[cb].assign(kind="I", cpu=1.5), cpu[cb].assign(kind="W", cpu=1.5,
                                                                              cpu_start=cpu[cb]["cpu_start"] + 1.5)])
    cpu = pd.concat([cpu[~cb & ~((cpu["device"] == 1) & (cpu["kind"] == "step"))], cpu_split])
    b = period_budget(plan, ch, Trace(ops, trace.memory, 2, source="measured"), cpu, warmup=1)
    assert b.loc[1, "profile"] == pytest.approx(3.5) and b.loc[1, "optimizer step"] == 0
    assert b.loc[1, "engine"] == pytest.approx(2.0 - 1.5 + 1.5 + 1.5 - 2.0)
    assert per_operation(b).loc[1, "operations per period"] == pytest.approx(3.0)
    assert b.sum(axis=1).tolist() == pytest.approx([PERIOD, PERIOD])
