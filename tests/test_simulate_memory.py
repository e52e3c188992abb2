"""The memory timeline of a run (workbench.schedules.simulate_memory) against a brute-force count.

* memory_frame on random hold intervals and operations: at every row's instant, the bytes held are
  recounted from the half-open intervals [start, end) that contain it (releases before acquisitions);
* StageMemory against the memory model's stage terms;
* with_step_rows: one row per device after the flush, holding its largest optimizer step.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_memory import measured_chain
from workbench.model.memory import layer_terms, stage_activation, stage_memory, stage_step
from workbench.model.target import Target
from workbench.schedules.simulate import simulate_flushed
from workbench.schedules.simulate_memory import StageMemory, memory_frame, with_step_rows


def held_at(t: float, p: int, dev, sm: StageMemory, hs, he, ops) -> tuple[float, float, float]:
    """Activations, weights and transient device p holds just after instant t, counted directly."""
    act = weights = trans = 0.0
    for s in (s for s in range(len(dev)) if dev[s] == p):
        n = int(np.sum((hs[s] <= t) & (t < he[s])))
        act += n * sm.A[s]
        weights += sm.static[s] + max(n - 1, 0) * sm.stash[s]
    if any(d == p for d in dev):
        weights += sm.const
    for s, starts, ends in ops:
        if dev[s] == p:
            trans += int(np.sum((starts <= t) & (t < ends))) * sm.excess[s]
    return act, weights, trans


def test_memory_frame_against_a_direct_count():
    rng = np.random.default_rng(2)
    for trial in range(150):
        S, P, N = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 6))
        dev = [int(rng.integers(0, P)) for _ in range(S)]
        sm = StageMemory([float(x) for x in rng.integers(1, 50, S)], [float(x) for x in rng.integers(0, 90, S)],
                         [float(x) for x in rng.integers(0, 20, S)], [float(x) for x in rng.integers(0, 3, S) * 7],
                         float(rng.integers(0, 5)))
        hs = rng.integers(0, 20, (S, N)).astype(float)       # whole numbers: ties between events happen
        he = hs + rng.integers(1, 10, (S, N))
        ops = [(s, hs[s], hs[s] + rng.integers(1, 3, N)) for s in range(S)]
        df = memory_frame(P, dev, sm, hs, he, ops, 0.0, 30.0)
        for row in df.itertuples():
            want = held_at(row.time, row.device, dev, sm, hs, he, ops)
            assert (row.activations, row.weights, row.transient) == pytest.approx(want), (trial, row)
            assert row.total == pytest.approx(sum(want))
        for p in range(P):   # one row per distinct instant, in time order, the last holding nothing in flight
            times = df.loc[df["device"] == p, "time"].to_numpy()
            assert np.all(np.diff(times) > 0) and df.loc[df["device"] == p, "activations"].iloc[-1] == 0


def test_stage_memory_holds_the_models_terms():
    chain = measured_chain(np.random.default_rng(7), 5)
    plat = Target.of(2, optimizer="adam", weights="stash")
    runs = [(0, 1), (2, 4)]
    sm = StageMemory.of(chain, plat, runs, stash=True, step_in_ops=True)
    t = layer_terms(chain, plat)
    for s, (a, b) in enumerate(runs):
        assert sm.A[s] == stage_activation(t, a, b)
        assert sm.static[s] + sm.A[s] == pytest.approx(stage_memory(t, a, b, 1))
        assert sm.static[s] + 3 * sm.A[s] + 2 * sm.stash[s] == pytest.approx(stage_memory(t, a, b, 3))


def test_step_rows_after_the_flush():
    chain = measured_chain(np.random.default_rng(8), 4)
    assignment = [0, 0, 1, 1]
    stepped = 0
    for optimizer in ("sgd", "adam"):
        plat = Target.of(2, optimizer=optimizer)
        trace = simulate_flushed(chain, plat, assignment, 3)
        end = trace.meta["makespan"]
        last = trace.memory[trace.memory["time"] == end]
        t = layer_terms(chain, plat)
        for p, (a, b) in enumerate([(0, 1), (2, 3)]):
            step = stage_step(t, a, b)
            rows = last[last["device"] == p]
            if step > 0:
                stepped += 1
                assert rows["transient"].iloc[-1] == step and rows["activations"].iloc[-1] == 0
            else:
                assert rows.empty or rows["transient"].iloc[-1] == 0
        # each device whose step has temporaries gets one more row at the end
        again = with_step_rows(trace.memory, chain, plat, [(0, 1), (2, 3)], [0, 1], end)
        assert len(again) == len(trace.memory) + len(last[last["transient"] > 0])
    assert stepped >= 1     # adam's step has temporaries


def test_a_flush_under_zero_grad_none_holds_its_gradients_from_its_first_backwards_end():
    """GPipe, 2 stages of 2 layers of 100 weight bytes (gradients 200 bytes per stage): under ``zeros`` the
    gradients are resident; under ``none`` each device holds them only once its stage's first backward has
    ended (stage 0: 0B0 from 14 to 18, stage 1: 1B0 from 10 to 14), so its weights read 200 bytes less before."""
    from workbench.model.chain import Chain, Layer
    from workbench.schedules.simulate_memory import grad_windows

    chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 400, 10) for i in range(4)), input_bytes=10)
    runs = {z: simulate_flushed(chain, Target.of(2, optimizer="adam", zero_grad=z), [0, 0, 1, 1], 4, kind="gpipe")
            for z in ("none", "zeros")}
    first_end = {0: 18.0, 1: 14.0}
    for d in (0, 1):
        none, zeros = (runs[z].memory[runs[z].memory["device"] == d] for z in ("none", "zeros"))
        assert none["time"].tolist() == zeros["time"].tolist()
        gap = (zeros["weights"].to_numpy() - none["weights"].to_numpy()).tolist()
        assert gap == [200.0 if t < first_end[d] else 0.0 for t in none["time"]]
    assert runs["none"].peak_memory()[0] < runs["zeros"].peak_memory()[0]   # its peak comes before any backward
    assert grad_windows([[2.0, 7.0]], [5.0, 10.0]) == [[(2.0, 5.0), (7.0, float("inf"))]]
