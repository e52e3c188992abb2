"""workbench.planners.mcap: the memory-balanced partition, against every partition enumerated here."""

from __future__ import annotations

import itertools
import random

import pytest

from policy_instances import random_chain
from workbench.experiments import METHOD_KEYS, METHOD_LABELS
from workbench.model.memory import device_memory, layer_terms
from workbench.model.target import Target
from workbench.planners import PLANNERS as METHODS
from workbench.planners import plan as run_planner
from workbench.planners.mcap import mcap_partition
from workbench.profiles import load_profile
from workbench.verify.check import check


def _partitions(L: int, q: int):
    for cuts in itertools.combinations(range(1, L), q - 1):
        edges = (0,) + cuts + (L,)
        yield [(edges[s], edges[s + 1] - 1) for s in range(q)]


def test_least_largest_peak_under_1f1b_counts():
    rng = random.Random(3)
    for _ in range(60):
        chain = random_chain(rng, rng.randint(2, 7))
        plat = Target.of(rng.randint(1, 4), optimizer=rng.choice(["sgd", "adam"]))
        t = layer_terms(chain, plat)
        q = min(plat.devices, len(chain))
        fb = chain.forward + chain.backward

        def peak(b):    # stage s of q holds q - s mini-batches (1F1B)
            return max(device_memory(t, [(i, j, q - s)]) for s, (i, j) in enumerate(b))

        parts = list(_partitions(len(chain), q))
        best = min(peak(b) for b in parts)
        got_peak, got = mcap_partition(chain, plat)
        assert got_peak == pytest.approx(best) and peak(got) == pytest.approx(best)
        slowest = min(max(fb[i:j + 1].sum() for i, j in b) for b in parts if peak(b) <= best * (1 + 1e-9))
        assert max(fb[i:j + 1].sum() for i, j in got) == pytest.approx(slowest)


def test_mcap_is_a_registered_baseline():
    assert "mcap" in METHODS and METHOD_KEYS["mcap"] == ("mcap", "contiguous") and "mcap" in METHOD_LABELS
    chain = load_profile("gpt-medium")
    plat = Target.of(8, memory="3GiB")
    m, pd_ = run_planner(chain, plat, "mcap"), run_planner(chain, Target.of(8), "pipedream")
    assert m.method == "mcap" and m.feasible and m.fits and check(m, chain, plat) == []
    assert len(m.stages) == 8
    # balanced: mCAP's largest device under 1F1B counts is below PipeDream's partition's
    t = layer_terms(chain, plat)
    pd_peak = max(device_memory(t, [(s.first, s.last, 8 - i)]) for i, s in enumerate(pd_.stages))
    assert m.extra["mcap_peak"] < pd_peak
