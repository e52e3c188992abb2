"""The stage-path bound (workbench.planners.ilp.stage_bound) against brute force and the per-layer bound."""

import math

import numpy as np

from instances import footprint_limit, ilp_chain
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.brute import plan_brute
from workbench.planners.ilp.bounds import memory_period_bound
from workbench.planners.ilp.stage_bound import least_stage_memory, stage_path_bound


def _instance(rng, L, P):
    ch = ilp_chain(rng, L)
    M = footprint_limit(ch, P, rng, 1.1, 2.5)
    return ch, Target.of(P, memory=M, bandwidth=float(rng.uniform(0.5, 10)),
                        weights=str(rng.choice(["stash", "single"])), memory_model="paper")


def test_bound_below_the_general_optimum_and_often_above_the_per_layer_bound():
    rng = np.random.default_rng(4)
    done = stronger = 0
    for _ in range(40):
        ch, plat = _instance(rng, int(rng.integers(3, 8)), int(rng.integers(2, 4)))
        ref = plan_brute(ch, plat, allocation="general")
        b = stage_path_bound(ch, plat, ref.period if ref.feasible else None)
        if not ref.feasible:
            continue
        assert b <= ref.period * (1 + 1e-9), (b, ref.period)
        # the relaxation fits at the optimum's period, with the optimum's own memory at most
        assert least_stage_memory(ch, plat, ref.period) <= plat.devices * plat.memory * (1 + 1e-9)
        stronger += b > memory_period_bound(ch, plat) * (1 + 1e-6)
        done += 1
    assert done >= 25 and stronger >= 5, (done, stronger)


def test_unlimited_memory_is_the_load_bound():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 5, 5) for i in range(6)))
    assert stage_path_bound(ch, Target.of(3, memory_model="paper")) == 6.0


def test_cuts_cost_memory_upstream():
    """Two layers (compute 2 each, 10 saved bytes each), 15 bytes per device, a cut of 2 s each
    way. Together they need 20 bytes: they must be split, and the cut lengthens layer a's window
    to 2 + 2 + 2 * 2 = 8, so k = 1 needs T >= 8. The per-layer bound ignores the cut (4)."""
    ch = Chain((Layer("a", 1.0, 1.0, 0, 2, saved_bytes=10), Layer("b", 1.0, 1.0, 0, 0, saved_bytes=10)),
               input_bytes=0)
    plat = Target.of(2, memory=15.0, bandwidth=1.0, memory_model="paper")
    assert plat.comm_time(ch.cut(0)) == 2.0
    assert memory_period_bound(ch, plat) == 4.0
    assert least_stage_memory(ch, plat, 8.0) == 20.0 and least_stage_memory(ch, plat, 7.9) == math.inf
    b = stage_path_bound(ch, plat, rel=1e-6)
    ref = plan_brute(ch, plat, allocation="general")
    assert 8.0 * (1 - 1e-5) <= b <= ref.period * (1 + 1e-9) and abs(ref.period - 8.0) < 1e-9
