"""The checker: one hand-built plan per rule that breaks only that rule, plus valid plans that pass."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import Plan, Stage, make_plan
from workbench.model.target import Target
from workbench.verify.check import Violation, check, format_violations, is_valid

MS = 1e-3


# ---------------------------------------------------------------------------
# A contiguous instance worked out by hand.
# 6 layers: forward 1 ms, backward 2 ms, 100 weight bytes, 10 activation bytes,
# 3 stages of 2 layers (F = 2 ms, B = 4 ms, A = 20 B, W = 200 B), boundary
# cost c = 10 B / 20000 B/s = 0.5 ms. Period T = 8 ms.
#   f = 0, 2.5, 5 ms; last stage b2 = f2 + F = 7 ms (window 6, k=1);
#   stage 1: b1 >= 7 + 4 + 0.5 = 11.5, but then F and B overlap mod 8,
#            so b1 = 2.5 + 2 + 8 = 12.5 (window 14, k=2);
#   stage 0: b0 >= 12.5 + 4 + 0.5 = 17, overlap again, b0 = 18 (window 22, k=3).
# Memory (phi=1, stash): k*20 + 200 + (k-1)*200 = 660, 440, 220 bytes.
# ---------------------------------------------------------------------------

def _chain() -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1 * MS, 2 * MS, 100, 10) for i in range(6)), input_bytes=10)


def _plat(memory: float = 1000) -> Target:
    return Target.of(3, memory=memory, bandwidth=20000, memory_model="paper")


ASSIGN = [0, 0, 1, 1, 2, 2]
F0 = [0.0, 2.5 * MS, 5 * MS]
B0 = [18 * MS, 12.5 * MS, 7 * MS]


def _plan(f=F0, b=B0, T=8 * MS, assignment=ASSIGN, platform=None, **kw) -> Plan:
    return make_plan(_chain(), platform or _plat(), T, assignment, f, b, method="hand", **kw)


def _rules(plan: Plan, platform=None, chain=None) -> list[int]:
    return sorted({v.rule for v in check(plan, chain or _chain(), platform or _plat())})


def test_valid_contiguous_plan_passes_and_matches_hand_figures():
    plan = _plan()
    assert [s.in_flight for s in plan.stages] == [3, 2, 1]
    assert list(plan.memory) == [660, 440, 220]
    assert check(plan, _chain(), _plat()) == []
    assert is_valid(plan, _chain(), _plat())


def test_memory_exactly_at_the_limit_passes():
    assert is_valid(_plan(), _chain(), _plat(memory=660))


def test_rule0_structure():
    plan = _plan()
    st = list(plan.stages)
    # stage device disagrees with the assignment
    bad = plan.with_(stages=(replace(st[0], device=1),) + tuple(st[1:]))
    vs = check(bad, _chain(), _plat())
    assert {v.rule for v in vs} == {0} and "device" in str(vs[0])
    # stages do not cover the chain
    bad = plan.with_(stages=tuple(st[:2]))
    assert _rules(bad) == [0]
    # period not positive
    bad = plan.with_(period=0.0)
    assert 0 in _rules(bad)
    # wrong assignment length
    assert _rules(plan.with_(assignment=plan.assignment[:-1])) == [0]
    # two adjacent stages on one device are not maximal runs
    split = (Stage(0, 0, 0, 0.0, 18 * MS, 3), Stage(1, 1, 0, 1 * MS, 19 * MS, 3)) + tuple(st[1:])
    assert 0 in _rules(plan.with_(stages=split))


def test_rule1_device_out_of_range():
    plan = _plan()
    bad = plan.with_(assignment=(0, 0, 1, 1, 5, 5),
                     stages=plan.stages[:2] + (replace(plan.stages[2], device=5),))
    vs = check(bad, _chain(), _plat())
    assert {v.rule for v in vs} == {1}
    assert "layer 4" in str(vs[0]) and "device 5" in str(vs[0])


def test_rule1_contiguous_plan_with_two_stages_on_a_device():
    # Devices 0, 1, 0 with a long period: every other rule holds (k = 1 everywhere).
    T = 30 * MS
    f = [0.0, 2.5 * MS, 5 * MS]
    b = [16 * MS, 11.5 * MS, 7 * MS]
    assign = [0, 0, 1, 1, 0, 0]
    general = make_plan(_chain(), _plat(), T, assign, f, b, allocation="general")
    assert check(general, _chain(), _plat()) == []
    contiguous = general.with_(allocation="contiguous")
    vs = check(contiguous, _chain(), _plat())
    assert [v.rule for v in vs] == [1] and vs[0].device == 0


def test_rule2_forward_order():
    vs = check(_plan(f=[0.0, 2.4 * MS, 5 * MS]), _chain(), _plat())
    assert [v.rule for v in vs] == [2]
    assert vs[0].stage == 1 and vs[0].amount == pytest.approx(0.1 * MS)


def test_rule3_turn_around():
    # b2 one period early (mod T nothing overlaps, the backward order still holds)
    vs = check(_plan(b=[18 * MS, 12.5 * MS, -1 * MS]), _chain(), _plat())
    assert [v.rule for v in vs] == [3]
    assert vs[0].stage == 2 and vs[0].amount == pytest.approx(8 * MS)


def test_rule4_backward_order():
    vs = check(_plan(b=[18 * MS, 4.5 * MS, 7 * MS]), _chain(), _plat())
    assert [v.rule for v in vs] == [4]
    assert vs[0].stage == 1 and vs[0].amount == pytest.approx(7 * MS)


def test_rule5_overlap_modulo_period():
    # b0 = 22 ms: backward [22, 26) = [6, 8) u [0, 2) mod 8 hits the forward [0, 2)
    plan = _plan(b=[22 * MS, 12.5 * MS, 7 * MS])
    assert plan.stages[0].in_flight == 4 and plan.memory[0] == 880
    vs = check(plan, _chain(), _plat())
    assert [v.rule for v in vs] == [5]
    assert vs[0].device == 0 and vs[0].amount == pytest.approx(2 * MS)


def test_rule5_device_load_above_period():
    # T = 5.9 ms < F + B = 6 ms on every device; starts far apart so precedence holds
    T = 5.9 * MS
    plan = _plan(T=T, b=[60 * MS, 40 * MS, 7 * MS])
    vs = check(plan, _chain(), _plat(memory=math.inf))
    assert {v.rule for v in vs} == {5}
    assert any("load" in v.message and "exceeds the period" in v.message for v in vs)


def _alternating():
    """4 one-layer stages on devices 0,1,0,1; F = B = 1 s, c = 3 s; T = 8 s (see the comments)."""
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 1, 3) for i in range(4)), input_bytes=3)
    plat = Target.of(2, bandwidth=1, memory_model="paper")
    # dev0: F0 [0,1) F2 [1,2) B2 [2,3) B0 [3,4); dev1: F1 [4,5) F3 [5,6) B3 [6,7) B1 [7,8) (mod 8)
    f = [0.0, 4.0, 9.0, 13.0]
    b = [27.0, 23.0, 18.0, 14.0]
    return chain, plat, f, b


def test_rule6_link_load():
    chain, plat, f, b = _alternating()
    plan = make_plan(chain, plat, 8.0, [0, 1, 0, 1], f, b)
    vs = check(plan, chain, plat)
    assert [v.rule for v in vs] == [6, 6]  # 0->1 and 1->0 each carry 9 s per 8 s
    assert vs[0].amount == pytest.approx(1.0)
    # with cheaper links the same schedule is valid
    plat2 = Target.of(2, bandwidth=1.5, memory_model="paper")  # c = 2 s, load 6 s per link
    assert check(make_plan(chain, plat2, 8.0, [0, 1, 0, 1], f, b), chain, plat2) == []


def test_rule7_memory_over_limit():
    plan = _plan()
    vs = check(plan, _chain(), _plat(memory=600))
    assert [v.rule for v in vs] == [7]
    assert vs[0].device == 0 and vs[0].amount == pytest.approx(60)
    assert "over by" in str(vs[0])


def test_rule7_recorded_in_flight_and_memory_must_agree():
    plan = _plan()
    st = list(plan.stages)
    bad = plan.with_(stages=(replace(st[0], in_flight=1),) + tuple(st[1:]))
    vs = check(bad, _chain(), _plat())
    assert [v.rule for v in vs] == [7] and "records 1" in vs[0].message
    bad = plan.with_(memory=(100.0, 440.0, 220.0))
    vs = check(bad, _chain(), _plat())
    assert [v.rule for v in vs] == [7] and vs[0].device == 0


def test_memory_is_recomputed_without_stash_and_with_weight_factor():
    plat = Target.of(3, memory=1000, bandwidth=20000, weights="single", weight_factor=4, memory_model="paper")
    plan = _plan(platform=plat)
    # k*20 + 4*200
    assert list(plan.memory) == [860, 840, 820]
    assert check(plan, _chain(), plat) == []
    vs = check(plan, _chain(), Target.of(3, memory=850, bandwidth=20000, weights="single", weight_factor=4,
                                        memory_model="paper"))
    assert [v.device for v in vs] == [0]


def test_every_violation_is_reported_at_once():
    plan = _plan(f=[0.0, 2.4 * MS, 5 * MS], b=[22 * MS, 3.0 * MS, -1 * MS])
    assert {2, 3, 4, 5}.issubset(set(_rules(plan, platform=_plat(memory=100))))
    assert 7 in _rules(plan, platform=_plat(memory=100))


def test_flushed_plans_are_replayed_period_and_memory_included():
    from workbench.planners.flushed import plan_gpipe

    plat = _plat(memory=10_000)
    good = plan_gpipe(_chain(), plat, micro_batches=4)
    assert check(good, _chain(), plat) == []
    # a GPipe of 3 stages of 2 ms + 4 ms, 4 micro-batches, 0.5 ms a transfer: by hand, the last forward ends at
    # 13 ms, the last stage's backwards at 29 ms, each stage above 4.5 ms later: 38 ms over 4 micro-batches
    assert good.period == pytest.approx(9.5 * MS)
    wrong = good.with_(period=8 * MS, memory=tuple(m + 1 for m in good.memory))
    assert _rules(wrong, platform=plat) == [0, 7]
    assert _rules(good, platform=_plat(memory=1)) == [7]          # the simulated peak is over the limit


def test_a_flushed_plan_with_a_negative_period_is_refused():
    from workbench.planners.flushed import plan_1f1b
    from workbench.schedules.simulate import simulate

    plan = plan_1f1b(_chain(), _plat(), micro_batches=4).with_(period=-1.0)
    assert 0 in _rules(plan) and "positive and finite" in check(plan, _chain(), _plat())[0].message
    with pytest.raises(ValueError, match="positive and finite"):
        simulate(plan, _chain(), _plat())


def test_infeasible_plan_is_reported():
    from workbench.model.plan import infeasible_plan

    vs = check(infeasible_plan(_chain(), _plat(), "x", "too big"), _chain(), _plat())
    assert [v.rule for v in vs] == [0] and "too big" in vs[0].message


def test_violation_str_and_grid():
    v = Violation(7, "device 1 holds 3.2 GiB, limit 2.0 GiB, over by 1.2 GiB", device=1)
    assert str(v) == "rule 7 (memory): device 1 holds 3.2 GiB, limit 2.0 GiB, over by 1.2 GiB"
    grid = format_violations(check(_plan(), _chain(), _plat(memory=600)), 3)
    line0 = [l for l in grid.splitlines() if l.startswith("0 ")][0]
    assert line0.split("|")[1].split() == [".", ".", ".", ".", ".", ".", ".", "X"]
    assert format_violations([], 3).startswith("valid")


def test_json_round_trip_keeps_validity(tmp_path):
    plan = _plan()
    p = tmp_path / "plan.json"
    plan.to_json(p)
    assert check(Plan.from_json(p), _chain(), _plat()) == []
    # the text itself too, however long (a path check on it once raised "File name too long")
    text = p.read_text()
    assert 255 < len(text) < 4096 and "\n" in text
    assert Plan.from_json(text) == plan and Plan.from_json(str(p)) == plan


# ----- the command line ------------------------------------------------------------------------

def _cli_setup(tmp_path):
    from workbench.profiles import write_profile
    from workbench.schedules.builder import build_schedule

    chain = _chain().with_meta(network="toy")
    prof = tmp_path / "toy.csv"
    write_profile(chain, prof)
    plat = Target.of(3, memory=1000, bandwidth=20000, memory_model="paper")
    plan = build_schedule(chain, plat, ASSIGN, 8 * MS, method="builder")
    good = tmp_path / "good.json"
    plan.to_json(good)
    st = list(plan.stages)
    bad = tmp_path / "bad.json"
    plan.with_(stages=(st[0], replace(st[1], fwd_start=st[1].fwd_start - 0.5 * MS), st[2])).to_json(bad)
    return prof, good, bad


def test_cli_check_valid_and_broken_plans(tmp_path, capsys):
    from workbench.front.cli import main

    prof, good, bad = _cli_setup(tmp_path)
    args = ["--profile", str(prof), "--devices", "3", "--memory", "1000", "--bandwidth", "20000B/s"]
    assert main(["check", str(good)] + args) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["check", str(bad)] + args) != 0
    out = capsys.readouterr().out
    assert "rule 2 (forward order)" in out and "stage 1" in out
    # the same good plan under a tighter memory limit breaks rule 7 on device 0 (660 B)
    assert main(["check", str(good)] + args[:4] + ["--memory", "600", "--bandwidth", "20000B/s"]) != 0
    assert "rule 7 (memory): device 0" in capsys.readouterr().out


def test_cli_simulate_writes_a_trace(tmp_path, capsys):
    import pandas as pd

    from workbench.front.cli import main

    prof, good, _ = _cli_setup(tmp_path)
    out = tmp_path / "trace.csv"
    assert main(["simulate", str(good), "--profile", str(prof), "--bandwidth", "20000B/s",
                 "--batches", "10", "--out", str(out)]) == 0
    ops = pd.read_csv(out)
    mem = pd.read_csv(tmp_path / "trace.memory.csv")
    assert set(ops["kind"]) >= {"F", "B", "send"} and ops["batch"].nunique() == 10
    assert mem.groupby("device")["total"].max().tolist() == [660, 440, 220]
    out = capsys.readouterr().out
    assert "steady period 8.00 ms" in out and "GPU0: 660 B, GPU1: 440 B, GPU2: 220 B" in out
