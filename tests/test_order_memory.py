"""Peaks read off an order: the model's (equal to the simulator's, tests/test_torch_schedules.py) and torch's
engine's buffers and sends in time, against hand counts."""

from __future__ import annotations

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.memory_views import torch_engine_extra
from workbench.model.plan import Plan, Stage
from workbench.model.target import Target
from workbench.schedules.order_memory import OrderMemory, engine_extra
from workbench.schedules.torch_orders import torch_order


def _chain(n: int, out: float = 10.0) -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, out, 0) for i in range(n)), input_bytes=4)


def test_looped_bfs_holds_every_micro_batch_at_the_turn():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 5) for i in range(4)), input_bytes=4)
    om = OrderMemory(ch, Target.of(2, memory_model="paper"), [0, 1, 0, 1], torch_order("looped-bfs", 2, 2, 4))
    assert om.peaks([(0, 0), (1, 1), (2, 2), (3, 3)]) == [40.0, 40.0]   # 2 stages x 4 micro-batches x 5 bytes


def test_torchs_engine_in_time_by_hand():
    """Looped BFS, 2 devices, 2 micro-batches, one layer per stage, outputs of 10 bytes, nothing saved, the
    chain's input 4 bytes; the paper model counts nothing of it, so the peak is the engine's part alone. Device
    0's peak is at its last operation, stage 0's backward of micro-batch 0: stage 0 holds 2 gradient buffers
    and 2 outputs sent, less the one in flight and the model's buffer (2 x 10), and the step's input less the
    one in flight (1 x 4); stage 2, nothing in flight, 2 input buffers and 2 gradients sent, 2 gradient buffers
    and 2 outputs sent, less the model's buffer each way (3 x 10 + 3 x 10)."""
    ch = _chain(4)
    order = torch_order("looped-bfs", 2, 2, 2)
    assert [str(a) for a in order[0]] == ["0F0", "0F1", "2F0", "2F1", "2B1", "2B0", "0B1", "0B0"]
    om = OrderMemory(ch, Target.of(2, memory_model="paper"), [0, 1, 0, 1], order)
    parts = [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert om.peaks(parts) == [0.0, 0.0]
    assert om.peaks(parts, engine=True)[0] == 2 * 10 + 1 * 4 + 3 * 10 + 3 * 10


def test_engine_extra_of_a_flushed_1f1b_is_the_documented_bound():
    ch = _chain(2)
    stages = (Stage(0, 0, 0, 0, 0, 2), Stage(1, 1, 1, 0, 0, 1))
    plan = Plan(1.0, (0, 1), stages, 2, schedule="1f1b", micro_batches=4)
    assert engine_extra(plan, ch, Target.of(2), 4) == torch_engine_extra(ch, stages, 2, 4)


def test_a_v_turn_keeps_its_buffers_but_sends_nothing():
    """ZB-V on 2 devices: stages 1 and 2 share device 1. With remote neighbours they would hold the sent tensors
    too; their local ones only the receive buffers."""
    ch = _chain(4)
    order = torch_order("zbv", 2, None, 4)
    om = OrderMemory(ch, Target.of(2, memory_model="paper"), [0, 1, 1, 0], order)
    parts = [(0, 0), (1, 1), (2, 2), (3, 3)]
    local = om.peaks(parts, engine=True)
    remote = OrderMemory(ch, Target.of(3, memory_model="paper"), [0, 1, 2, 0], {0: order[0], 1: tuple(
        a for a in order[1] if a.stage == 1), 2: tuple(a for a in order[1] if a.stage == 2)}).peaks(parts, engine=True)
    assert local[1] < remote[1] + remote[2]


def test_under_either_loop_the_peaks_equal_the_simulated_and_the_checked_ones():
    """Random chains with measured peaks (the fresh backward's above the accumulating one's by at most the
    gradients it writes), torch's orders on
    2 devices, both loops: the order's peaks equal the simulator's, and a plan's recorded memory passes the
    checker's own replay. Under ``none`` a device's peak is never above its peak under ``zeros``, and often below."""
    import random

    from workbench.planners import plan as run_planner
    from workbench.schedules.simulate_orders import simulate_order
    from workbench.verify.check import check

    rng, lower = random.Random(5), 0
    for _ in range(12):
        ch = Chain(tuple(Layer(f"l{i}", rng.uniform(0.5, 2), rng.uniform(1, 3), w := rng.choice([0.0, 40.0, 100.0]),
                               a := rng.uniform(10, 200), rng.uniform(5, 30), forward_peak_bytes=a * 1.5,
                               backward_peak_bytes=(b := rng.uniform(20, 300)),
                               backward_fresh_peak_bytes=b + w * rng.uniform(0.5, 1.0),
                               backward_weight=rng.choice([None, 0.4])) for i in range(rng.randint(4, 6))),
                   input_bytes=8)
        name = rng.choice(["looped-bfs", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev"])
        order = torch_order(name, 2, 2, 4)
        dev = [0, 1, 0, 1] if name.startswith(("looped", "interleaved")) else [0, 1, 1, 0]
        parts = [(0, 0), (1, 1), (2, 2), (3, len(ch) - 1)]
        peaks, optimizer = {}, rng.choice(["sgd", "adam"])
        for zero_grad in ("none", "zeros"):
            plat = Target.of(2, optimizer=optimizer, zero_grad=zero_grad)
            peaks[zero_grad] = OrderMemory(ch, plat, dev, order).peaks(parts)
            simulated = simulate_order(ch, plat, [(a, b, d) for (a, b), d in zip(parts, dev)], order, 4)
            assert peaks[zero_grad] == pytest.approx(simulated.peak_memory().tolist(), rel=1e-12)
            plan = run_planner(ch, plat, name, micro_batches=4)
            assert not check(plan, ch, plat), (name, zero_grad)
        assert all(n <= z for n, z in zip(peaks["none"], peaks["zeros"]))
        lower += any(n < z for n, z in zip(peaks["none"], peaks["zeros"]))
    assert lower >= 6      # a peak before a stage's first backward holds none of its gradients
