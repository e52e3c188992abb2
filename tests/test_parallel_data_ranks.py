"""Every rank's predicted peak for the runtime (workbench.parallel.data.ranks) against the planners' own figures."""

from __future__ import annotations

import numpy as np
import pytest

from test_memory import measured_chain
from workbench.model.layout import Layout
from workbench.model.target import Target
from workbench.parallel.data import rank_memory, rank_memory_terms
from workbench.planners import plan


@pytest.mark.parametrize("method,zero", [("1f1b", 2), ("gpipe", 0), ("interleaved-1f1b", 1), ("zbv", 2), ("dp", 1)])
def test_rank_memory_is_the_plans_memory_of_its_pipeline_rank(method, zero):
    chain = measured_chain(np.random.default_rng(7), 8, dtype="bfloat16", device="cuda")
    layout = Layout(tp=2, pp=2, dp=2, zero=zero)
    setup = dict(optimizer="adam", precision="bf16-mixed", weights="stash" if method == "dp" else "single")
    made = plan(chain, Target.of(2, dp=2, zero=zero, **setup), method,
                **({} if method == "dp" else {"micro_batches": 4}))
    assert not made.extra.get("violations")
    for rank in range(layout.devices):
        pipeline = layout.coords(rank)[0]
        got = rank_memory(made, chain, Target.of(2, **setup), layout, rank, engine=False)
        assert got == pytest.approx(made.memory[pipeline], rel=1e-9)
        assert rank_memory(made, chain, Target.of(2, **setup), layout, rank) >= got
    if method == "dp":                       # the periodic model's split adds up to its figure
        terms = rank_memory_terms(made, chain, Target.of(2, **setup), layout, 0)
        assert sum(terms.values()) == pytest.approx(made.memory[0], rel=1e-9)


def test_the_layout_sets_the_data_parallel_group():
    chain = measured_chain(np.random.default_rng(1), 6, dtype="bfloat16", device="cuda")
    made = plan(chain, Target.of(1, weights="single", optimizer="adam"), "1f1b", micro_batches=2)
    replica = rank_memory(made, chain, Target.of(1, weights="single", optimizer="adam"), Layout(), 0, engine=False)
    sharded = rank_memory(made, chain, Target.of(1, weights="single", optimizer="adam"), Layout(dp=4, zero=3), 0,
                          engine=False)
    assert replica == pytest.approx(made.memory[0]) and sharded < replica


def test_a_flushed_plan_steps_every_tied_copy_whatever_the_platform_says():
    """torch's engine (the layout runtime's) steps each copy of a tied parameter: the sharer's rank holds the copy,
    its gradient and Adam's two states (3 x 8 MB), the owner's no receive buffer for the sharer's gradient, even
    when the platform says ``weights="stash"`` (the PipeDream engine's ties), as a ``single`` platform predicts."""
    import json

    from workbench.model.chain import Chain, Layer

    tied = json.dumps([{"owner": "embed", "layers": ["embed", "head"], "bytes": 8e6}])
    layers = (Layer("embed", 0.01, 0.02, 8e6, 1e6), Layer("mid", 0.01, 0.02, 4e6, 1e6),
              Layer("head", 0.01, 0.02, 0, 1e6))
    chain = Chain(layers, input_bytes=1e6, meta={"tied": tied})
    made = plan(chain, Target.of(2, optimizer="adam"), "1f1b", micro_batches=2)
    assert [(s.first, s.last) for s in made.stages][-1][1] == 2 and made.stages[-1].first > 0   # head on rank 1
    layout = Layout(pp=2)
    for weights in ("stash", "single"):
        platform = Target.of(2, optimizer="adam", weights=weights)
        owner, sharer = (rank_memory_terms(made, chain, platform, layout, r) for r in (0, 1))
        assert sharer["tied"] == pytest.approx(3 * 8e6) and owner.get("tied", 0.0) == 0.0
    stash, single = (Target.of(2, optimizer="adam", weights=w) for w in ("stash", "single"))
    assert [rank_memory(made, chain, stash, layout, r) for r in (0, 1)] == \
        [rank_memory(made, chain, single, layout, r) for r in (0, 1)]


def test_one_stage_per_rank_1f1b_keeps_one_send_each_way():
    """torch's ``Schedule1F1B`` (the layout runtime's 1F1B with one stage per rank) waits for each send and keeps the
    last: beyond the model a stage holds its N receive buffers and one input gradient sent back, ``N - k`` more inputs
    and ``N - 1`` more output gradients (not ``2N - k - 1``, every send to the end of the step); GPipe keeps every
    send (the bound as before)."""
    from workbench.model.chain import Chain, Layer
    from workbench.model.memory_views import torch_engine_extra
    from workbench.parallel.data.ranks import sends_kept

    chain = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6 + i) for i in range(4)), input_bytes=5e5)
    platform, layout, n = Target.of(2, weights="single", optimizer="adam"), Layout(pp=2), 4
    made = plan(chain, platform, "1f1b", micro_batches=n)
    assert sends_kept(made) == 1 and sends_kept(plan(chain, platform, "gpipe", micro_batches=n)) is None
    first, last = made.stages
    k0, k1 = first.in_flight, last.in_flight
    extra = [rank_memory(made, chain, platform, layout, r) - rank_memory(made, chain, platform, layout, r,
                                                                         engine=False) for r in (0, 1)]
    by_hand = [(n - 1) * chain.cut(first.last) + (n - k0) * chain.input_bytes,
               (n - k1) * chain.cut(last.first - 1) + k1 * chain.layers[last.last].activation_bytes]
    assert extra == pytest.approx(by_hand)
    every_send = torch_engine_extra(chain, made.stages, 2, n)
    assert every_send[1] - extra[1] == pytest.approx((n - 1) * chain.cut(last.first - 1))   # the sends it drops
