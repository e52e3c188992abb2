"""Tests for workbench.runtime.torch_engine: a rank's program on torch.distributed.pipelining, its gradients
checked against one process's (:func:`workbench.runtime.gradients.reference_gradients`)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import workbench.runtime.torch_engine as te
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.profiles.profiler import profile_workload
from workbench.profiles.workload import Workload
from workbench.runtime.config import RunConfig
from workbench.runtime.engine import run_plan
from workbench.runtime.gradients import grad_error, reference_gradients
from workbench.runtime.worker import free_port
from workbench.schedules.program import programs_for

STEPS = 4


class Tied(nn.Module):
    """An embedding whose weight is also the head's (a language model's tie), two blocks between."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(h)


def tied(batch_size: int = 4):
    ids = torch.arange(batch_size * 3).reshape(batch_size, 3) % 16
    return Tied(), ids, ids, lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())


@pytest.fixture(scope="module")
def mlp():
    wl = Workload.zoo("mlp", 4)
    return wl, profile_workload(wl, repeats=1, warmup=0)


@pytest.fixture(scope="module")
def tied_run():
    """The tied model on 2 ranks, GPipe over 2 micro-batches, with the embedding and the head on different ranks."""
    wl = Workload.module(f"{__file__}:tied")
    chain = profile_workload(wl, repeats=1, warmup=0)
    plan = run_planner(chain, Target.of(2, optimizer="sgd"), "gpipe", micro_batches=2)
    device = {n: st.device for st in plan.stages for n in [l.name for l in chain.layers][st.first:st.last + 1]}
    assert device["emb"] != device["head"]
    return wl, plan


@pytest.fixture()
def group_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("method, m", [("gpipe", 2), ("1f1b", 4), ("dp", None)])
def test_one_rank_gradients_equal_one_process(mlp, group_of_one, method, m):
    wl, chain = mlp
    plan = run_planner(chain, Target.of(1, optimizer="sgd", weights="single"), method,
                       **({"micro_batches": m} if m else {}))
    res = te.run_torch_rank(0, 1, RunConfig(plan, programs_for(plan, STEPS), wl, STEPS, engine="torch",
                                            optimizer="sgd", weights="single"))
    assert res["engine"] == "torch" and res["rank"] == 0
    assert res["optimizer_steps"] == (STEPS // m if m else 1)      # a periodic plan: all steps in one
    kinds = [row[4] for row in res["ops"]]
    assert kinds.count("F") == kinds.count("B") == STEPS
    assert sorted(row[5] for row in res["ops"] if row[4] == "F") == list(range(STEPS))
    assert res["memory_peak"] > 0
    _, rel = grad_error(res["grads"], reference_gradients(wl, STEPS))
    assert rel <= 1e-6


def test_torch_schedule_is_torchs_class_timed(mlp, group_of_one):
    wl, chain = mlp
    plan = run_planner(chain, Target.of(1, optimizer="sgd"), "interleaved-1f1b", micro_batches=2, chunks=2)
    assert len(plan.stages) == 2
    res = te.run_torch_rank(0, 1, RunConfig(plan, programs_for(plan, STEPS), wl, STEPS, engine="torch",
                                            optimizer="sgd"))
    assert res["optimizer_steps"] == 2
    kinds = [(row[1], row[4]) for row in res["ops"]]
    assert kinds.count((0, "F")) == kinds.count((1, "F")) == STEPS
    _, rel = grad_error(res["grads"], reference_gradients(wl, STEPS))
    assert rel <= 1e-6


def test_a_tie_across_ranks_is_summed(tied_run):
    wl, plan = tied_run
    res = run_plan(plan, wl, STEPS, engine="torch", optimizer="sgd", start_method="fork")
    _, rel = grad_error(res.grads, reference_gradients(wl, STEPS))
    assert rel <= 1e-6


def test_without_the_tie_groups_the_shared_gradient_is_wrong(tied_run, monkeypatch):
    """The same run with the all-reduce of tied gradients taken out (inherited by the forked ranks): each rank
    keeps its own share of the embedding's gradient, which the comparison catches."""
    wl, plan = tied_run
    monkeypatch.setattr(te, "tie_groups", lambda model, plan, world: [])
    res = run_plan(plan, wl, STEPS, engine="torch", optimizer="sgd", start_method="fork")
    _, rel = grad_error(res.grads, reference_gradients(wl, STEPS))
    assert rel > 1e-3
