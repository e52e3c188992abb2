"""Tests for workbench.profiles.found: what discovery finds (Layers, Tie) and the helpers its routes share."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from workbench.profiles.found import (
    chain_input,
    find_ties,
    finish_layers,
    is_fake_tensor,
    parameter_names,
    same_tensor,
    split_inputs,
    with_slot,
)
from workbench.profiles.wrappers import DiscoveryError, Slot


def test_same_tensor_on_values():
    x = torch.arange(6.0).reshape(2, 3)
    assert same_tensor(x, x) and same_tensor(x, x.clone()) and same_tensor(x, x[:, :])
    assert not same_tensor(x, x + 1)
    assert not same_tensor(x, x.double())                     # equal values, other dtype
    assert not same_tensor(x, x.reshape(3, 2))                # same values, other shape


def test_same_tensor_on_fake_tensors_compares_storage_and_view():
    real = torch.zeros(4, 4)
    with FakeTensorMode():
        a = torch.empty(4, 4)
        b = torch.empty(4, 4)
        assert is_fake_tensor(a) and not is_fake_tensor(real) and not is_fake_tensor(3)
        assert not same_tensor(a, real)
        assert same_tensor(a, a.view(4, 4))          # the same storage viewed the same way
        assert not same_tensor(a, b)                 # no values to compare: another storage is another tensor
        assert not same_tensor(a, a.t())             # same storage, other strides
        assert not same_tensor(a.view(16)[4:8].view(2, 2), a.view(16)[:4].view(2, 2))   # other offset


def test_split_inputs_forms_and_refusal():
    x = torch.zeros(2)
    assert split_inputs(x) == ((x,), {})
    assert split_inputs([x, 3]) == ((x, 3), {})
    args, kwargs = split_inputs({"input_ids": x})
    assert args == () and kwargs == {"input_ids": x}
    with pytest.raises(DiscoveryError, match="^example inputs must be a tensor, a tuple or a dict of them, got a int$"):
        split_inputs(7)


def test_with_slot_replaces_the_one_leaf_that_is_the_input():
    x, y = torch.zeros(2), torch.zeros(2)          # equal values, but only x is the input
    args, kwargs = with_slot((y, [x]), {"k": 1}, x)
    leaves = pytree.tree_leaves((args, kwargs))
    assert [type(l) for l in leaves] == [torch.Tensor, Slot, int]
    assert args[0] is y and kwargs == {"k": 1}
    with pytest.raises(DiscoveryError, match="appears 2 times"):
        with_slot((x, x), {}, x)
    with pytest.raises(DiscoveryError, match="appears 0 times"):
        with_slot((y,), {}, x)


def test_chain_input_is_the_first_tensor():
    a, b = torch.zeros(1), torch.ones(1)
    assert chain_input((1, a), {"b": b}) is a
    assert chain_input((), {"b": b}) is b
    with pytest.raises(DiscoveryError, match="^the example inputs hold no tensor$"):
        chain_input((1, "s"), {"n": None})


def test_find_ties_counts_each_shared_parameter_once_at_its_first_user():
    emb = nn.Embedding(10, 4)              # 40 floats
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight               # tied, as a language model's head
    mid = nn.Linear(4, 4)
    twice = nn.Sequential(mid, mid)        # a module using one parameter twice is no tie
    ties = find_ties([emb, twice, head], ["emb", "mid", "head"])
    assert [t.to_dict() for t in ties] == [{"owner": "emb", "layers": ["emb", "head"], "bytes": 10 * 4 * 4,
                                            "parameter": "emb.weight"}]
    assert find_ties([emb, mid], ["emb", "mid"]) == ()


def test_find_ties_names_the_parameter_as_the_model_does():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(5, 3)
            self.lm_head = nn.Linear(3, 5, bias=False)
            self.lm_head.weight = self.wte.weight

    lm = LM().to(torch.float64)
    (tie,) = find_ties([lm.wte, lm.lm_head], ["embed", "head"], lm)
    assert tie.parameter == "wte.weight" and tie.bytes == 5 * 3 * 8
    assert tie.layers == ("embed", "head") and tie.owner == "embed"
    assert parameter_names([lm.wte, lm.lm_head], ["embed", "head"], lm) == ({"weight": "wte.weight"},
                                                                            {"weight": "wte.weight"})
    assert parameter_names([lm.lm_head], ["head"], None) == ({"weight": "head.weight"},)


def test_finish_layers_refuses_repeated_names_and_keeps_the_rest():
    a, b = nn.Linear(2, 2), nn.ReLU()
    x = torch.zeros(1, 2)
    with pytest.raises(DiscoveryError, match="^layer names are not unique"):
        finish_layers(None, [a, b], ["l", "l"], x, "list", None)
    found = finish_layers(None, [a, b], ["l0", "l1"], x, "list", None)
    assert len(found) == 2 and found.input is x and found.how == "list" and found.tied == ()
    assert found.parameter_names == ({"weight": "l0.weight", "bias": "l0.bias"}, {})
