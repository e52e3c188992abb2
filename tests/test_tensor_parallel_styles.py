"""workbench.parallel.tensor.styles: one hidden-state input per sub-block, by position or by keyword; GPT-2's
Conv1D split column-wise (its fused q | k | v with each rank's heads) and row-wise."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from workbench.parallel.tensor.mesh import tp_mesh
from workbench.parallel.tensor.styles import (
    Conv1DColwise,
    Conv1DRowwise,
    PrepareHiddenState,
    fused_order,
    is_conv1d,
    model_order,
)


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


def test_fused_order_hands_each_rank_its_heads_of_every_part():
    # q | k | v of 8 columns each (4 heads of 2), 2 ranks: rank r's contiguous half holds heads 2r, 2r + 1 of each
    order = fused_order(24, 3, 2)
    for r in range(2):
        assert order[12 * r:12 * (r + 1)].tolist() == [8 * p + c for p in range(3) for c in range(4 * r, 4 * r + 4)]
    assert torch.equal(fused_order(24, 3, 1), torch.arange(24))
    with pytest.raises(ValueError, match="20 fused columns do not split into 3 parts over tp=2"):
        fused_order(20, 3, 2)


def test_model_order_undoes_the_permutation_along_its_dimension():
    w = torch.randn(5, 24)
    permuted = w[:, fused_order(24, 3, 4)]
    assert not torch.equal(permuted, w) and torch.equal(model_order(permuted, 1, 3, 4), w)


@pytest.mark.parametrize("rank", [0, 1])
def test_conv1d_styles_shard_as_megatron(rank):
    """Each rank's local parameters are the columns (rows) Megatron gives it: its heads' q, k, v of a fused
    projection. Each rank distributes its own copy (``src_data_rank=None``: nothing is sent on the fake group)."""
    from transformers.pytorch_utils import Conv1D

    fused, row, linear = Conv1D(24, 8), Conv1D(8, 16), nn.Linear(8, 6)
    wf, bf, wr, br = (t.detach().clone() for t in (fused.weight, fused.bias, row.weight, row.bias))
    with tp_mesh(2, rank=rank) as mesh:
        parallelize_module(fused, mesh, Conv1DColwise(parts=3), src_data_rank=None)
        parallelize_module(row, mesh, Conv1DRowwise(), src_data_rank=None)
        parallelize_module(linear, mesh, Conv1DColwise(), src_data_rank=None)      # torch's ColwiseParallel
        mine = [8 * p + c for p in range(3) for c in range(4 * rank, 4 * rank + 4)]
        assert torch.equal(fused.weight.to_local(), wf[:, mine]) and torch.equal(fused.bias.to_local(), bf[mine])
        assert fused.weight.placements == (Shard(1),) and fused.bias.placements == (Shard(0),)
        assert torch.equal(row.weight.to_local(), wr[8 * rank:8 * rank + 8]) and row.bias.placements == (Replicate(),)
        assert torch.equal(row.bias.to_local(), br) and linear.weight.placements == (Shard(0),)
        out = fused(torch.randn(2, 3, 8))                      # the rank's local columns, as a plain tensor
        assert not isinstance(out, DTensor) and tuple(out.shape) == (2, 3, 12)
        assert tuple((row(torch.randn(2, 3, 8)) * 1).shape) == (2, 3, 8)       # its all-reduce waited
    with tp_mesh(2) as mesh, pytest.raises(ValueError, match="a fused Linear is split as a Conv1D only"):
        parallelize_module(nn.Linear(8, 24), mesh, Conv1DColwise(parts=3))
    assert is_conv1d(Conv1D(4, 2)) and not is_conv1d(nn.Linear(2, 4))
