"""Every rank's predicted peak for the runtime (workbench.parallel.data.ranks) against the planners' own figures."""

from __future__ import annotations

import numpy as np
import pytest

from test_memory import measured_chain
from workbench.model.chain import Platform
from workbench.model.layout import Layout
from workbench.parallel.data import rank_memory, rank_memory_terms
from workbench.planners import plan


@pytest.mark.parametrize("method,zero", [("1f1b", 2), ("gpipe", 0), ("interleaved-1f1b", 1), ("zbv", 2), ("dp", 1)])
def test_rank_memory_is_the_plans_memory_of_its_pipeline_rank(method, zero):
    chain = measured_chain(np.random.default_rng(7), 8, dtype="bfloat16", device="cuda")
    layout = Layout(tp=2, pp=2, dp=2, zero=zero)
    setup = dict(optimizer="adam", precision="bf16-mixed", weights="stash" if method == "dp" else "single")
    made = plan(chain, Platform(2, dp=2, zero=zero, **setup), method,
                **({} if method == "dp" else {"micro_batches": 4}))
    assert not made.extra.get("violations")
    for rank in range(layout.devices):
        pipeline = layout.coords(rank)[0]
        got = rank_memory(made, chain, Platform(2, **setup), layout, rank, engine=False)
        assert got == pytest.approx(made.memory[pipeline], rel=1e-9)
        assert rank_memory(made, chain, Platform(2, **setup), layout, rank) >= got
    if method == "dp":                       # the periodic model's split adds up to its figure
        terms = rank_memory_terms(made, chain, Platform(2, **setup), layout, 0)
        assert sum(terms.values()) == pytest.approx(made.memory[0], rel=1e-9)


def test_the_layout_sets_the_data_parallel_group():
    chain = measured_chain(np.random.default_rng(1), 6, dtype="bfloat16", device="cuda")
    made = plan(chain, Platform(1, weights="single", optimizer="adam"), "1f1b", micro_batches=2)
    replica = rank_memory(made, chain, Platform(1, weights="single", optimizer="adam"), Layout(), 0, engine=False)
    sharded = rank_memory(made, chain, Platform(1, weights="single", optimizer="adam"), Layout(dp=4, zero=3), 0,
                          engine=False)
    assert replica == pytest.approx(made.memory[0]) and sharded < replica
