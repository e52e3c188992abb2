"""workbench.model.memory_terms: the stage-boundary terms as one table, and every view derived from it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from workbench.model import memory_terms
from workbench.model.chain import Chain, Layer
from workbench.model.memory import device_memory, layer_terms, stage_memory
from workbench.model.memory_bands import band_terms, linear_terms, square_terms
from workbench.model.memory_terms import (
    BOUNDARY_TERMS,
    BoundaryInputs,
    BoundaryTerm,
    boundary_bytes,
    boundary_columns,
)
from workbench.model.memory_views import memory_breakdown
from workbench.model.plan import Stage
from workbench.model.target import Target


def _chain(seed: int, L: int = 5) -> Chain:
    rng = random.Random(seed)
    layers = tuple(Layer(f"l{i}", 1.0, 2.0, rng.randint(0, 50), rng.randint(1, 40), rng.randint(0, 60), None, None,
                         rng.choice([0, 4]), rng.choice([0, 8]), None, None) for i in range(L))
    return Chain(layers, input_bytes=rng.randint(1, 30))


def _literal(chain: Chain, first: int, last: int) -> tuple[float, float]:
    """(per mini-batch, once) at the boundaries of stage first..last, as docs/model.md ("Per stage") states them,
    from the layers' columns: head_i + tail_j and in_i [i > 0] + out_j [j < L - 1]."""
    L = len(chain)
    inp = float(chain.input_bytes) if first == 0 else chain.cut(first - 1)
    si = chain.layers[first].saved_input_bytes or 0.0
    prev_so = (chain.layers[first - 1].saved_output_bytes or 0.0) if first > 0 else 0.0
    head = max(inp - si + (si if prev_so > 0 else 0.0), 0.0)
    tail = 0.0 if last == L - 1 else max(chain.cut(last) - (chain.layers[last].saved_output_bytes or 0.0), 0.0)
    return head + tail, (inp if first > 0 else 0.0) + (chain.cut(last) if last < L - 1 else 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_every_stage_holds_what_the_model_states(seed):
    chain = _chain(seed)
    t = layer_terms(chain, Target.of(2, optimizer="sgd"))
    for i in range(len(chain)):
        for j in range(i, len(chain)):
            assert [float(v) for v in boundary_bytes(t, i, j)] == pytest.approx(_literal(chain, i, j))


def test_the_sides_and_scalings_sum_the_table():
    ch = Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3), Layer("c", 1, 1, 0, 5)), input_bytes=4)
    x = BoundaryInputs.of_chain(ch, np.zeros(3), np.zeros(3))
    base = boundary_columns(x)
    extra = BoundaryTerm("probe", "start", True, "activations", lambda _: np.array([1.0, 2.0, 3.0]))
    more = boundary_columns(x, BOUNDARY_TERMS + (extra,))
    assert (more.head - base.head).tolist() == [1.0, 2.0, 3.0]
    assert np.array_equal(more.tail, base.tail) and np.array_equal(more.buf_in, base.buf_in)
    assert [term.name for term, _ in more.by_term][-1] == "probe"


def test_a_malformed_term_is_refused_by_name():
    x = BoundaryInputs.of_chain(Chain((Layer("a", 1, 1),)), np.zeros(1), np.zeros(1))
    with pytest.raises(ValueError, match="'odd': side must be one of"):
        boundary_columns(x, (BoundaryTerm("odd", "middle", False, "buffers", lambda _: np.zeros(1)),))
    with pytest.raises(ValueError, match="'short': \\(2,\\) bytes for a chain of 1 layers"):
        boundary_columns(x, (BoundaryTerm("short", "end", False, "buffers", lambda _: np.zeros(2)),))


def test_a_new_term_reaches_every_view(monkeypatch):
    # one entry in the table: the stage memory, the bands, the MILP's coefficients and the breakdown all hold it
    plat = Target.of(2, optimizer="sgd")
    before = layer_terms(_chain(1), plat)
    sent = BoundaryTerm("sent", "end", False, "sent", lambda x: np.where(np.arange(len(x.cuts)) < len(x.cuts) - 1,
                                                                          1000.0, 0.0))
    monkeypatch.setattr(memory_terms, "BOUNDARY_TERMS", BOUNDARY_TERMS + (sent,))
    chain = _chain(1)                              # a new chain: the terms are cached per chain
    after = layer_terms(chain, plat)
    assert stage_memory(after, 0, 1, 2) - stage_memory(before, 0, 1, 2) == 1000.0
    assert stage_memory(after, 2, 4, 2) == stage_memory(before, 2, 4, 2)        # the last stage sends nothing
    I, J = np.arange(5)[:, None], np.minimum(np.arange(5)[:, None] + np.arange(2), 4)
    gained = band_terms(after, I, J).static - band_terms(before, I, J).static
    assert gained.tolist() == np.where(J < 4, 1000.0, 0.0).tolist()
    assert np.array_equal(square_terms(after).extra, square_terms(before).extra)   # held, not a transient
    assert (linear_terms(after).buf_tail - linear_terms(before).buf_tail)[:4].tolist() == [1000.0] * 4
    stages = [Stage(0, 1, 0, 0.0, 0.0, 2), Stage(2, 4, 1, 0.0, 0.0, 1)]
    rows = memory_breakdown(chain, plat, stages)
    assert [r["sent"] for r in rows] == [1000.0, 0.0]
    assert device_memory(after, [(0, 1, 2)]) == pytest.approx(sum(rows[0].values()))


def test_the_step_finds_the_input_gradient_apart_from_the_buffers():
    t = layer_terms(_chain(2), Target.of(2, optimizer="adam"))
    assert t.grad_sent[0] == 0.0 and np.array_equal(t.grad_sent[1:], _chain(2).cuts[:-1])
    assert np.array_equal(layer_terms(_chain(2), Target.of(2, memory_model="paper")).grad_sent, np.zeros(5))
