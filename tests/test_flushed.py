"""Tests for workbench.planners.flushed (GPipe and 1F1B on dp's partition)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from instances import baseline_chain
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.flushed import plan_1f1b, plan_gpipe


def stage_AW(chain, st):
    A = sum(chain.saved(i) for i in range(st.first, st.last + 1))
    W = sum(l.weight_bytes for l in chain.layers[st.first:st.last + 1])
    return A, W


@pytest.mark.parametrize("seed", range(6))
def test_textbook_memory(seed):
    rng = np.random.default_rng(seed)
    chain = baseline_chain(rng, int(rng.integers(4, 14)))
    P, m = int(rng.integers(2, 5)), int(rng.integers(1, 9))
    plat = Target.of(P, bandwidth=500.0, weight_factor=float(rng.choice([1.0, 4.0])), memory_model="paper")
    g = plan_gpipe(chain, plat, micro_batches=m)
    f = plan_1f1b(chain, plat, micro_batches=m)
    S = len(g.stages)
    assert g.assignment == plan_dp(chain, plat).assignment == f.assignment
    for s, st in enumerate(g.stages):
        A, W = stage_AW(chain, st)
        assert st.in_flight == m
        assert g.memory[st.device] == pytest.approx(m * A + plat.setup.weight_factor * W)
    for s, st in enumerate(f.stages):
        A, W = stage_AW(chain, st)
        k = min(m, S - s)
        assert st.in_flight == k
        assert f.memory[st.device] == pytest.approx(k * A + plat.setup.weight_factor * W)
    for p in (g, f):
        assert p.micro_batches == m and p.status == "feasible" and p.fits
        assert p.period == pytest.approx(p.extra["makespan"] / m)
        assert p.stages[0].fwd_start == pytest.approx(0.0)
        # micro-batch 0 goes forward through the stages in order
        assert all(b.fwd_start >= a.fwd_start for a, b in zip(p.stages, p.stages[1:]))
        # no flushed schedule beats the bottleneck of its partition
        assert p.period >= plan_dp(chain, plat).period * (1 - 1e-9)


def test_single_stage_makespan_is_exact():
    chain = Chain((Layer("a", 1.0, 2.0, 5, 1),), input_bytes=1)
    p = plan_gpipe(chain, Target.of(1, memory_model="paper"), micro_batches=5)
    assert p.period == pytest.approx(3.0) and p.memory == (5 * 1 + 5,)


def test_default_micro_batches_and_overflow_note():
    rng = np.random.default_rng(3)
    chain = baseline_chain(rng, 8)
    plat = Target.of(2, memory=50.0, memory_model="paper")
    p = plan_1f1b(chain, plat)
    assert p.micro_batches == 8 and p.schedule == "1f1b"
    assert not p.fits and any(n.startswith("does not fit") for n in p.notes)
    assert math.isfinite(p.period)


def test_cli(tmp_path):
    from workbench.front.cli import main
    from workbench.profiles import write_profile

    rng = np.random.default_rng(4)
    f = tmp_path / "toy.csv"
    write_profile(baseline_chain(rng, 9).with_meta(network="toy"), f)
    for method in ("gpipe", "1f1b"):
        out = tmp_path / f"{method}.json"
        rc = main(["plan", "--profile", str(f), "--devices", "3", "--method", method, "--micro-batches", "6",
                   "--json", str(out)])
        d = json.loads(out.read_text())
        assert rc == 0 and d["schedule"] == method and d["micro_batches"] == 6 and d["status"] == "feasible"
