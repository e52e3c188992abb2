"""workbench.planners.torch_partition: the time-balanced partition against exhaustive search, the clock."""

from __future__ import annotations

import itertools
import random

import numpy as np

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.torch_partition import Balance, Clock, Spans


def _chain(rng: random.Random, L: int) -> Chain:
    return Chain(tuple(Layer(f"l{i}", rng.choice([0.0, rng.uniform(0.5, 2)]), rng.uniform(0.2, 4), rng.randint(0, 50),
                             rng.randint(1, 20), rng.randint(1, 40)) for i in range(L)), input_bytes=5)


def _partitions(L: int, S: int):
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = [0, *cuts, L]
        yield [(b[k], b[k + 1] - 1) for k in range(S)]


def test_the_least_largest_stage_time_against_every_partition():
    """Without caps and with a cap per stage: the partition found has the least largest stage time of every
    partition within the caps (exhaustive), and keeps the caps; None exactly when no partition does."""
    rng = random.Random(5)
    for trial in range(60):
        L, S = rng.randint(4, 9), rng.choice([2, 3, 4])
        if L < S:
            continue
        ch = _chain(rng, L)
        spans = Spans(ch, Target.of(2, memory_model=rng.choice(["paper", "full"])))
        prob = Balance(spans, [s % 2 for s in range(S)], [rng.randint(1, 4) for _ in range(S)], [0] * S)
        mem = [spans.stage_memory(prob.k[s], prob.p[s]) for s in range(S)]
        finite = [m[np.isfinite(m)] for m in mem]
        caps = [float(np.quantile(f, rng.uniform(0.3, 1.0))) for f in finite] if rng.random() < 0.6 else \
            [float("inf")] * S
        ok = [p for p in _partitions(L, S) if all(mem[s][a, b] <= caps[s] * (1 + 1e-9) for s, (a, b) in enumerate(p))]
        got = prob.least_tau(caps)
        assert (got is None) == (not ok), trial
        if got is None:
            continue
        best = min(max(float(spans.span(a, b)) for a, b in p) for p in ok)
        assert max(float(spans.span(a, b)) for a, b in got) == best, trial
        assert all(mem[s][a, b] <= caps[s] * (1 + 1e-9) for s, (a, b) in enumerate(got))
        assert got[0][0] == 0 and got[-1][1] == L - 1 and all(x[1] + 1 == y[0] for x, y in zip(got, got[1:]))


def test_a_row_of_stage_memory_is_the_matrixs():
    rng = random.Random(2)
    ch = _chain(rng, 12)
    spans = Spans(ch, Target.of(3))
    full = spans.stage_memory(3, 1)
    for a in range(12):
        assert np.array_equal(spans.stage_memory_row(3, 1, a), full[a])


def test_a_clock_past_its_end_stops_a_search_and_says_so():
    rng = random.Random(3)
    ch = _chain(rng, 30)
    spans = Spans(ch, Target.of(2, memory_model="paper"))
    prob = Balance(spans, [0, 1, 0, 1], [2, 2, 1, 1], [0] * 4)
    clock = Clock(0.0)
    assert prob.least_tau([1e9] * 4, clock) is None and clock.cut
    free = Clock(None)
    assert prob.least_tau([1e9] * 4, free) is not None and not free.cut
