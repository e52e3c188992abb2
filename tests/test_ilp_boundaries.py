"""workbench.planners.ilp.boundaries: the MILP's stage-boundary memory, with and without activation policies."""

from __future__ import annotations

import pyomo.environ as pyo
import pytest

from workbench.model.activations import apply_policies
from workbench.model.chain import Chain, Layer
from workbench.model.memory import layer_terms
from workbench.model.memory_views import plan_memory
from workbench.model.target import Target
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.policies import read_policies
from workbench.planners.ilp.solve import plan_from_model, solve_model

# big cuts, little saved: what a stage holds once at its boundaries (the receive buffers) matters
_CHAIN = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 10, 4, 4, 0, 0, 0, 0, 0, 0) for i in range(4)), input_bytes=4,
               cut_bytes=(40.0, 40.0, 40.0))


def _solved(memory: float, policies: bool):
    plat = Target.of(2, memory=memory, optimizer="sgd", zero_grad="zeros", weights="single")
    m = build_model(_CHAIN, plat, period=4.0, policies=policies)
    if solve_model(m).incumbent_objective is None:
        return plat, m, None
    return plat, m, plan_from_model(m, _CHAIN, plat)


def test_families_where_a_layer_can_start_or_end_a_stage():
    plat = Target.of(2, memory=1000, optimizer="sgd")
    m = build_model(_CHAIN, plat)
    t = layer_terms(_CHAIN, plat)
    assert sorted(m.BSTART) == [l for l in range(4) if t.buf_in[l] > 0] == [1, 2, 3]
    assert sorted(m.BEND) == [0, 1, 2]                      # no boundary after the last layer


@pytest.mark.parametrize("policies", [False, True])
@pytest.mark.parametrize("memory", [180.0, 196.0])
def test_the_model_never_holds_less_than_the_memory_model(memory, policies):
    # with policies the MILP left the receive buffers out: at 180 bytes it took plans of 200 (issue 35)
    plat, m, plan = _solved(memory, policies)
    if plan is None:
        assert memory < 196.0 or not policies
        return
    pol = read_policies(m) if policies else None
    true = plan_memory(apply_policies(_CHAIN, pol), plat, plan.stages)
    rows = m.policy_memory if policies else None
    for d, bytes_held in enumerate(true):
        assert bytes_held <= memory * (1 + 1e-9)
        if rows is not None:
            assert pyo.value(rows[d]) * memory >= bytes_held - 1e-6


def test_a_plan_with_policies_fits_where_the_buffers_allow():
    _, m, plan = _solved(196.0, True)
    assert plan is not None and any(s.first > 0 for s in plan.stages)
