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


def test_stage_offloads_hold_the_saved_tensors_off_the_device_between_forward_and_backward():
    """The life cycle both engines use: a store per (stage, mini-batch), out after the forward, back before
    the backward, gone after it; a stage not listed keeps its tensors. Gradients equal the plain model's."""
    from workbench.runtime.policy_layers import StageOffloads

    cfg = {"layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64}
    torch.manual_seed(0)
    model = zoo.build_model("gpt", **cfg)
    x, y = zoo.sample_batch("gpt", 2, **cfg)
    ref = _grads(model, x, y)
    wrapped = with_policies(model, ["keep", "offload", "offload", "keep"])
    wrapped.zero_grad()
    offloads = StageOffloads({0})
    losses = {}
    for i in (0, 1):                                      # two mini-batches in flight on stage 0
        with offloads.forward(0, i):
            losses[i] = zoo.loss_fn("gpt")(wrapped(x), y)
    with offloads.forward(1, 0):                          # stage 1 does not offload: no store
        pass
    assert sorted(offloads.held) == [(0, 0), (0, 1)]
    store = offloads.held[(0, 0)]
    assert store.out and store.items and all(isinstance(t, tuple) for t in store.items)   # host copies only
    for i in (0, 1):
        with offloads.backward(0, i):
            assert (0, i) not in offloads.held
            assert i == 1 or not store.out                # back on the device during its backward
            losses[i].backward()
    assert offloads.held == {}
    got = [p.grad / 2 for p in wrapped.parameters()]      # two identical mini-batches accumulated
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ref, got))
