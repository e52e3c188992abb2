"""workbench.parallel.tensor.styles: one hidden-state input per sub-block, by position or by keyword."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from workbench.parallel.tensor.mesh import tp_mesh
from workbench.parallel.tensor.styles import PrepareHiddenState


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.seen = None

    def forward(self, hidden_states, scale=1.0):
        self.seen = hidden_states
        return (self.q(hidden_states) + self.k(hidden_states) + self.v(hidden_states)) * scale


def _backward_all_reduces(prepare: bool, **call) -> tuple[int, object]:
    module = Attention()
    plan = {n: ColwiseParallel() for n in ("q", "k", "v")}
    if prepare:
        plan[""] = PrepareHiddenState(Replicate(), Replicate())
    with tp_mesh(2) as mesh:
        parallelize_module(module, mesh, plan)
        x = torch.randn(3, 8, requires_grad=True)
        out = module(x, **call) if call else module(x)
        with CommDebugMode() as comm:
            out.sum().backward()
    return comm.get_total_counts(), module.seen


@pytest.mark.parametrize("by_keyword", [False, True])
def test_the_input_gradient_is_reduced_once(by_keyword):
    count, seen = _backward_all_reduces(True, **({"scale": 2.0} if by_keyword else {}))
    assert count == 1 and isinstance(seen, DTensor) and seen.placements == (Replicate(),)
    plain, seen = _backward_all_reduces(False)
    assert plain == 3 and not isinstance(seen, DTensor)          # torch's styles alone: once per projection


def test_keyword_input_is_converted_and_other_arguments_left():
    module = Attention()
    with tp_mesh(2) as mesh:
        parallelize_module(module, mesh, {"": PrepareHiddenState(Replicate(), Replicate())})
        module.q = module.k = module.v = nn.Identity()
        module(hidden_states=torch.ones(2, 8), scale=3.0)
        assert isinstance(module.seen, DTensor)
        with pytest.raises(ValueError, match="received no hidden state"):
            module(scale=1.0)
