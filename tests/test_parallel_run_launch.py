"""workbench.parallel.run.launch: a rank that fails stops every rank, and the error says which and why."""

import time
from functools import partial

import pytest

from layout_runs import layout_config
from workbench.model.layout import Layout
from workbench.parallel.run.launch import RankFailure, run_layout
from workbench.parallel.run.tensor import tensor_parallel_plan
from workbench.profiles.workload import Workload


def _batch_failing_from(first_bad: int, i: int):
    """The zoo MLP's mini-batch ``i``, or a failure for ``i >= first_bad`` (replica 1's micro-batches)."""
    if i >= first_bad:
        raise ValueError(f"mini-batch {i} is unreadable")
    return Workload.zoo("mlp", 4).batch(i)


def test_a_failing_rank_stops_every_rank_and_is_named():
    good = Workload.zoo("mlp", 4)
    wl = Workload(good.build, partial(_batch_failing_from, 2), good.loss, name="mlp", batch_size=4)
    cfg = layout_config(good, Layout(pp=2, dp=2), micro_batches=2, timeout=120.0)
    cfg = type(cfg)(**{**cfg.__dict__, "workload": wl})
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as failed:
        run_layout(cfg)
    assert time.monotonic() - t0 < 60            # stopped, not left to time out
    e = failed.value
    pp, dp, tp = e.coords
    assert dp == 1 and e.rank in (1, 3)             # replica 1's ranks read mini-batches 2 and 3
    assert "ValueError: mini-batch 2 is unreadable" in str(e) and "every rank was stopped" in str(e)
    assert str(e).startswith(f"rank {e.rank} (pp {pp}, dp 1, tp 0) failed")


@pytest.mark.skipif(tensor_parallel_plan() is None, reason="this build has no tensor-parallel sharding plan")
def test_ranks_forked_after_a_fake_tensor_parallel_profile_train_as_one_process():
    """A fake profile at tp = 2 leaves DTensor's caches keyed by a mesh equal to the ranks' own tp mesh (pp = dp =
    1: the whole world); the ranks must not reuse them (before: every gradient off by a relative ~1)."""
    from workbench.parallel.run.launch import layout_gradient_errors
    from workbench.parallel.run.workloads import hf_workload, workload_example
    from workbench.parallel.tensor.profile import tensor_parallel_profile

    wl = hf_workload("llama", batch_size=2, sequence=8, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64)
    tensor_parallel_profile(partial(workload_example, wl), "h100-sxm", 2, cache=False)
    cfg = layout_config(wl, Layout(tp=2), micro_batches=2)
    _, rel = layout_gradient_errors(run_layout(cfg), wl, cfg.layout, cfg.micro_batches, say=lambda *a, **k: None)
    assert rel < 1e-4
