"""Small layout runs for the tests of workbench.parallel.run: hand-made pipeline plans, a config, the one-process
reference of a run with a learning rate (plain torch, sharing no code with the ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.model.layout import Layout
from workbench.model.plan import Plan, Stage
from workbench.parallel.run.config import LayoutConfig
from workbench.parallel.run.workloads import hf_workload
from workbench.profiles.workload import Workload, model_loss


def pipeline_plan(cuts: list[int], n_layers: int, schedule: str = "1f1b", micro_batches: int = 2) -> Plan:
    """A plan of ``len(cuts) + 1`` stages, stage s starting at layer ``cuts[s - 1]``, one per pipeline device."""
    bounds = [0, *cuts, n_layers]
    stages = tuple(Stage(a, b - 1, d, 0.0, 0.0, 1) for d, (a, b) in enumerate(zip(bounds, bounds[1:])))
    assignment = tuple(d for d, (a, b) in enumerate(zip(bounds, bounds[1:])) for _ in range(a, b))
    return Plan(1.0, assignment, stages, len(stages), memory=(0.0,) * len(stages), schedule=schedule,
                micro_batches=micro_batches)


def tiny_gpt2() -> Workload:
    """GPT-2 (head tied to the token embedding) with 5 layers: prologue, 2 blocks, final norm, head."""
    return hf_workload("gpt2", batch_size=2, sequence=8, layers=2, hidden=32, heads=4, vocab=64)


def mlp() -> Workload:
    """The zoo's MLP: fc1, relu1, fc2, relu2, fc3 (5 layers), a fresh batch per mini-batch."""
    return Workload.zoo("mlp", 4)


def layout_config(wl: Workload, layout: Layout, cuts: list[int] | None = None, micro_batches: int = 2,
                  **kw) -> LayoutConfig:
    n = len(wl.layers().names)
    cuts = cuts if cuts is not None else [n // 2] * (layout.pp > 1)
    return LayoutConfig(pipeline_plan(cuts, n, micro_batches=micro_batches), layout, wl, micro_batches, **kw)


def write_layout_plan(path: Path, plan: Plan, layout: Layout) -> Path:
    """``plan``'s JSON with the layout as its ``"parallel"`` object (what ``plan --parallel`` writes)."""
    d = plan.to_dict()
    d["parallel"] = layout.to_dict()
    path.write_text(json.dumps(d))
    return path


def sgd_reference(wl: Workload, dp: int, micro_batches: int, steps: int, lr: float) -> dict[str, torch.Tensor]:
    """One process, the whole model: ``steps`` SGD steps, each on the mean over the ``dp`` replicas of the sum
    of the gradients of their micro-batches (replica d: mini-batches d M .. d M + M - 1)."""
    model = wl.build()
    model.train()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        for i in range(dp * micro_batches):
            x, y = wl.batch(i)
            model_loss(wl, model, x, y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad / dp
    return {n: p.detach().clone() for n, p in model.named_parameters()}
