"""Budgets (workbench.planners.budget): wall-clock and work deadlines, shares, progress; and the
ILP's time limit and deterministic mode built on them."""

from __future__ import annotations

import random
import time

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan
from workbench.planners.budget import Budget, WorkDeadline, charge, within


def test_a_work_deadline_passes_after_its_ticks_and_counts_charges():
    d = WorkDeadline(5)
    charge(d, 3)
    assert [time.perf_counter() > d for _ in range(4)] == [False, False, True, True]
    assert d.used == 5 and d.ticks_left == 0 and not d.cut_short
    charge(time.perf_counter() + 10, 3)   # a wall-clock deadline is not charged (and does not fail)


def test_a_work_deadline_has_a_wall_clock_safety_net():
    d = WorkDeadline(10**9, wall=time.perf_counter() - 1.0)
    assert time.perf_counter() > d and d.cut_short


def test_within_never_outlasts_its_parent():
    outer = WorkDeadline(3)
    inner = within(outer, 100.0, "cover")
    assert [time.perf_counter() > inner for _ in range(5)] == [False, False, False, True, True]
    assert outer.used == 3
    end = time.perf_counter() + 1.0
    assert within(end, 50.0, "cover") == end


def test_shares_of_a_wall_clock_budget():
    b = Budget(10.0)
    assert b.phase_seconds(0.5) == pytest.approx(5.0, abs=0.05)
    assert b.phase_seconds(until=0.2) == pytest.approx(2.0, abs=0.05)
    assert b.phase_seconds(reserve=4.0) == pytest.approx(6.0, abs=0.05)
    c = b.child(0.5)
    assert c.wall_end <= b.wall_end and c.seconds == pytest.approx(5.0, abs=0.05)
    assert Budget().deadline() is None and Budget().phase_seconds(default=3.0) == 3.0


def test_deterministic_budgets_count_work_not_time():
    b = Budget(10.0, deterministic=True)
    d = b.deadline(0.5, "bound")          # 5 nominal seconds of the bound's polls
    assert isinstance(d, WorkDeadline) and d.ticks == 5000
    time.sleep(0.05)
    assert b.spent() == 0.0 and b.left() == 10.0   # time passing spends nothing
    for _ in range(1000):
        time.perf_counter() > d
    assert b.spent() == pytest.approx(1.0) and b.left() == pytest.approx(9.0)
    assert b.milp_limits(root_seconds=20.0) is None       # the root node alone would take more
    lim = b.milp_limits(root_seconds=1.0)
    assert lim["mip_max_nodes"] >= 1 and b.spent() == pytest.approx(2.0)


def test_progress_lines_only_with_a_sink():
    lines: list[str] = []
    Budget(1.0, progress=lines.append, prefix="x: ").say("hello")
    Budget(1.0).say("nobody listens")
    assert lines == ["x: hello"]


def _long_chain(L: int = 600, seed: int = 1) -> Chain:
    r = random.Random(seed)
    return Chain(tuple(Layer(f"l{i}", r.uniform(0.5, 3) * 1e-3, r.uniform(1, 6) * 1e-3, r.uniform(0, 4e6),
                             r.uniform(1e5, 4e6)) for i in range(L)), input_bytes=1e6)


def test_the_general_ilp_ends_within_its_time_limit_with_progress():
    """600 layers on 4 devices with a binding memory limit: the fine lower bound alone once took
    8-16 s, the whole call 14-21 s for --time-limit 2. The contract: limit x 1.1 + 2 s."""
    chain, platform = _long_chain(), Target.of(4, memory=1e9, bandwidth=12e9, memory_model="paper")
    lines: list[str] = []
    t0 = time.perf_counter()
    p = plan(chain, platform, "ilp", allocation="general", time_limit=2.0, progress=lines.append)
    assert time.perf_counter() - t0 <= 2.0 * 1.1 + 2.0
    assert p.feasible and p.status in ("timeout", "optimal") and p.gap is not None and "violations" not in p.extra
    assert any("guided search" in l for l in lines) and any("lower bound" in l for l in lines)


def test_deterministic_mode_gives_the_same_plan_twice():
    chain, platform = _long_chain(120), Target.of(3, memory=6e8, bandwidth=12e9, memory_model="paper")
    runs = [plan(chain, platform, "ilp", allocation="general", time_limit=2.0, deterministic=True) for _ in range(2)]
    a, b = runs
    assert a.extra["deterministic"] is True and b.extra["deterministic"] is True
    assert (a.period, a.assignment, a.status, a.gap) == (b.period, b.assignment, b.status, b.gap)
    assert [(s.fwd_start, s.bwd_start) for s in a.stages] == [(s.fwd_start, s.bwd_start) for s in b.stages]
