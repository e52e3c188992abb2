"""Tests for workbench.profiles.blocks_route: discovery's route over a list of repeated blocks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.profiles.blocks_route import blocks_route, output_loss, record_calls, seeded, short_name
from workbench.profiles.wrappers import DiscoveryError

D = 8


class Cache:
    """State the blocks would share (a key/value cache)."""


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.fc = nn.Linear(D, D)
        self.drop = nn.Dropout(0.1)

    def forward(self, h, mask=None, cache=None):
        y = self.fc(self.ln(h))
        if mask is not None:
            y = y * mask
        return h + self.drop(y)


class Toy(nn.Module):
    """A small language model: embeddings (the prologue), blocks given a constant mask, a norm and a head.

    ``between``: what the forward does between blocks or after them, to break the route."""

    def __init__(self, n_blocks: int = 3, between: str = ""):
        super().__init__()
        self.wte = nn.Embedding(11, D)
        self.wpe = nn.Embedding(5, D)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 11)
        self.between = between
        self.register_buffer("mask", torch.tensor([1.0, 0.5] * (D // 2)))

    def forward(self, ids):
        h = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        order = range(len(self.blocks))
        if self.between == "reversed":
            order = reversed(order)
        for i in order:
            mask = self.mask
            if self.between == "mask from input":
                mask = self.mask * (1 + ids[..., :1, None].float())
            elif self.between == "mask with gradient":
                mask = self.mask * self.norm.weight
            kw = {"cache": Cache()} if self.between == "cache" else {}
            h = self.blocks[i](h, mask, **kw)
            if self.between == "scale" and i == 0:
                h = h * 2
        if self.between == "residual head":
            return self.head(self.norm(h) + h)
        return self.head(self.norm(h))


def ids(batch: int = 2, seq: int = 5) -> torch.Tensor:
    return torch.arange(batch * seq).reshape(batch, seq) % 11


def test_the_chain_of_layers_computes_the_model():
    torch.manual_seed(0)
    model = Toy().eval()
    x = ids()
    found = blocks_route(model, (x,), {}, None, None)
    assert found.names == ("wte+wpe", "blocks.0", "blocks.1", "blocks.2", "norm", "head")
    assert found.how == "blocks at blocks" and found.input is x and found.loss is None
    h = x
    for layer in found.modules:
        h = layer(h)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)
    # a batch of other ids through the same layers: the chain is not the recorded values replayed
    y = (x + 3) % 11
    h = y
    for layer in found.modules:
        h = layer(h)
    torch.testing.assert_close(h, model(y), rtol=0, atol=0)


def test_a_block_layer_is_the_block_called_with_its_constant_argument():
    torch.manual_seed(0)
    model = Toy().eval()
    found = blocks_route(model, (ids(),), {}, None, None)
    layer = found.modules[2]
    assert any(b.shape == model.mask.shape and torch.equal(b, model.mask) for b in layer.buffers())
    h = torch.randn(3, 4, D)                 # any hidden state, of another batch and sequence
    torch.testing.assert_close(layer(h), model.blocks[1](h, model.mask), rtol=0, atol=0)


def test_loss_of_the_model_output_passes_through():
    model = Toy().eval()
    loss = nn.CrossEntropyLoss()
    found = blocks_route(model, (ids(),), {}, lambda out, t: loss(out.flatten(0, 1), t.flatten()), ids())
    out = model(ids()).detach()
    assert float(found.loss(out, ids())) == pytest.approx(float(loss(out.flatten(0, 1), ids().flatten())))


@pytest.mark.parametrize("between, message", [
    ("reversed", r"^'blocks' holds 3 blocks but the forward called \['blocks.2', 'blocks.1', 'blocks.0'\] "
                 r"\(each must run once, in order\)$"),
    ("scale", r"^block 'blocks.1' does not receive the previous block's output as its argument 0"),
    ("mask from input", r"^block 'blocks.0': argument 1 changes with the input's values"),
    ("mask with gradient", r"^block 'blocks.0': argument 1 carries a gradient"),
    ("cache", r"^block 'blocks.0': 'cache' is a Cache, state the blocks share"),
    ("residual head", r"^module 'head' after the last block is not fed the previous module's output alone"),
])
def test_models_that_compute_outside_their_blocks_are_refused(between, message):
    with pytest.raises(DiscoveryError, match=message) as e:
        blocks_route(Toy(between=between).eval(), (ids(),), {}, None, None)
    assert "\n" not in str(e.value)


def test_a_model_without_a_block_list():
    with pytest.raises(DiscoveryError, match="^no nn.ModuleList of repeated blocks$"):
        blocks_route(nn.Sequential(nn.Linear(2, 2)), (torch.zeros(1, 2),), {}, None, None)


def test_record_calls_orders_and_nests():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    rec = record_calls(model, (torch.zeros(1, 2),), {})
    assert [c.path for c in rec.calls] == ["0", "1.0", "1.1", "1"]        # in the order they ended
    assert [c.path for c in rec.outermost(rec.calls)] == ["0", "1"]       # in the order they started
    by = {c.path: c for c in rec.calls}
    assert by["1"].start < by["1.0"].start < by["1.0"].end < by["1.1"].start < by["1.1"].end < by["1"].end
    assert not model._forward_hooks and not model[0]._forward_pre_hooks      # hooks removed


def test_seeded_draws_the_same_dropout_and_restores_the_generator():
    drop = nn.Dropout(0.5)
    x = torch.ones(64)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b = seeded(drop, x), seeded(drop, x)
    torch.testing.assert_close(a, b)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_output_loss_finds_the_last_layer_in_the_model_output():
    last = torch.arange(3.0)
    assert output_loss(last, last, None, "head") is None
    fn = lambda out, t: out["logits"].sum() * t   # noqa: E731
    rebuilt = output_loss({"logits": last, "n": 2}, last, fn, "head")
    assert float(rebuilt(torch.ones(3), 2.0)) == 6.0       # the loss of the structure rebuilt around the tensor
    with pytest.raises(DiscoveryError, match="^the model returns a float32 tensor of shape \\(3,\\), not the output "
                                             "of its last module 'head'$"):
        output_loss(last + 1, last, fn, "head")
    with pytest.raises(DiscoveryError, match="^none of the model's outputs"):
        output_loss((last + 1, 3), last, fn, "head")


def test_short_name():
    assert short_name("a" * 60) == "a" * 60
    long = short_name("b" * 61)
    assert len(long) == 60 and long.endswith("...")
