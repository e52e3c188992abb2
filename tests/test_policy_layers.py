"""workbench.runtime.policy_layers: the policies as torch modules change memory, not gradients."""

from __future__ import annotations

import torch

from workbench.profiles import zoo
from workbench.profiles.memtrace import layer_memory
from workbench.runtime.policy_layers import Offloaded, Recomputed, with_policies


def _grads(model, x, y):
    model.zero_grad()
    zoo.loss_fn("gpt")(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_gradients_equal_the_plain_model():
    cfg = {"layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64}
    torch.manual_seed(0)
    model = zoo.build_model("gpt", **cfg)
    x, y = zoo.sample_batch("gpt", 2, **cfg)
    ref = _grads(model, x, y)
    for pol in (["recompute"] * 4, ["offload"] * 4, ["keep", "recompute", "offload", "keep"]):
        got = _grads(with_policies(model, pol), x, y)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ref, got)), pol


def test_offloaded_layer_leaves_nothing_on_the_device():
    torch.manual_seed(0)
    block, x = zoo.TransformerBlock(32, 2), torch.randn(2, 16, 32)
    plain = layer_memory(block, x, input_requires_grad=True)
    off = layer_memory(Offloaded(block), x, input_requires_grad=True)
    rec = layer_memory(Recomputed(block), x, input_requires_grad=True)
    assert off["saved_input_bytes"] == 0 and rec["saved_input_bytes"] == x.numel() * 4
    assert off["forward_peak_bytes"] < plain["forward_peak_bytes"]
