"""Tests for workbench.verify.check_flushed: the checker's replay of flushed schedules (layout, order, period,
memory), against hand-computed schedules and the planners' own simulation."""

from __future__ import annotations

import pytest

import workbench.verify.check_flushed as cf
from workbench.methods import METHODS
from workbench.model.chain import Chain, Layer
from workbench.model.plan import Plan, Stage
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.schedules.ops import Op
from workbench.schedules.registry import schedule_of
from workbench.verify.check_flushed import flushed_orders, flushed_problems

PAPER = Target.of(3, memory_model="paper")


def uniform_chain(n: int, weight: float = 10.0) -> Chain:
    """n layers, forward 1 s, backward 2 s, ``weight`` bytes of parameters, 1 byte out and saved."""
    return Chain(tuple(Layer(f"l{i}", 1.0, 2.0, weight, 1, 1) for i in range(n)), input_bytes=1)


def one_layer_stages(schedule: str, S: int, m: int, period: float, memory: tuple[float, ...]) -> Plan:
    stages = tuple(Stage(s, s, s, 0.0, 0.0, 1) for s in range(S))
    return Plan(period, tuple(range(S)), stages, S, memory=memory, schedule=schedule, micro_batches=m)


# (m + S - 1)(F + B) for equal stages and free links: 6 x 3 = 18 s for 4 micro-batches on 3 stages.
# GPipe holds all m activations on every stage, 1F1B min(m, S - s); each stage holds its 10 weight bytes.
@pytest.mark.parametrize("schedule, memory", [("gpipe", (14.0, 14.0, 14.0)), ("1f1b", (13.0, 12.0, 11.0))])
def test_hand_computed_flush_is_accepted(schedule, memory):
    assert flushed_problems(one_layer_stages(schedule, 3, 4, 18 / 4, memory), uniform_chain(3), PAPER) == []


def test_a_wrong_period_is_named_with_the_replayed_makespan():
    problems = flushed_problems(one_layer_stages("gpipe", 3, 4, 4.0, (14.0,) * 3), uniform_chain(3), PAPER)
    assert [p["rule"] for p in problems] == [0]
    assert problems[0]["message"] == ("the plan records a period of 4.000 s; its gpipe schedule of 4 micro-batches "
                                      "takes 18.000 s, 4.500 s per micro-batch")


def test_links_delay_the_flush():
    # 2 stages, one micro-batch, 1 byte over 1 B/s: F0 [0,1], send 1 s, F1 [2,3], B1 [3,5], send 1 s, B0 [6,8]
    chain = uniform_chain(2, weight=0.0)
    plat = Target.of(2, memory_model="paper", bandwidth=1.0)
    assert flushed_problems(one_layer_stages("gpipe", 2, 1, 8.0, (1.0, 1.0)), chain, plat) == []
    free = PAPER.with_(devices=2)
    assert flushed_problems(one_layer_stages("gpipe", 2, 1, 6.0, (1.0, 1.0)), chain, free) == []
    assert [p["rule"] for p in flushed_problems(one_layer_stages("gpipe", 2, 1, 6.0, (1.0, 1.0)), chain, plat)] == [0]


def test_memory_over_the_limit_and_memory_misrecorded():
    plat = PAPER.with_(memory=12.5)
    problems = flushed_problems(one_layer_stages("1f1b", 3, 4, 4.5, (13.0, 12.0, 10.0)), uniform_chain(3), plat)
    assert [(p["rule"], p.get("device"), p.get("amount")) for p in problems] == [(7, 0, 0.5), (7, 2, 1.0)]
    assert problems[0]["message"].startswith("device 0 holds 13 B at its peak, limit 12")
    assert problems[1]["message"].startswith("device 2: the plan records 10 B of memory, the replay gives 11 B")


