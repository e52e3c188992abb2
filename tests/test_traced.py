"""Discovery's traced route (profiles/traced.py): one layer per block, skips and functional code between blocks,
several tensors across a boundary packed into one, the model's output handed to the loss, and the reasons."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from workbench.profiles.discover import DiscoveryError, discover_layers
from workbench.profiles.traced import units


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(F.gelu(self.norm(x)))


class Residual(nn.Module):
    """Blocks in a ModuleList, a skip from the stem across three blocks, a functional mean before the head."""

    def __init__(self, d: int = 16, n: int = 6) -> None:
        super().__init__()
        self.stem = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        skip = h
        for i, b in enumerate(self.blocks):
            h = b(h)
            if i == 2:
                h = h + skip
        return self.head(h.mean(1))


def _chain_grads(found, target):
    """The chain run layer after layer, its loss's backward: gradients under the model's parameter names."""
    h = found.input
    for m in found.modules:
        h = m(h)
    found.loss(h, target).backward()
    grads = {}
    for m, names in zip(found.modules, found.parameter_names):
        for n, p in m.named_parameters():
            grads[names[n]] = p.grad.clone()
    return grads


def test_one_layer_per_block_with_a_skip_across_blocks_and_a_mean_before_the_head():
    torch.manual_seed(0)
    model, x, y = Residual(), torch.randn(4, 3, 8), torch.randint(0, 5, (4,))
    found = discover_layers(model, x, F.cross_entropy, y)
    assert found.how == "traced graph"
    assert found.names == ("stem", *(f"blocks.{i}" for i in range(6)), "head")
    # the skip leaves the stem and rejoins after blocks.2: packed beside the hidden state in between
    sizes = []
    h = found.input
    for m in found.modules:
        h = m(h)
        sizes.append(h.numel())
    hidden = 4 * 3 * 16
    assert sizes == [hidden, 2 * hidden, 2 * hidden, hidden, hidden, hidden, 4 * 16, 4 * 5]
    # gradients through the packed boundaries equal the model's own, parameter by parameter
    got = _chain_grads(found, y)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    want = {n: p.grad for n, p in model.named_parameters()}
    assert set(got) == set(want)
    assert all(torch.allclose(got[n], want[n], rtol=1e-5, atol=1e-7) for n in want)


def test_units_open_containers_and_keep_each_block_whole():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Module()
            self.trunk.layers = nn.ModuleList(nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(3))
            self.trunk.norm = nn.LayerNorm(2)
            self.head = nn.Sequential(nn.Linear(2, 2), nn.Tanh())

    assert units(Net()) == ["trunk.layers.0", "trunk.layers.1", "trunk.layers.2", "trunk.norm", "head.0", "head.1"]


class Masked(nn.Module):
    """Takes a dict: ids and a padding mask the blocks and the pooling read; a Python int crosses as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        n = ids.shape[1]
        keep = mask.unsqueeze(-1).float()
        for b in self.blocks:
            h = torch.tanh(b(h)) * keep + h
        return self.head((h * keep).sum(1) / n)


def test_the_models_other_inputs_reach_every_layer_that_reads_them():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (4, 6))
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[1, 3:] = 0
    y = torch.randint(0, 3, (4,))
    model = Masked()
    found = discover_layers(model, {"ids": ids, "mask": mask}, F.cross_entropy, y)
    assert found.names == ("embed", "blocks.0", "blocks.1", "blocks.2", "head")
    got = _chain_grads(found, y)
    model.zero_grad()
    F.cross_entropy(model(ids, mask), y).backward()
    assert all(torch.allclose(got[n], p.grad, rtol=1e-5, atol=1e-7) for n, p in model.named_parameters())
    # the mask matters: without it the gradients differ
    unmasked = Masked()
    unmasked.load_state_dict(model.state_dict())
    F.cross_entropy(unmasked(ids, torch.ones_like(mask)), y).backward()
    assert not torch.allclose(unmasked.blocks[0].weight.grad, model.blocks[0].weight.grad)


class Twin(nn.Module):
    """Returns a tuple: the logits and a hidden tensor from the first layer (carried to the end, packed)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(h))), h


class Ints(Twin):
    """An int tensor crosses beside the hidden state: the layers it spans merge."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        idx = h.argmax(-1)
        h = torch.relu(self.b(h)) + idx.unsqueeze(-1)
        return self.c(h)


def test_the_loss_gets_the_models_own_output_and_mixed_dtypes_merge():
    torch.manual_seed(0)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))

    def loss(out, y):
        return F.cross_entropy(out[0], y) + out[1].pow(2).mean()

    model = Twin()
    found = discover_layers(model, x, loss, y)
    assert found.names == ("a", "b", "c")
    h = found.input
    for m in found.modules:
        h = m(h)
    assert torch.allclose(found.loss(h, y), loss(model(x), y))
    assert discover_layers(Ints(), x, lambda o, y: F.cross_entropy(o, y), y).names == ("a+b", "c")


class Body(nn.Module):
    """Holds the blocks; its forward decides on values between them, which torch.fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            h = blk(h)
            if h.norm() > 0:
                h = h / 2
        return h


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.out = Body(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x))


class Inner(nn.Module):
    """Control flow on values inside a block: the block is called whole, never traced into."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h * 2 if h.sum() > 0 else h


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Inner() for _ in range(2))
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for blk in self.blocks:
            h = blk(h) + x
        return self.b(h)


def test_what_torch_fx_cannot_trace_is_named_with_its_module_and_line():
    with pytest.raises(DiscoveryError, match=r"could not trace body.forward at test_traced.py:\d+ "
                                             r"\('if h.norm\(\) > 0:'\): TraceError: .*move that code into an "
                                             "nn.Module of its own"):
        discover_layers(Nested(), torch.randn(3, 4))
    # the same code inside a block traces: the block is a unit
    assert discover_layers(Wrapped(), torch.randn(3, 4)).names == ("blocks.0", "blocks.1", "b")
