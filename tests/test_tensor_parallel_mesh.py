"""workbench.parallel.tensor.mesh: a fake group of tp ranks, started and ended; a running group used."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from workbench.parallel.tensor.mesh import tp_mesh


def test_fake_group_is_started_and_ended():
    assert not dist.is_initialized()
    with tp_mesh(4) as mesh:
        assert mesh.size() == 4 and dist.get_world_size() == 4 and dist.get_backend() == "fake"
        assert mesh.mesh_dim_names == ("tp",)
    assert not dist.is_initialized()


def test_a_running_group_is_used_and_must_have_tp_ranks():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with tp_mesh(2) as mesh:
            assert mesh.size() == 2
        assert dist.is_initialized()                  # not ours: left running
        with pytest.raises(ValueError, match="tp=4, but the running process group has 2 ranks"):
            with tp_mesh(4):
                pass
    finally:
        dist.destroy_process_group()