def test_orders_of_gpipe_and_1f1b():
    gp = flushed_orders(one_layer_stages("gpipe", 2, 3, 1.0, ()))
    assert [str(o) for o in gp[0]] == ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"]
    f1 = flushed_orders(one_layer_stages("1f1b", 3, 4, 1.0, ()))
    assert [str(o) for o in f1[0]] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(o) for o in f1[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S, m", [(1, 1), (2, 5), (4, 2), (5, 5)])
def test_orders_agree_with_the_registry_written_apart(schedule, S, m):
    orders = flushed_orders(one_layer_stages(schedule, S, m, 1.0, ()))
    for s in range(S):
        assert orders[s] == schedule_of(schedule).stage_order(S, s, m)


@pytest.mark.parametrize("name", [m.name for m in METHODS if m.family == "flushed"])
@pytest.mark.parametrize("memory_model", ["paper", "full"])
def test_the_planners_flushed_plans_pass_and_a_changed_one_fails(name, memory_model):
    chain = Chain(tuple(Layer(f"l{i}", 1.0 + i % 3, 2.0, 5, 3, 2) for i in range(8)), input_bytes=3)
    plat = Target.of(2, memory_model=memory_model, bandwidth=10)
    p = run_planner(chain, plat, name, micro_batches=4)
    assert flushed_problems(p, chain, plat) == []
    assert [v["rule"] for v in flushed_problems(p.with_(period=p.period * 0.9), chain, plat)] == [0]
    more = tuple(x + 1 for x in p.memory)
    assert {v["rule"] for v in flushed_problems(p.with_(memory=more), chain, plat)} == {7}


def test_torch_layouts_are_checked_first():
    chain = uniform_chain(4)
    wrong = Plan(1.0, (0, 0, 1, 1), tuple(Stage(s, s, d, 0, 0) for s, d in enumerate((0, 0, 1, 1))), 2,
                 schedule="interleaved-1f1b", micro_batches=2)
    assert [(v["rule"], v["stage"]) for v in flushed_problems(wrong, chain, PAPER)] == [(1, 1), (1, 2)]
    assert flushed_problems(wrong, chain, PAPER)[0]["message"] == ("stage 1 is on device 0; interleaved-1f1b puts "
                                                                    "it on device 1")
    odd = Plan(1.0, (0, 1, 0), tuple(Stage(s, s, s % 2, 0, 0) for s in range(3)), 2, schedule="interleaved-1f1b",
               micro_batches=2)
    assert flushed_problems(odd, uniform_chain(3), PAPER)[0]["message"] == (
        "interleaved-1f1b puts the same number on every device; the plan has 3 stages on 2 devices")
    six = Plan(1.0, (0, 1, 1, 0, 0, 1), tuple(Stage(s, s, d, 0, 0) for s, d in enumerate((0, 1, 1, 0, 0, 1))), 2,
               schedule="zbv", micro_batches=2)
    assert flushed_problems(six, uniform_chain(6), PAPER)[0]["message"] == (
        "zbv puts 2 per device; the plan has 6 stages on 2 devices")


def test_orders_that_deadlock_or_miss_an_operation(monkeypatch):
    p = one_layer_stages("gpipe", 2, 1, 1.0, ())
    chain = uniform_chain(2)
    monkeypatch.setattr(cf, "flushed_orders", lambda plan: {0: [Op(0, "B", 0), Op(0, "F", 0)],
                                                            1: [Op(1, "F", 0), Op(1, "B", 0)]})
    (v,) = flushed_problems(p, chain, PAPER)
    assert v["rule"] == 5 and v["message"].startswith("the order deadlocks (stuck at device 0: 0B0; device 1: 1F0")
    monkeypatch.setattr(cf, "flushed_orders", lambda plan: {0: [Op(0, "F", 0), Op(0, "B", 0)], 1: [Op(1, "F", 0)]})
    (v,) = flushed_problems(p, chain, PAPER)
    assert v["message"] == "the order lacks stage 1's forward or backward of micro-batch 0"
    monkeypatch.setattr(cf, "flushed_orders", lambda plan: {0: [Op(0, "F", 0), Op(0, "F", 0), Op(0, "B", 0)],
                                                            1: [Op(1, "F", 0), Op(1, "B", 0)]})
    assert flushed_problems(p, chain, PAPER)[0]["message"] == "an operation appears twice in the order"
