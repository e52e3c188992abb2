"""Tests for workbench.model.plan_extra: every planner writes Plan.extra by its schema."""

from __future__ import annotations

import json
import random

import pytest

from policy_instances import random_chain
from workbench.model.chain import Chain, Layer
from workbench.model.plan import Plan
from workbench.model.plan_extra import extra_problems, phase_record
from workbench.model.target import Target
from workbench.planners import PLANNERS as METHODS
from workbench.planners import plan as run_planner


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_writes_extra_by_the_schema(method):
    rng = random.Random(3)
    chain = random_chain(rng, 5)
    for memory in (float("inf"), 400.0, 5.0):
        for allocation in ("contiguous", "general"):
            p = run_planner(chain, Target.of(2, memory=memory), method, allocation=allocation)
            assert extra_problems(p.extra) == [], (method, memory, allocation)
            back = Plan.from_dict(json.loads(p.to_json()))           # it survives the JSON
            assert extra_problems(back.extra) == []


def test_the_ilp_records_its_phases_on_blocks_too():
    chain = Chain(tuple(Layer(f"l{i}", 1.0 + (i % 3), 2.0, 10, 4) for i in range(40)))
    p = run_planner(chain, Target.of(4, memory_model="paper"), "ilp", allocation="general", time_limit=20)
    solve = p.extra["solve"]
    phases = [r["phase"] for r in solve["phases"]]
    assert phases[:2] == ["incumbent", "fine_bound"] and "block_ilp" in phases    # the bound first, then blocks
    assert solve["found_by"] in [r["phase"] for r in solve["phases"]] and solve["bound_by"]
    assert extra_problems(p.extra) == []


def test_problems_are_named():
    assert extra_problems({"blocks": "many"}) == ["extra.blocks: expected int, got str"]
    assert extra_problems({"deterministic": 1}) == ["extra.deterministic: expected bool, got int"]
    assert phase_record("x", 1, float("inf"), None, "")["period"] is None
