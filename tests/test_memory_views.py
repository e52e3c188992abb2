"""The plan-level views of the memory model (workbench.model.memory_views) against independent computations.

* every device's memory (plan_memory) and its split by term (memory_breakdown) against the checker's own
  re-derivation (workbench.verify.check_memory, which shares no code with them) on random plans of random chains
  with random measured columns;
* merged layers (merged_memory_columns, through Chain.coarsen) against the layers they stand for;
* flushed plans' split against their simulated memory; the estimate note; torch's engine extra by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_memory import measured_chain
from workbench.model.chain import Chain, Layer
from workbench.model.memory import layer_terms, stage_excess, stage_memory
from workbench.model.memory_views import (
    estimate_note,
    memory_breakdown,
    merged_memory_columns,
    plan_memory,
    torch_engine_extra,
)
from workbench.model.plan import Stage
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.verify.check_memory import memory_by_device


def random_stages(rng: np.random.Generator, L: int, P: int) -> list[Stage]:
    """Maximal runs of a random general allocation, each with 1..4 mini-batches in flight."""
    assign = [int(rng.integers(0, P)) for _ in range(L)]
    runs, first = [], 0
    for l in range(1, L + 1):
        if l == L or assign[l] != assign[first]:
            runs.append(Stage(first, l - 1, assign[first], 0.0, 0.0, int(rng.integers(1, 5))))
            first = l
    return runs


def test_two_implementations_agree_on_random_plans():
    rng = np.random.default_rng(5)
    for trial in range(200):
        L, P = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        chain = measured_chain(rng, L, dtype=str(rng.choice(["float32", "bfloat16"])),
                               device=str(rng.choice(["cpu", "cuda (H100)"])))
        precision = "fp32" if chain.meta["dtype"] == "float32" else str(rng.choice(["bf16", "bf16-mixed"]))
        plat = Target.of(P, optimizer=str(rng.choice(["none", "sgd", "momentum", "adam", "adamw"])),
                        precision=precision, weights=str(rng.choice(["stash", "single"])))
        runs = random_stages(rng, L, P)
        mine = plan_memory(chain, plat, runs)
        theirs = memory_by_device(chain, plat, [(s.first, s.last, s.device, s.in_flight) for s in runs])
        assert mine == pytest.approx(theirs, rel=1e-12), trial


def test_merged_layers_hold_what_their_layers_hold():
    rng = np.random.default_rng(3)
    for trial in range(60):
        L = int(rng.integers(2, 10))
        chain = measured_chain(rng, L)
        cuts = sorted(set(int(c) for c in rng.integers(1, L, size=int(rng.integers(0, L)))))
        edges = [0] + cuts + [L]
        groups = [(edges[i], edges[i + 1] - 1) for i in range(len(edges) - 1)]
        coarse = chain.coarsen(groups)
        plat = Target.of(1, optimizer=str(rng.choice(["sgd", "adam"])))
        fine_t, coarse_t = layer_terms(chain, plat), layer_terms(coarse, plat)
        for i in range(len(groups)):
            for j in range(i, len(groups)):
                a, b = groups[i][0], groups[j][1]
                for k in (1, 3):
                    assert stage_memory(coarse_t, i, j, k) == pytest.approx(stage_memory(fine_t, a, b, k)), trial
                assert stage_excess(coarse_t, i, j) == pytest.approx(stage_excess(fine_t, a, b)), trial
        assert merged_memory_columns(chain, 0, L - 1)["saved_input_bytes"] == chain.layers[0].saved_input_bytes


def test_flushed_plans_split_and_fit():
    rng = np.random.default_rng(4)
    chain = measured_chain(rng, 6)
    plat = Target.of(2, optimizer="adam")
    for kind in ("gpipe", "1f1b"):
        p = run_planner(chain, plat, kind, micro_batches=4)
        from workbench.viz.memory import memory_split

        split = memory_split(p, chain, plat)
        assert split["stashed"].sum() == 0                     # one weight version: nothing stashed
        assert split["total"].to_numpy() == pytest.approx(np.array(p.memory), rel=1e-9)


def test_breakdown_adds_up_to_the_checkers_memory():
    rng = np.random.default_rng(11)
    for trial in range(100):
        L, P = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        chain = measured_chain(rng, L)
        for plat in (Target.of(P, optimizer=str(rng.choice(["sgd", "adam"])), weights="stash"),
                     Target.of(P, memory_model="paper", weight_factor=float(rng.choice([1.0, 2.0])))):
            runs = random_stages(rng, L, P)
            split = memory_breakdown(chain, plat, runs)
            theirs = memory_by_device(chain, plat, [(s.first, s.last, s.device, s.in_flight) for s in runs])
            assert [sum(row.values()) for row in split] == pytest.approx(theirs, rel=1e-12), trial
            assert all(v >= 0 for row in split for v in row.values()), trial


def test_estimate_note_names_the_missing_columns():
    assert estimate_note(measured_chain(np.random.default_rng(0), 3), Target.of(1)) is None
    note = estimate_note(Chain((Layer("a", 1, 1, 10, 4),)), Target.of(1))
    assert note is not None and "grad_bytes" in note and "backward_peak_bytes" in note


def test_torch_engine_extra_by_hand():
    # three stages on two devices, N = 4 micro-batches; cuts 10 (after a) and 3 (after b), input 4
    ch = Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3), Layer("c", 1, 1, 0, 7)), input_bytes=4)
    stages = [Stage(0, 0, 0, 0, 0, 3), Stage(1, 1, 1, 0, 0, 2), Stage(2, 2, 0, 0, 0, 1)]
    first = (2 * 4 - 3 - 1) * 10 + (4 - 3) * 4            # its output's sends, the chain's inputs
    middle = (2 * 4 - 2 - 1) * 10 + (2 * 4 - 2 - 1) * 3    # input and output
    last = (2 * 4 - 1 - 1) * 3 + 1 * 7                     # its input, its cached output
    assert torch_engine_extra(ch, stages, 2, 4) == [first + last, middle]


def test_torch_engine_extra_with_one_send_kept():
    # Schedule1F1B keeps one send each way: N + 1 inputs (its N receive buffers, one gradient sent back) and
    # N + k outputs (k in flight, N gradient buffers) against the model's k + 1 each way
    ch = Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3), Layer("c", 1, 1, 0, 7)), input_bytes=4)
    stages = [Stage(0, 0, 0, 0, 0, 3), Stage(1, 1, 1, 0, 0, 2), Stage(2, 2, 0, 0, 0, 1)]
    first = (4 - 1) * 10 + (4 - 3) * 4
    middle = (4 - 2) * 10 + (4 - 1) * 3
    last = (4 - 1) * 3 + 1 * 7
    assert torch_engine_extra(ch, stages, 2, 4, sends_kept=1) == [first + last, middle]
    assert torch_engine_extra(ch, stages, 2, 4, sends_kept=4) == torch_engine_extra(ch, stages, 2, 4)
