"""Tests for workbench.planners.baselines (uniform, parameters, torchgpipe)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from instances import baseline_chain, compositions
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.planners.baselines import (
    block_partition,
    parameters_partition,
    plan_parameters,
    plan_torchgpipe,
    plan_uniform,
    uniform_partition,
)
from workbench.verify.check import check


def covers(bounds, n):
    return bounds[0][0] == 0 and bounds[-1][1] == n - 1 and all(
        b[0] == a[1] + 1 for a, b in zip(bounds, bounds[1:])) and all(a <= b for a, b in bounds)


def test_uniform_partition_sizes():
    for n in range(1, 30):
        for k in range(1, 9):
            b = uniform_partition(n, k)
            sizes = [y - x + 1 for x, y in b]
            assert covers(b, n) and len(b) == min(n, k) and max(sizes) - min(sizes) <= 1


def test_parameters_partition_is_optimal_bottleneck():
    rng = np.random.default_rng(2)
    for _ in range(150):
        n, k = int(rng.integers(1, 10)), int(rng.integers(1, 5))
        w = rng.integers(0, 50, n).astype(float)
        b = parameters_partition(w, k)
        assert covers(b, n) and len(b) <= k
        got = max(w[x:y + 1].sum() for x, y in b)
        want = min(max(w[x:y + 1].sum() for x, y in parts) for parts in compositions(n, k))
        assert got == pytest.approx(want)
        # left-greedy: no part could take the next part's first item without exceeding the bound
        for (x, y), (x2, _) in zip(b, b[1:]):
            assert w[x:x2 + 1].sum() > want


def test_block_partition_guarantee():
    """Barany-Grinberg: heaviest - lightest <= largest item (normalised costs)."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        n, k = int(rng.integers(1, 25)), int(rng.integers(1, 6))
        x = rng.uniform(0, 10, n)
        b = block_partition(x, k)
        assert covers(b, n) and len(b) == min(n, k)
        span = x.max() - x.min()
        norm = (x - x.min()) / span if span > 0 else np.zeros(n)
        sizes = [norm[a:c + 1].sum() for a, c in b]
        assert max(sizes) <= min(sizes) + 1 + 1e-9


def test_block_partition_balances_an_obvious_case():
    assert block_partition([1, 1, 1, 1, 8, 1, 1, 1], 2) == [(0, 3), (4, 7)]
    assert block_partition([5, 5, 5, 5, 5, 5], 3) == [(0, 1), (2, 3), (4, 5)]


@pytest.mark.parametrize("fn", [plan_uniform, plan_parameters, plan_torchgpipe])
def test_plans_are_valid_and_report_overflow(fn):
    rng = np.random.default_rng(5)
    chain = baseline_chain(rng, 12)
    plat = Target.of(3, bandwidth=200.0, memory_model="paper")
    free = fn(chain, plat)
    assert free.fits and check(free, chain, plat) == []
    # a limit below what this partition needs even with k = 1: returned anyway, says by how much
    tight = plat.with_(memory=free.peak_memory / 10)
    p = fn(chain, tight)
    assert p.feasible and not p.fits and p.status == "feasible"
    note = [n for n in p.notes if n.startswith("does not fit")]
    assert note and "over by" in note[0]
    assert p.peak_memory > tight.memory
    assert p.period == pytest.approx(free.period)          # the memory-blind schedule
    assert check(p, chain, plat) == []                      # valid apart from memory
    assert any(v.rule == 7 for v in check(p, chain, tight))
    # a limit between k=1 and the unconstrained schedule's need: fits at a longer period
    mid = plat.with_(memory=free.peak_memory * 0.999)
    q = fn(chain, mid)
    if q.fits:
        assert q.period >= free.period * (1 - 1e-9) and check(q, chain, mid) == []


def test_registry_and_cli(tmp_path, capsys):
    from workbench.front.cli import main
    from workbench.profiles import write_profile

    rng = np.random.default_rng(6)
    chain = baseline_chain(rng, 10).with_meta(network="toy")
    f = tmp_path / "toy.csv"
    write_profile(chain, f)
    for method in ("uniform", "parameters", "torchgpipe"):
        assert run_planner(chain, Target.of(2, memory_model="paper"), method).method == method
        out = tmp_path / f"{method}.json"
        rc = main(["plan", "--profile", str(f), "--devices", "3", "--memory", "1GiB", "--method", method,
                   "--json", str(out)])
        assert rc == 0
        d = json.loads(out.read_text())
        assert d["method"] == method and d["status"] == "feasible" and len(d["assignment"]) == 10
    rc = main(["plan", "--profile", str(f), "--devices", "3", "--memory", "10B", "--method", "uniform"])
    assert rc == 2 and "does not fit" in capsys.readouterr().out.lower()
