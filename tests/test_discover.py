"""Layer discovery (profiles/discover.py) on models written here: routes, ties, refusals with reasons."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from workbench.profiles.discover import DiscoveryError, discover_layers, find_ties


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, h: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        return h + torch.tanh(self.fc(h)) * (1.0 if scale is None else scale)


class Stack(nn.Module):
    """An embedding, repeated blocks fed a constant, a norm and a head sharing the embedding's weight."""

    def __init__(self, vocab: int = 11, d: int = 8, n: int = 3, scale_from_input: bool = False,
                 branch: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.scale_from_input, self.branch = scale_from_input, branch

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if self.branch and bool(ids.sum() < 0):      # control flow on values: torch.fx cannot trace it
            h = -h
        scale = ids.float().mean() / 10 if self.scale_from_input else torch.tensor(0.5)
        for b in self.blocks:
            h = b(h, scale=scale)
        return self.head(self.norm(h))


def _loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def test_blocks_route_with_constants_and_a_tie():
    torch.manual_seed(0)
    model, ids = Stack(), torch.randint(0, 11, (2, 5))
    found = discover_layers(model, ids, _loss, ids)
    assert found.how == "blocks at blocks"
    assert found.names == ("embed", "blocks.0", "blocks.1", "blocks.2", "norm", "head")
    assert [t.to_dict() for t in found.tied] == [{"owner": "embed", "layers": ["embed", "head"], "bytes": 11 * 8 * 4,
                                                  "parameter": "embed.weight"}]
    # run one after the other, the layers give the model's loss, and their parameters keep the model's names
    h = found.input
    for m in found.modules:
        h = m(h)
    assert torch.allclose(found.loss(h, ids), _loss(model(ids), ids))
    assert found.parameter_names[1] == {"target.fc.weight": "blocks.0.fc.weight", "target.fc.bias": "blocks.0.fc.bias"}


def test_a_block_argument_that_follows_the_input_is_refused():
    ids, y = torch.randint(0, 11, (2, 5)), torch.zeros(2, 5).long()
    # the blocks route refuses; the traced graph then sends the scale forward beside the hidden state
    found = discover_layers(Stack(scale_from_input=True), ids, _loss, y)
    assert found.how == "traced graph" and found.names == ("embed", "blocks.0", "blocks.1", "blocks.2", "norm", "head")
    h = found.modules[0](ids)
    assert tuple(h.shape) == (2 * 5 * 8 + 1,)              # the hidden state and the 0-d scale, packed
    with pytest.raises(DiscoveryError, match="(?s)'scale' changes with the input's values.*could not trace "
                                             "Stack.forward at test_discover.py"):
        discover_layers(Stack(scale_from_input=True, branch=True), ids, _loss, y)


class Skip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        return self.c(self.b(h)) + h          # h skips b and c: between them two tensors would cross


def test_traced_route_sends_a_skip_connection_forward():
    found = discover_layers(Skip(), torch.randn(2, 4))
    assert found.how == "traced graph" and found.names == ("a", "b", "c")
    assert [sorted(n for n, _ in m.named_children()) for m in found.modules] == [["a"], ["b"], ["c"]]
    x = found.input
    assert [tuple(h.shape) for h in (found.modules[0](x), found.modules[1](found.modules[0](x)))] == [(2, 4), (16,)]


class Extra(Stack):
    """Stack returning a dict: the logits and a tensor computed before the blocks."""

    def forward(self, ids: torch.Tensor) -> dict:
        h = self.embed(ids)
        aux = h.pow(2).mean()
        if self.branch and bool(ids.sum() < 0):      # control flow on values: torch.fx cannot trace it
            h = -h
        for b in self.blocks:
            h = b(h)
        return {"logits": self.head(self.norm(h)), "aux": aux}


def test_the_loss_gets_the_models_output_or_says_what_it_got():
    ids = torch.randint(0, 11, (2, 5))
    found = discover_layers(Extra(), ids, lambda out, y: _loss(out["logits"], y), ids)   # a dict, as returned
    assert found.how == "blocks at blocks"
    # a loss that needs "aux": the blocks route cannot carry it; the traced graph sends it forward, packed
    def with_aux(out, y):
        return _loss(out["logits"], y) + out["aux"]

    found = discover_layers(Extra(), ids, with_aux, ids)
    assert found.how == "traced graph" and len(found) == 6
    with pytest.raises(DiscoveryError, match=r"the loss got a dict with \['logits'\] from the last layer, "
                                             r"\['aux'\] None and failed \(TypeError: .*compute the loss from "
                                             r"\['logits'\] alone.*could not trace Extra.forward"):
        discover_layers(Extra(branch=True), ids, with_aux, ids)

def test_sequential_and_lists_keep_their_children():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    assert discover_layers(seq, torch.zeros(1, 2)).names == ("0", "1")
    assert discover_layers([nn.ReLU(), nn.Tanh()], torch.zeros(1, 2)).names == ("layer0", "layer1")


def test_find_ties_counts_each_shared_parameter_once():
    lin = nn.Linear(3, 3)
    ties = find_ties([lin, nn.ReLU(), nn.Sequential(lin)], ["a", "r", "b"])
    assert sorted(t.parameter for t in ties) == ["a.bias", "a.weight"]
    assert all(t.owner == "a" and t.layers == ("a", "b") for t in ties)


def test_discovery_leaves_batchnorm_statistics_alone():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.fc = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(F.adaptive_avg_pool2d(self.bn(self.conv(x)), 1).flatten(1))

    net = Net()
    before = net.bn.running_mean.clone()
    discover_layers(net, torch.randn(4, 1, 6, 6))
    assert torch.equal(net.bn.running_mean, before) and int(net.bn.num_batches_tracked) == 0
