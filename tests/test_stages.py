"""A plan's stages timed alone as one module each: the clock, the loss ending the last stage, bad stages."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from workbench.profiles.stages import time_stages


class _Sleepy(nn.Module):
    """A linear layer whose forward also sleeps: wall time without CPU time."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin, self.seconds = nn.Linear(4, 4), seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.lin(x)


class _Workload:
    """Just what time_stages reads of a Workload: its layers and its batch."""

    def __init__(self, modules, loss=None):
        self.modules, self.loss = modules, loss

    def layers(self):
        from workbench.profiles.discover import Layers

        return Layers(tuple(self.modules), tuple(str(i) for i in range(len(self.modules))), torch.ones(2, 4), "test",
                      tuple({} for _ in self.modules), loss=self.loss)

    def batch(self, i):
        return torch.ones(2, 4), torch.zeros(2, 4)


def test_a_stage_is_its_layers_one_after_another_on_the_clock_asked_for():
    wl = _Workload([_Sleepy(0.01), _Sleepy(0.01), _Sleepy(0.02)])
    wall = time_stages(wl, [(0, 1), (2, 2)], warmup=0, repeats=1, clock="wall")
    cpu = time_stages(wl, [(0, 1), (2, 2)], warmup=0, repeats=1)
    assert wall[0][0] >= 0.02 and wall[1][0] >= 0.02          # both sleeps of stage 0, the one of stage 1
    assert all(f < 0.01 for f, _ in cpu)                        # CPU time: the sleeps do not count
    assert all(b > 0 for _, b in wall + cpu)


def test_the_loss_ends_the_last_stage():
    def slow_loss(out, target):
        time.sleep(0.03)
        return nn.functional.mse_loss(out, target)

    wl = _Workload([nn.Linear(4, 4), nn.Linear(4, 4)], loss=slow_loss)
    (f0, _), (f1, _) = time_stages(wl, [(0, 0), (1, 1)], warmup=0, repeats=1, clock="wall")
    assert f1 >= 0.03 > f0


def test_what_it_refuses():
    wl = _Workload([nn.Linear(4, 4)])
    with pytest.raises(ValueError, match="within"):
        time_stages(wl, [(0, 1)], warmup=0, repeats=1)
    with pytest.raises(ValueError, match="threads=1"):
        time_stages(wl, [(0, 0)], threads=2)


def test_a_plans_stages_of_a_zoo_model():
    from workbench.model.target import Target
    from workbench.profiles.profiler import profile_zoo
    from workbench.profiles.workload import Workload
    from workbench.schedules.builder import best_schedule

    chain = profile_zoo("tiny-gpt", 2, repeats=1, warmup=0)
    plan = best_schedule(chain, Target.of(2), [0, 0, 1, 1])
    times = time_stages(Workload.zoo("tiny-gpt", 2), plan.stages, warmup=1, repeats=3)
    assert len(times) == len(plan.stages) and all(f > 0 and b > 0 for f, b in times)
