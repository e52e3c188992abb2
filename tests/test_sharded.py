"""Tests for workbench.parallel.tensor.sharded: the helpers around a rank's sharded profile (the profile itself is
checked against independent counts in tests/test_tensor_parallel_profile.py)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from workbench.model.accelerators import accelerator
from workbench.model.chain import Chain, Layer
from workbench.parallel.tensor.comm import Collective
from workbench.parallel.tensor.sharded import build_of, first_tensor, tp_meta, with_collectives
from workbench.parallel.tensor.times import TensorParallelTimes


def test_first_tensor_in_nested_inputs():
    ids = torch.zeros(2, 8, dtype=torch.long)
    assert first_tensor({"input_ids": ids, "labels": torch.ones(2, 8)}) is ids
    assert first_tensor((3, [None, ids])) is ids
    assert first_tensor({"n": 3, "s": "x"}) is None


def build(batch_size: int = 2):
    model = nn.Linear(4, 3)
    return model, torch.randn(batch_size, 4), torch.zeros(batch_size, 3), nn.MSELoss()


def test_build_of_a_callable_passes_the_batch_size_and_seeds():
    model, x, _, _ = build_of(build, micro_batch_size=5)()
    assert x.shape == (5, 4)
    a, b = build_of(build, seed=1)(), build_of(build, seed=1)()
    assert torch.equal(a[0].weight, b[0].weight) and torch.equal(a[1], b[1])       # same seed, same draws
    assert not torch.equal(a[0].weight, build_of(build, seed=2)()[0].weight)


def test_build_of_refuses_a_batch_size_the_function_does_not_take():
    def fixed():
        return build()

    with pytest.raises(ValueError, match=r"^micro-batch size 4: .*fixed takes no batch_size argument$"):
        build_of(fixed, micro_batch_size=4)
    assert build_of(fixed)()[1].shape == (2, 4)          # without a batch size it is called as it is


def test_build_of_a_spec_loads_the_file(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def make(batch_size=3):
            return nn.Linear(4, 2), torch.randn(batch_size, 4), torch.zeros(batch_size, 2), nn.MSELoss()

        def fixed():
            return make()
    """))
    model, x, y, loss = build_of(f"{path}:make", micro_batch_size=6, seed=3)()
    assert isinstance(model, nn.Linear) and x.shape == (6, 4) and y.shape == (6, 2)
    again = build_of(f"{path}:make", micro_batch_size=6, seed=3)()
    assert torch.equal(model.weight, again[0].weight)
    with pytest.raises(ValueError, match="takes no batch_size argument"):
        build_of(f"{path}:fixed", micro_batch_size=6)()


def test_with_collectives_sums_each_layer_by_phase():
    chain = Chain((Layer("a", 1, 1), Layer("b", 1, 1), Layer("c", 1, 1)), meta={"network": "n"})
    times = TensorParallelTimes(accelerator("h100-sxm"), 2)
    times.collectives = [
        [Collective("forward", "all_reduce", 100), Collective("backward", "all_reduce", 100),
         Collective("forward", "all_gather", 30)],
        [],
        [Collective("backward", "reduce_scatter", 7)],
    ]
    times.overlap = [(2e-6, 1e-6, 1e-6, 0.5e-6), (0.0, 0.0, 0.0, 0.0), (0.0, 3e-6, 0.0, 2e-6)]
    out = with_collectives(chain, times)
    assert [(l.comm_forward_bytes, l.comm_backward_bytes) for l in out.layers] == [(130, 100), (0, 0), (0, 7)]
    assert [(l.comm_forward, l.comm_backward, l.exposed_forward, l.exposed_backward) for l in out.layers] == \
        times.overlap
    assert out.meta["network"] == "n"
    assert out.meta["tp_collectives"] == ("forward: 1 all_reduce (100 B), 1 all_gather (30 B); "
                                          "backward: 1 all_reduce (100 B), 1 reduce_scatter (7 B)")
    assert chain.layers[0].comm_forward_bytes is None          # the chain given is left as it was
    times.overlap = times.overlap[:2]
    with pytest.raises(ValueError):                            # one record per layer, or nothing is made
        with_collectives(chain, times)


def test_tp_meta_names_the_gpu_and_rank():
    acc = accelerator("h100-sxm")
    meta = tp_meta(acc, TensorParallelTimes(acc, 4), 3)
    assert meta["gpu"] == "h100-sxm" and meta["times"] == "estimated"
    assert meta["tp_rank"].startswith("3 ") and "over 4 ranks" in meta["timing"]
    assert all(isinstance(v, str) for v in meta.values())
