"""A rank's pieces (runtime/rank.py): optimizers, the allocator-level memory probe, the recorder."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.runtime.rank import MemoryProbe, Recorder, chain_input, make_optimizer


@pytest.mark.parametrize("name,state", [("none", 0), ("sgd", 0), ("momentum", 1), ("adam", 2), ("adamw", 2)])
def test_probe_counts_parameters_gradients_and_optimizer_state(name, state):
    """A Linear(16, 8) stepped once: parameters and gradient buffers at the peak, and after the step the
    resident state (parameters, gradients, the optimizer's) to the byte."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    w = sum(p.numel() * 4 for p in lin.parameters())
    for p in lin.parameters():
        p.grad = torch.zeros_like(p)
    opt = make_optimizer(name, lin.parameters())
    probe = MemoryProbe(torch.device("cpu"))
    with probe.tracking(lin, opt):
        x = torch.randn(4, 16)
        lin(x).sum().backward()
        if opt is not None:
            opt.step()
        after = probe.sample()
    b = probe.breakdown()
    assert b["Parameter"] == w and b["Gradient"] == w
    steps = 0 if state < 2 else 4 * 2          # adam keeps a float32 step count per parameter
    assert after[1] == 2 * w + state * w + steps and after[2] == sum(after[:2])
    assert probe.peak() == b["Total"] >= after[2]


def test_lr_zero_steps_leave_the_weights():
    lin = nn.Linear(3, 3)
    before = [p.detach().clone() for p in lin.parameters()]
    for name in ("sgd", "momentum", "adam", "adamw"):
        opt = make_optimizer(name, lin.parameters())
        lin(torch.ones(2, 3)).sum().backward()
        opt.step()
        assert all(torch.equal(a, p) for a, p in zip(before, lin.parameters())), name
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("lion", lin.parameters())


def test_recorder_rows_share_the_origin():
    rec = Recorder(1, cuda=False, origin=0.0)
    with rec.op("F", 0, 3):
        pass
    from workbench.model.plan import Plan, Stage

    plan = Plan(1.0, (0, 1), (Stage(0, 0, 0, 0.0, 1.0, 1), Stage(1, 1, 1, 0.0, 1.0, 1)), 2)
    (row,) = rec.rows(plan)
    assert row[:6] == (1, 0, 0, 0, "F", 3) and 0 < row[6] <= row[7]
    assert rec.cpu[0][:4] == (1, 0, "F", 3)


def test_chain_input_is_the_first_tensor():
    assert chain_input((torch.ones(1), torch.zeros(2))).shape == (1,)
    with pytest.raises(ValueError, match="no tensor"):
        chain_input({"a": 1})


def test_recorder_restart_forgets_the_marks_and_takes_the_origin():
    rec = Recorder(0, cuda=False)
    with rec.op("B", 0, 1):
        pass
    rec.restart(5.0)
    assert rec.marks == [] and rec.cpu == [] and rec.origin == 5.0


def test_rank_model_knows_which_of_its_stages_offload():
    """The one place the engines learn which stages offload: from the plan's per-layer policies."""
    from workbench.model.plan import Plan, Stage
    from workbench.profiles.workload import Workload

    cfg = {"layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64}
    wl = Workload.zoo("gpt", 2, **cfg)
    stages = (Stage(0, 1, 0, 0.0, 1.0, 1), Stage(2, 3, 1, 0.0, 1.0, 1))
    plan = Plan(1.0, (0, 0, 1, 1), stages, 2, activations=("keep", "offload", "recompute", "keep"))
    from workbench.runtime.rank import RankModel

    assert RankModel.build(plan, wl, 0, torch.device("cpu")).offload_stages == {0}
    assert RankModel.build(plan, wl, 1, torch.device("cpu")).offload_stages == frozenset()
    keep = plan.with_(activations=())
    assert RankModel.build(keep, wl, 0, torch.device("cpu")).offload_stages == frozenset()
