"""The schedule registry (workbench.schedules.registry): one entry per schedule a plan can name, derived from the
methods; every registered flushed schedule plans, simulates, passes the checker and unrolls into programs."""

from __future__ import annotations

import itertools

import pytest

from workbench.methods import METHODS, method
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan
from workbench.schedules.program import flushed_programs, programs_for
from workbench.schedules.registry import SCHEDULES, TORCH_SCHEDULES, schedule_of
from workbench.schedules.simulate import simulate
from workbench.verify.check import check


def test_one_entry_per_flushed_method_and_periodic():
    flushed = [m for m in METHODS if m.family == "flushed"]
    assert list(SCHEDULES) == ["periodic"] + [m.name for m in flushed]
    assert TORCH_SCHEDULES == tuple(m.name for m in flushed if m.torch_class)
    for m in flushed:
        s = schedule_of(m.name)
        assert s.flushed and (s.torch_class, s.split_backward, s.fixed_chunks) == (m.torch_class, m.split_backward,
                                                                                   m.fixed_chunks)
        assert s.from_torch != (s.stage_order is not None)       # torch orders it, or the workbench does
    assert not schedule_of("periodic").flushed
    with pytest.raises(ValueError, match="unknown schedule 'nosuch'; a plan's schedule is one of periodic"):
        schedule_of("nosuch")


def test_engines():
    assert [schedule_of(n).engine(w) for n, w in itertools.product(("periodic", "gpipe", "zbv"), ("stash", "single"))] \
        == ["pipedream", "torch", "torch", "torch", "torch", "torch"]


def test_layouts_give_every_device_its_share_and_a_v_meets_only_at_its_turn():
    assert schedule_of("interleaved-zb").stage_devices(3, 6) == [0, 1, 2, 0, 1, 2]
    assert schedule_of("dualpipev").stage_devices(3, 6) == [0, 1, 2, 2, 1, 0]
    for name in TORCH_SCHEDULES:
        sched = schedule_of(name)
        for P in (1, 2, 3, 5):
            V = sched.chunks(None)
            dev = sched.stage_devices(P, P * V)
            assert sorted(dev) == sorted(list(range(P)) * V), (name, P)
            meets = [s for s in range(P * V - 1) if dev[s] == dev[s + 1]]
            assert sched.stages_meet == bool(meets) or P == 1, (name, P)
            assert all(dev[s] == P - 1 for s in meets) or P == 1
    with pytest.raises(ValueError, match="exactly 2 stages"):
        schedule_of("zbv").chunks(3)
    with pytest.raises(ValueError, match="planner chose"):
        schedule_of("gpipe").stage_devices(2, 2)


@pytest.mark.parametrize("name", [n for n, s in SCHEDULES.items() if s.stage_order is not None])
def test_the_workbenchs_own_orders_hold_each_operation_once_in_dependency_order(name):
    """Counted here: each stage runs F and B of every micro-batch once, F before B; GPipe holds every
    micro-batch at its turn, 1F1B at most the stages from it to the last (min(m, S - s))."""
    for S, m in itertools.product((1, 2, 4), (1, 3, 8)):
        for s in range(S):
            ops = schedule_of(name).stage_order(S, s, m)
            assert sorted((o.kind, o.batch) for o in ops) == sorted(itertools.product("FB", range(m)))
            seen, held, peak = set(), 0, 0
            for o in ops:
                assert o.stage == s and (o.kind == "F" or ("F", o.batch) in seen)
                seen.add((o.kind, o.batch))
                held += 1 if o.kind == "F" else -1
                peak = max(peak, held)
            assert peak == (m if method(name).warmup == "all" else min(m, S - s))


@pytest.mark.parametrize("name", [n for n, s in SCHEDULES.items() if s.flushed])
def test_every_flushed_schedule_plans_simulates_checks_and_unrolls(name):
    """What adding a schedule to the registry buys without another line: its planner, its simulation, the
    checker's replay and the runtime's programs, all on one plan."""
    chain = Chain(tuple(Layer(f"l{i}", 1.0 + i % 3, 2.0, 10, 4, 4) for i in range(8)), input_bytes=4)
    platform = Target.of(2, bandwidth=8.0, memory_model="paper")
    p = plan(chain, platform, name, micro_batches=4)
    assert p.schedule == name and p.micro_batches == 4 and p.feasible
    assert check(p, chain, platform) == []
    trace = simulate(p, chain, platform, batches=4)
    assert trace.period == pytest.approx(p.period) and list(trace.peak_memory()) == pytest.approx(p.memory)
    progs = programs_for(p, 4)
    ran = trace.ops[trace.ops["kind"].isin(["F", "B", "I", "W"])]
    for d, prog in enumerate(progs):   # the program is the order the simulation ran on the device
        mine = ran[ran["device"] == d].sort_values(["start", "end"], kind="stable")
        assert [o.key for o in prog] == list(zip(mine["stage"], mine["kind"], mine["batch"]))
    assert sum(len(x) for x in flushed_programs(p, 8)) == 2 * sum(len(x) for x in progs)   # two flushes
