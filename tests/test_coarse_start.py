"""workbench.planners.dp.coarse_start: blocks of equal compute, and a block plan timed on the layers."""

from __future__ import annotations

import numpy as np

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.dp.coarse_start import block_start, equal_blocks
from workbench.planners.dp.contiguous import partition_period, plan_dp


def test_blocks_cover_the_chain_in_order_with_about_equal_compute():
    rng = np.random.default_rng(0)
    for L, B in ((50, 5), (1000, 100), (7, 10)):
        ch = Chain(tuple(Layer(f"l{i}", float(rng.uniform(0, 2)), float(rng.uniform(0, 2))) for i in range(L)))
        g = equal_blocks(ch, B)
        assert g[0][0] == 0 and g[-1][1] == L - 1 and all(a[1] + 1 == b[0] for a, b in zip(g, g[1:]))
        assert len(g) <= min(B, L)
        comp = ch.forward + ch.backward
        if B < L / 5:
            sums = [comp[a:b + 1].sum() for a, b in g]
            assert max(sums) <= 2.5 * comp.sum() / B


def test_a_block_plan_is_a_partition_of_the_layers_no_faster_than_the_optimum():
    rng = np.random.default_rng(1)
    ch = Chain(tuple(Layer(f"l{i}", float(rng.uniform(1e-3, 3e-3)), float(rng.uniform(2e-3, 6e-3)),
                           float(rng.uniform(0, 2e7)), float(rng.uniform(1e6, 2e7)), float(rng.uniform(1e6, 4e7)))
                     for i in range(200)), input_bytes=1e6)
    plat = Target.of(8, memory=plan_dp(ch, Target.of(8)).peak_memory * 0.4)
    best = plan_dp(ch, plat)

    def on_blocks(blocks):
        p = plan_dp(blocks, plat)
        return [(s.first, s.last) for s in p.stages] if p.feasible else None

    bounds, period = block_start(ch, on_blocks, lambda b: partition_period(ch, plat, b))
    assert bounds[0][0] == 0 and bounds[-1][1] == len(ch) - 1
    assert period >= best.period * (1 - 1e-9) and period == partition_period(ch, plat, bounds)
    assert block_start(ch, lambda blocks: None, lambda b: 1.0) is None
