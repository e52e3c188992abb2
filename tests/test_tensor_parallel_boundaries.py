"""workbench.parallel.tensor.boundaries: the chain carries each rank's local tensor; DTensors rebuilt inside."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from workbench.parallel.tensor.boundaries import LocalLoss, LocalView, local_chain
from workbench.parallel.tensor.mesh import tp_mesh


class ToShard(nn.Module):
    """Returns its input as a DTensor split over dim 1 (as a sequence-parallel embedding does)."""

    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh

    def forward(self, x):
        return DTensor.from_local(x, self.mesh, (Replicate(),)).redistribute(self.mesh, (Shard(1),))


class Seen(nn.Module):
    def forward(self, x):
        self.got = x
        return x * 2


def test_only_dtensor_boundaries_are_wrapped_and_local_tensors_cross():
    with tp_mesh(2) as mesh:
        plain, first, middle = nn.Identity(), ToShard(mesh), Seen()
        modules, loss = local_chain([plain, first, middle], torch.ones(2, 8, 3), mesh, None)
        assert modules[0] is plain and isinstance(modules[1], LocalView) and isinstance(modules[2], LocalView)
        assert modules[1].placements is None and modules[2].placements == (Shard(1),)
        h = torch.ones(2, 8, 3)
        for m in modules:
            h = m(h)
        assert not isinstance(h, DTensor) and tuple(h.shape) == (2, 4, 3)     # the rank's half of the sequence
        assert isinstance(middle.got, DTensor) and tuple(middle.got.shape) == (2, 8, 3)
        assert loss is None


def test_a_dtensor_output_hands_the_loss_a_dtensor():
    seen = []

    def loss_fn(out, target):
        seen.append(out)
        return (out * target).sum()

    with tp_mesh(2) as mesh:
        modules, loss = local_chain([ToShard(mesh)], torch.ones(2, 8), mesh, loss_fn)
        assert isinstance(loss, LocalLoss) and loss.placements == (Shard(1),)
        got = loss(modules[0](torch.ones(2, 8)), 3.0)
    assert isinstance(seen[-1], DTensor) and tuple(seen[-1].shape) == (2, 8) and seen[-1].placements == (Shard(1),)
    assert type(got) is torch.Tensor and got.dim() == 0               # the loss's DTensor made whole
