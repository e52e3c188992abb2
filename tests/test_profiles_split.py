"""The profiler's backward split against independent counts: a plain autograd run of the same layer."""

from __future__ import annotations

import torch

from workbench.profiles.profiler import profile_model
from workbench.profiles.split import layer_split, model_split, with_split
from workbench.profiles.timing import Timer


def test_pending_bytes_are_the_hidden_layers_output_gradients():
    """Linear -> GELU -> Linear on 8 rows: W needs the gradient at the first Linear's output (8 x 32 float32) and
    at the second's, which is the incoming gradient itself (held anyway): 1024 bytes."""
    mod = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    cols = layer_split(mod, torch.randn(8, 16), Timer(torch.device("cpu")), needs_input_grad=True, then=None,
                       grad=torch.randn(8, 16), warmup=0, repeats=1)
    assert cols["weight_pending_bytes"] == 8 * 32 * 4 and 0 < cols["backward_weight"] < 1


def test_the_first_layer_runs_its_whole_backward_as_w():
    cols = layer_split(torch.nn.Linear(4, 4), torch.randn(2, 4), Timer(torch.device("cpu")), needs_input_grad=False,
                       then=None, grad=torch.randn(2, 4), warmup=0, repeats=1)
    assert cols == {"backward_weight": 1.0, "weight_pending_bytes": 0.0}


def test_the_split_leaves_gradients_as_autograd_gives_them():
    """I then W (torch's two functions) accumulate the same weight gradient as one backward."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    x, g = torch.randn(4, 6, requires_grad=True), torch.randn(4, 3)
    torch.autograd.backward(mod(x), g)
    want = [p.grad.clone() for p in mod.parameters()]
    for p in mod.parameters():
        p.grad = None
    xi = x.detach().requires_grad_(True)
    _, groups = stage_backward_input([mod(xi)], [g], [xi], iter(mod.parameters()))
    stage_backward_weight(iter(mod.parameters()), groups)
    assert all(torch.allclose(p.grad, w) for p, w in zip(mod.parameters(), want))


def test_profiles_carry_the_measured_split_and_a_script_can_add_it():
    model = [torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)]
    chain = profile_model(model, torch.randn(4, 8), repeats=1, warmup=0)
    assert all(l.backward_weight is not None and l.backward_weight <= l.backward for l in chain.layers)
    assert chain.layers[1].backward_weight == 0.0 and "measured" in chain.meta["backward_split"]
    cols = model_split(torch.nn.Sequential(*model), torch.randn(4, 8), repeats=1, warmup=0)
    bare = chain.with_meta()
    redone = with_split(bare, cols, "test")
    assert [l.backward for l in redone.layers] == [l.backward for l in chain.layers]
    assert redone.meta["backward_split"] == "test"
