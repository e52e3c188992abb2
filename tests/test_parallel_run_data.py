"""workbench.parallel.run.data: every ZeRO level's gradients equal one process's (dp alone and pp x dp), and
what each level keeps per rank as torch's own trackers see it."""

import pytest
import torch

from layout_runs import layout_config, mlp
from workbench.model.layout import Layout
from workbench.parallel.run.data import ZERO_PIECES, make_layout_optimizer, zero_grads
from workbench.parallel.run.launch import layout_gradient_errors, run_layout
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
