"""Comparing GPUs for one model: the rows are the plans a platform of each GPU gets, the chart draws them."""

from __future__ import annotations

import math

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan as make_plan
from workbench.viz.gpus import compare_gpus, gpu_chart, tokens_per_batch

GB = 1e9


def _chain() -> Chain:
    """Eight layers, 4 GB of weights each and 3 GB saved for backward: memory binds on 40 GB GPUs."""
    return Chain(tuple(Layer(f"l{i}", 0.010, 0.020, 4 * GB, 1e6, 3 * GB) for i in range(8)),
                 input_bytes=1e6, meta={"input_shape": "1x2048", "input_dtype": "int64"})


def test_each_row_is_the_plan_of_that_gpus_platform():
    ch = _chain()
    df = compare_gpus({"a100-40gb": ch, "h200": ch}, 4, optimizer="sgd", weights="single")
    assert list(df["gpu"]) == ["a100-40gb", "a100-40gb", "h200", "h200"]
    for _, row in df.iterrows():
        want = make_plan(ch, Target.on(row.gpu, 4, optimizer="sgd", weights="single"), "dp",
                         activations=row.activations)
        assert row.feasible == (want.feasible and want.fits)
        if row.feasible:
            assert math.isclose(row.period_ms, want.period * 1e3) and row.throughput == 2048 / want.period
            assert row.limit_gib == row.platform.memory / 2**30 and row.stages == len(want.stages)
    a100 = df[df.gpu == "a100-40gb"].set_index("activations")
    assert a100.loc["auto", "period_ms"] <= a100.loc["keep", "period_ms"]


def test_where_keep_is_already_optimal_the_other_policies_reuse_it():
    ch = _chain()
    df = compare_gpus({"h200": ch}, 8, optimizer="sgd", weights="single")
    keep, auto = df.plan.iloc[0], df.plan.iloc[1]
    assert auto is keep and df.recomputed.sum() == 0


def test_the_chart_has_a_bar_group_per_policy():
    df = compare_gpus({"a100-40gb": _chain(), "h100-sxm": _chain()}, 4, optimizer="sgd", weights="single")
    fig = gpu_chart(df)
    assert [b.name for b in fig.data] == ["activations keep", "activations auto"]
    assert list(fig.data[0].x) == ["NVIDIA A100 SXM4 40GB", "NVIDIA H100 SXM5 80GB"]


def test_tokens_per_batch():
    assert tokens_per_batch(_chain()) == 2048
