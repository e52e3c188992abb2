"""Tests for workbench.runtime.worker: a rank's process run in this process (a group of one), saved atomically."""

from __future__ import annotations

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist

from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.profiles.profiler import profile_workload
from workbench.profiles.workload import Workload
from workbench.runtime.config import RunConfig
from workbench.runtime.gradients import grad_error, reference_gradients
from workbench.runtime.worker import _save, free_port, isolated_entry, run_rank
from workbench.schedules.program import programs_for

STEPS = 4


@pytest.fixture(scope="module")
def mlp():
    wl = Workload.zoo("mlp", 4)
    return wl, profile_workload(wl, repeats=1, warmup=0)


def config(mlp, method: str, engine: str, **kw) -> RunConfig:
    wl, chain = mlp
    plan = run_planner(chain, Target.of(1, optimizer="sgd"), method, **kw)
    return RunConfig(plan, programs_for(plan, STEPS), wl, STEPS, engine=engine, optimizer="sgd")


def test_free_port_can_be_bound():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_save_replaces_atomically(tmp_path):
    _save({"rank": 1, "x": torch.ones(2)}, 1, str(tmp_path))
    _save({"rank": 1, "x": torch.zeros(2)}, 1, str(tmp_path))
    assert os.listdir(tmp_path) == ["rank1.pt"]                 # no temporary left beside it
    assert torch.load(tmp_path / "rank1.pt")["x"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("method, engine, kw", [("gpipe", "torch", {"micro_batches": 2}), ("dp", "pipedream", {})])
def test_run_rank_runs_the_engine_and_leaves_no_group(mlp, tmp_path, method, engine, kw):
    cfg = config(mlp, method, engine, **kw)
    run_rank(0, 1, cfg, str(tmp_path), init_method=f"tcp://127.0.0.1:{free_port()}")
    assert not dist.is_initialized()
    assert os.listdir(tmp_path) == ["rank0.pt"]
    res = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert res["rank"] == 0 and res["engine"] == engine
    kinds = [row[4] for row in res["ops"]]
    assert kinds.count("F") == kinds.count("B") == STEPS          # one stage: a forward and a backward a step
    err, rel = grad_error(res["grads"], reference_gradients(mlp[0], STEPS))
    assert rel <= 1e-6


def test_isolated_entry_runs_without_a_process_group(mlp, tmp_path):
    cfg = dataclasses.replace(config(mlp, "dp", "pipedream"), isolated=True)
    isolated_entry(0, 0, cfg, str(tmp_path))
    assert not dist.is_initialized()
    res = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert res["rank"] == 0 and res["engine"] == "pipedream"
