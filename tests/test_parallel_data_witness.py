"""The data-parallel witness (workbench.parallel.data.witness): torch's trackers see what each ZeRO level holds."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workbench.parallel.data.witness import fake_world, rank_peak


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(4)])
    x = torch.randn(8, 256)
    return model, x, x, torch.nn.functional.mse_loss


PARAMS = 4 * 256 * 256 * 4


def test_levels_hold_what_they_shard():
    """DDP holds parameters, gradients, buckets and Adam's two states; ZeRO-1 a quarter of the states (and of the
    step's temporaries); FSDP2 a quarter of everything but what it gathers."""
    ddp = rank_peak(build, dp=4, zero=0)
    zero1 = rank_peak(build, dp=4, zero=1)
    zero3 = rank_peak(build, dp=4, zero=3, fake=True)
    assert ddp >= 5 * PARAMS                                 # W + G + buckets + 2 states
    # three quarters of Adam's two states and of its foreach step's one temporary per parameter
    assert ddp - zero1 == pytest.approx(3 * PARAMS * 3 / 4, rel=0.05)
    assert zero3 < zero1


def test_the_world_is_torn_down():
    with fake_world(2):
        assert dist.get_world_size() == 2
    assert not dist.is_initialized()


def test_ddp_does_not_run_on_fake_tensors():
    with pytest.raises(ValueError, match="DDP"):
        rank_peak(build, dp=2, zero=0, fake=True)
