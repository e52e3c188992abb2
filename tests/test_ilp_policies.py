"""workbench.planners.ilp.policies: the model's policy part (options, bounds, the policy read back)."""

from __future__ import annotations

import numpy as np
import pyomo.environ as pyo

from workbench.model.activations import policy_terms
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.policies import minimal_terms, options, read_policies
from workbench.planners.ilp.solve import solve_model


def test_pair_options_only_where_storage_is_shared():
    l0 = Layer("r", 1.0, 1.0, 0, 16, 16, 0, 0, 0, 16, 16, 32)      # saves its output
    l1 = Layer("s", 1.0, 1.0, 0, 8, 20, 0, 0, 16, 0, 24, 40)       # saves that as its input
    pt = policy_terms(Chain((l0, l1), input_bytes=16), Target.of(1, optimizer="sgd"))
    assert len(options(pt, 0)) == 3 and len(options(pt, 1)) == 9
    a, w0 = minimal_terms(pt)
    assert np.all(a <= pt.act.min(axis=(0, 1)) + pt.keep.stash + 1e-9) and np.all(w0 >= 0)


def test_fixed_period_model_picks_policies_that_fit():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(2)), input_bytes=10)
    plat = Target.of(1, memory=150, memory_model="paper", host_bandwidth=1e9)
    m = build_model(ch, plat, period=7.0, policies=True)      # keep never fits 150 bytes; dp auto: 7 s
    res = solve_model(m)
    assert res.incumbent_objective is not None
    pol = read_policies(m)
    assert pol.count("keep") <= 1 and pyo.value(m.policy_memory[0]) <= 1 + 1e-6
