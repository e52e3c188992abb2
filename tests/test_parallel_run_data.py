"""workbench.parallel.run.data: every ZeRO level's gradients equal one process's (dp alone and pp x dp), and
what each level keeps per rank as torch's own trackers see it."""

import pytest
import torch

from layout_runs import layout_config, mlp
from workbench.model.layout import Layout
from workbench.parallel.run.data import ZERO_PIECES, make_layout_optimizer, zero_grads
from workbench.parallel.run.launch import layout_gradient_errors, run_layout
from workbench.parallel.run.tensor import tensor_parallel_plan
from workbench.runtime.gradients import grad_error, reference_gradients

#: bytes of the zoo MLP's parameters: (32 x 64 + 64) + (64 x 64 + 64) + (64 x 10 + 10), float32
MLP_PARAMETER_BYTES = 4 * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10)


def _run(layout, **kw):
    cfg = layout_config(mlp(), layout, **kw)
    parts = run_layout(cfg)
    return cfg, parts, layout_gradient_errors(parts, cfg.workload, layout, cfg.micro_batches, say=lambda *a, **k: None)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_each_zero_level_on_two_replicas_equals_one_process(zero):
    cfg, parts, (_, rel) = _run(Layout(dp=2, zero=zero))
    assert rel < 1e-4
    if zero == 0:   # the check is not blind to data parallelism: unreduced, replica 0's would be far off
        alone = {n: g * 2 for n, g in reference_gradients(cfg.workload, cfg.micro_batches).items()}
        assert grad_error(alone, reference_gradients(cfg.workload, 2 * cfg.micro_batches))[1] > 1e-2
    for p in parts:
        b = p["memory_breakdown"]
        if zero in (0, 1):            # DDP: the whole model on every rank, its buckets a second gradient's bytes
            assert b["Parameter"] == MLP_PARAMETER_BYTES and p["collectives"]["ddp_buckets"] == MLP_PARAMETER_BYTES
            assert b["Other"] >= MLP_PARAMETER_BYTES      # the buckets, resident from before the step
        else:                         # FSDP2: each rank keeps half of every parameter
            assert b["Sharded Param"] == MLP_PARAMETER_BYTES // 2
            assert ("all_gather" in p["collectives"]) and ("ddp_buckets" not in p["collectives"])


@pytest.mark.parametrize("zero", [1, 3])
def test_pipeline_by_data_parallel_equals_one_process(zero):
    cfg, parts, (_, rel) = _run(Layout(pp=2, dp=2, zero=zero), micro_batches=3)
    assert rel < 1e-4
    assert [p["coords"] for p in parts] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert all(p["collectives"]["pipeline_receive"] > 0 for p in parts)


def test_zero_1_on_one_replica_is_plain_and_the_loops_zero_as_they_say():
    assert ZERO_PIECES[3].startswith("fully_shard")
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    opt = make_layout_optimizer("adam", ps, 0.0, zero=1, dp=1)
    assert type(opt).__name__ == "Adam"           # dp = 1: no sharding to do
    for p in ps:
        p.grad = torch.ones(3)
    zero_grads(ps, loop="zeros")
    assert all(p.grad is not None and not p.grad.any() for p in ps)
    zero_grads(ps, loop="none")
    assert all(p.grad is None for p in ps)


@pytest.mark.skipif(tensor_parallel_plan() is None, reason="this build has no tensor-parallel sharding plan")
@pytest.mark.parametrize("zero", [2, 3])
def test_one_stage_runs_torchtitans_loop_and_meets_the_layout_model(zero):
    """pp = 1 runs no ``PipelineStage``: each micro-batch's forward and backward in turn, FSDP2 resharding and
    reduce-scattering in every backward (no unsharded gradient at the peak), as the layout model prices it: on
    tp 2 x dp 2 every rank within -2 % .. +5 % of ``rank_memory`` (a Llama-style decoder; through
    ``PipelineStage`` it was +11 %). Above that, a rank may hold the unsharded gradients of up to two more layers
    while gloo's thread runs their reduce-scatters late on a loaded machine (seen: +6.0 % on one rank of a clean
    CI run, +0.1 % on a rerun): that timing is not the model's, so the upper bound allows it, no more."""
    from functools import partial

    from workbench.model.target import Target
    from workbench.parallel.data import rank_memory
    from workbench.parallel.run.workloads import hf_workload, workload_example
    from workbench.parallel.tensor.profile import tensor_parallel_profile
    from workbench.planners import plan as make_plan

    wl = hf_workload("llama", batch_size=2, sequence=32, layers=4, hidden=64, heads=8, kv_heads=4, vocab=512)
    chain = tensor_parallel_profile(partial(workload_example, wl), "h100-sxm", 2, cache=False)
    platform = Target.of(1, optimizer="adam", zero_grad="none")
    layout = Layout(tp=2, dp=2, zero=zero)
    planned = make_plan(chain, platform, "1f1b", micro_batches=2)
    cfg = layout_config(wl, layout, micro_batches=2)
    cfg = type(cfg)(**{**cfg.__dict__, "plan": planned})
    parts = run_layout(cfg)
    assert layout_gradient_errors(parts, wl, layout, 2, say=lambda *a, **k: None)[1] < 1e-4
    for p in parts:
        assert p["memory_breakdown"]["Unsharded Grad"] == 0 and "pipeline_receive" not in p["collectives"]
        predicted = rank_memory(planned, chain, platform, layout, p["rank"])
        late = sum(sorted(l.weight_bytes for l in chain.layers)[-2:])   # two layers' unsharded gradients
        assert -0.02 <= p["memory_peak"] / predicted - 1 <= 0.05 + late / predicted, (p["rank"], late, predicted)
