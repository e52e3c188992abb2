"""The profiler's per-layer timing: repeats counted, gradients fresh each repeat, the clock and thread count."""

from __future__ import annotations

import time

import pytest
import torch

from workbench.profiles.timing import Timer, cpu_threads, leaf, time_layer


class _Counting(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(3, 2)
        self.calls = 0
        self.grads_seen: list[bool] = []

    def forward(self, x):
        self.calls += 1
        self.grads_seen.append(self.weight.grad is not None)
        return super().forward(x)


def test_warmup_runs_untimed_and_every_repeat_starts_without_gradients():
    mod = _Counting()
    fwd, bwd = time_layer(mod, torch.ones(4, 3), Timer(torch.device("cpu")), True, None, torch.ones(4, 2), 2, 3)
    assert mod.calls == 5 and len(fwd) == len(bwd) == 3
    assert mod.grads_seen == [False] * 5          # reset to None before each repeat
    # the last backward's gradient is d(sum of outputs)/dW = column sums of the input
    assert torch.equal(mod.weight.grad, torch.full((2, 3), 4.0))


def test_the_loss_ends_the_forward_and_starts_the_backward():
    mod = torch.nn.Linear(3, 1)
    x = torch.ones(2, 3)
    fwd, bwd = time_layer(mod, x, Timer(torch.device("cpu")), False, lambda o: o.sum() * 0.5, None, 0, 1)
    assert torch.allclose(mod.weight.grad, torch.full((1, 3), 1.0)) and bwd[0] > 0


def test_no_backward_without_anything_to_differentiate():
    fwd, bwd = time_layer(torch.nn.ReLU(), torch.ones(2, 2), Timer(torch.device("cpu")), False, None,
                          torch.ones(2, 2), 0, 2)
    assert bwd == [0.0, 0.0] and all(t > 0 for t in fwd)


def test_timer_measures_what_runs_and_threads_come_back():
    result, seconds = Timer(torch.device("cpu")).run(lambda: time.sleep(0.02) or 7)
    assert result == 7 and 0.02 <= seconds < 1.0
    x = torch.ones(2, requires_grad=True)
    assert leaf(x, False) is not x and not leaf(x, False).requires_grad
    before = torch.get_num_threads()
    try:
        with cpu_threads(torch.device("cpu"), 1):
            raise KeyError("inside")
    except KeyError:
        pass
    assert torch.get_num_threads() == before


class _Sleepy(torch.nn.Module):
    """A layer whose forward sleeps 30 ms: wall time, no CPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        time.sleep(0.03)
        return self.lin(x)


def test_the_cpu_clock_counts_the_threads_work_and_not_its_waits():
    wall = Timer(torch.device("cpu")).run(lambda: time.sleep(0.03))[1]
    cpu = Timer(torch.device("cpu"), clock="cpu").run(lambda: time.sleep(0.03))[1]
    assert wall >= 0.03 and cpu < 0.01
    busy = Timer(torch.device("cpu"), clock="cpu").run(lambda: sum(range(2_000_000)))[1]
    assert busy > 0.005                                  # a loop's work does count
    with pytest.raises(ValueError, match="clock"):
        Timer(torch.device("cpu"), clock="tsc")


def test_a_cpu_clock_profile_leaves_out_what_the_layer_waits_and_says_so():
    from workbench.profiles.profiler import profile_model

    layers = [_Sleepy(), torch.nn.ReLU()]
    wall = profile_model(layers, torch.ones(2, 3), repeats=2, warmup=0)
    cpu = profile_model(layers, torch.ones(2, 3), repeats=2, warmup=0, clock="cpu")
    assert wall.layers[0].forward >= 0.03 and cpu.layers[0].forward < 0.01
    assert "perf_counter" in wall.meta["timing"] and "thread_time" in cpu.meta["timing"]
    with pytest.raises(ValueError, match="threads=1"):
        profile_model(layers, torch.ones(2, 3), repeats=1, clock="cpu", threads=2)
