"""Tests for workbench.runtime.training: optimizers by name, the training loops' zero_grad, fp32 master weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.runtime.training import OPTIMIZERS, ZERO_GRADS, MasterWeights, make_optimizer, zero_grad


@pytest.mark.parametrize("name, cls, momentum", [("sgd", torch.optim.SGD, 0), ("momentum", torch.optim.SGD, 0.9),
                                                 ("adam", torch.optim.Adam, None),
                                                 ("adamw", torch.optim.AdamW, None)])
def test_optimizers_by_name(name, cls, momentum):
    opt = make_optimizer(name, nn.Linear(2, 2).parameters(), lr=0.1)
    assert type(opt) is cls and opt.defaults["lr"] == 0.1
    if momentum is not None:
        assert opt.defaults["momentum"] == momentum


def test_no_optimizer_for_none_or_no_parameters_and_unknown_names():
    assert set(OPTIMIZERS) >= {"none", "sgd", "momentum", "adam", "adamw"}
    assert make_optimizer("none", nn.Linear(2, 2).parameters()) is None
    assert make_optimizer("adam", nn.ReLU().parameters()) is None
    with pytest.raises(ValueError, match="^unknown optimizer 'lamb'; known: none, "):
        make_optimizer("lamb", nn.Linear(2, 2).parameters())


def test_sgd_step_is_w_minus_lr_grad():
    lin = nn.Linear(3, 1, bias=False)
    w0 = lin.weight.detach().clone()
    opt = make_optimizer("sgd", lin.parameters(), lr=0.5)
    x = torch.tensor([[1.0, 2.0, 3.0]])
    lin(x).sum().backward()                       # d/dw (w . x) = x
    opt.step()
    torch.testing.assert_close(lin.weight.detach(), w0 - 0.5 * x)


def test_lr_zero_keeps_the_weights_but_allocates_the_state():
    lin = nn.Linear(3, 2)
    w0 = [p.detach().clone() for p in lin.parameters()]
    opt = make_optimizer("adam", lin.parameters())
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert all(torch.equal(p, q) for p, q in zip(lin.parameters(), w0))
    assert all(opt.state[p]["exp_avg"].shape == p.shape for p in lin.parameters())


def test_zero_grad_loops():
    p, frozen = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2), requires_grad=False)
    zero_grad([p, frozen], "zeros")
    assert p.grad.tolist() == [0.0, 0.0, 0.0] and frozen.grad is None     # allocated, frozen ones skipped
    buffer = p.grad
    (p * 2).sum().backward()
    zero_grad([p], "zeros")
    assert p.grad is buffer and p.grad.tolist() == [0.0, 0.0, 0.0]      # zeroed in place: the same buffer
    zero_grad([p], "none")
    assert p.grad is None
    assert ZERO_GRADS == ("none", "zeros")
    with pytest.raises(ValueError, match="^zero_grad must be one of none, zeros, got 'ones'$"):
        zero_grad([p], "ones")


@pytest.mark.parametrize("loop", ZERO_GRADS)
def test_master_weights_keep_updates_bf16_would_round_away(loop):
    """w = 1 in bf16 (spacing 2^-8 just below 1), gradient 1e-3, lr 1: a bf16 step rounds back to 1, the fp32
    master moves by the gradient (1e-3 as bf16 holds it) a step, and the bf16 copy is the master rounded."""
    g = torch.tensor(1e-3).to(torch.bfloat16).item()
    w = nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    mw = MasterWeights([w], "sgd", lr=1.0, loop=loop)
    for k in range(1, 11):
        zero_grad([w], loop)
        (w.float() * 1e-3).sum().backward()
        mw.step()
        assert mw.masters[0].dtype == torch.float32
        assert mw.masters[0].item() == pytest.approx(1 - k * g, abs=1e-6)
        assert w.item() == mw.masters[0].detach().to(torch.bfloat16).item()
    assert w.item() < 1.0
    plain = torch.ones(1, dtype=torch.bfloat16)
    assert (plain - 1e-3).item() == 1.0           # what a bf16 step alone would keep
    resident = [m.grad for m in mw.masters if m.grad is not None]
    assert len(resident) == (1 if loop == "zeros" else 0)       # under none the masters' gradients are freed
    assert len(mw.tensors()) == 1 + len(resident)


def test_master_weights_skip_frozen_parameters_and_parameters_without_gradient():
    a = nn.Parameter(torch.ones(2, dtype=torch.bfloat16))
    b = nn.Parameter(torch.full((2,), 3.0, dtype=torch.bfloat16))
    frozen = nn.Parameter(torch.ones(2, dtype=torch.bfloat16), requires_grad=False)
    mw = MasterWeights([a, b, frozen], "sgd", lr=1.0, loop="none")
    assert mw.params == [a, b]
    a.sum().backward()                             # b gets no gradient this step
    mw.step()
    assert a.tolist() == [0.0, 0.0] and b.tolist() == [3.0, 3.0]
