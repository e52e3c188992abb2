"""workbench.planners.dp.versions: stage versions within a row budget, thinned into real and relaxation rows."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from policy_instances import random_chain
from workbench.model.activations import apply_policies, policy_terms
from workbench.model.target import Target
from workbench.planners.dp import versions
from workbench.planners.dp.versions import PolicyTree, _select, group_cap, stage_ends, stage_versions
from workbench.profiles import load_profile


def test_select_keeps_a_dominator_of_every_candidate():
    """Thinning is valid: every candidate version is no better than a kept version or a relaxation row of its
    group, in each of (R, X, S, Ef, Eb) (what makes the DP with relaxation rows a lower bound); with Ef = Eb
    (no gradients made in the backward) and without."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 80))
        gid = rng.integers(0, 4, n)
        R, X, S, E, B = (rng.choice([0.0, 1.0, 2.5, 7.0], n) + rng.uniform(0, 3, n) * (trial % 2) for _ in range(5))
        if trial % 4 < 2:
            B = E
        nv = int(rng.integers(0, 6))
        v = (*(rng.uniform(0, 9, nv) for _ in range(5)), rng.integers(0, 4, nv))
        cap = int(rng.integers(1, 9))
        kept, rows = _select(gid, R, X, S, E, B, v, cap)
        assert np.bincount(gid[kept], minlength=4).max() <= max(cap, 0) or len(kept) == 0
        cand = [(gid[t], R[t], X[t], S[t], E[t], B[t]) for t in range(n)] + list(zip(v[5], *v[:5]))
        keep_rows = [(gid[t], R[t], X[t], S[t], E[t], B[t]) for t in kept] + list(zip(rows[5], *rows[:5]))
        for g, *c in cand:
            assert any(kg == g and all(a <= b + 1e-12 for a, b in zip(k, c)) for kg, *k in keep_rows), trial


def test_real_rows_are_the_effective_chain_of_their_policies():
    """A real row's compute and host round trip are those of its stage on the chain with its policies."""
    chain = random_chain(random.Random(3), 7)
    plat = Target.of(2, memory=1e9, optimizer="adam", host_bandwidth=50.0)
    v = stage_versions(chain, plat)
    assert v.exact and v.real.all()
    rng = np.random.default_rng(1)
    for row in rng.choice(len(v.i), 40, replace=False):
        i, j = int(v.i[row]), int(v.j[row])
        pol = ["keep"] * len(chain)
        pol[i:j + 1] = [("keep", "recompute", "offload")[p] for p in v.policies(int(row))]
        eff = apply_policies(chain, pol)
        fb = float(sum(eff.forward[i:j + 1]) + sum(eff.backward[i:j + 1]))
        assert v.FB[row] == pytest.approx(fb)
        off = sum(eff.layers[l].offload_bytes for l in range(i, j + 1))
        assert v.host[row] == pytest.approx(2 * off / plat.host_bandwidth)


def test_a_long_dag_chain_stays_within_the_row_budget():
    """Every (stage, incoming class, group) holds at most ``cap`` real and ``cap`` relaxation rows, and the cap
    fits the budget unless it is at its floor."""
    chain = load_profile("pipedream/resnet50")
    plat = Target.of(8, memory="6GiB")
    ends = {i: e for i, e in list(stage_ends(chain, 0.15).items())[:12]}
    t0 = time.perf_counter()
    for budget in (20_000, 400_000):
        v = stage_versions(chain, plat, ends, max_load=0.15, row_budget=budget)
        cells = sum(len(e) * len(set(v.cls_of[i].tolist())) for i, e in ends.items()) * 9
        assert v.cap == group_cap(ends, v.cls_of, budget)
        assert len(v.i) <= 2 * v.cap * cells
        assert len(v.i) <= budget or v.cap == versions.MIN_CAP
        assert set(np.unique(v.i)) <= set(ends)
    assert time.perf_counter() - t0 < 120


def test_the_deadline_stops_the_build():
    chain = load_profile("pipedream/resnet50")
    with pytest.raises(TimeoutError):
        stage_versions(chain, Target.of(8, memory="6GiB"), deadline=time.perf_counter() - 1.0)


def test_policy_tree_walks_back_to_the_first_layer():
    t = PolicyTree()
    a = t.add(np.array([-1, -1]), np.array([0, 2]))
    b = t.add(a, 1)
    c = t.add(b[1:], 2)
    assert t.vector(int(c[0])) == (2, 1, 2) and t.vector(int(b[0])) == (0, 1)


def test_policy_terms_shape_matches_the_chain():
    chain = random_chain(random.Random(5), 4)
    pt = policy_terms(chain, Target.of(1))
    assert pt.act.shape == (3, 3, 4)
