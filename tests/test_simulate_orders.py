"""The order simulator: every schedule's time per micro-batch against its closed form on identical layers with no
transfer cost, and its memory against a hand count."""

from __future__ import annotations

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.schedules.registry import schedule_of
from workbench.schedules.simulate import simulate_flushed
from workbench.schedules.simulate_orders import held_counts, simulate_order
from workbench.schedules.torch_orders import torch_order


def _identical(stages: int, f: float, i: float, w: float, saved: float = 1.0) -> Chain:
    """One layer per stage, each with forward f, input-gradient i and weight-gradient w (seconds)."""
    return Chain(tuple(Layer(f"l{k}", f, i + w, 8, 1, saved, backward_weight=w, weight_pending_bytes=0)
                       for k in range(stages)), input_bytes=1)


def _per_micro_batch(name: str, P: int, V: int | None, m: int, f: float, i: float, w: float) -> float:
    V = schedule_of(name).chunks(V)
    chain = _identical(P * V, f, i, w)
    dev = schedule_of(name).stage_devices(P, P * V)
    trace = simulate_order(chain, Target.of(P, memory_model="paper"), [(s, s, dev[s]) for s in range(P * V)],
                           torch_order(name, P, V, m), m)
    return trace.period


@pytest.mark.parametrize("P,m", [(2, 4), (4, 8), (4, 16), (4, 6), (8, 16)])
def test_1f1b_takes_m_plus_p_minus_1_times_f_plus_b_over_m(P, m):
    chain = _identical(P, 1.0, 1.5, 0.5)
    trace = simulate_flushed(chain, Target.of(P, memory_model="paper"), list(range(P)), m, kind="1f1b")
    assert trace.period == pytest.approx((m + P - 1) * 3.0 / m)
    assert trace.steady_period() == pytest.approx(trace.period)


@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs"])
@pytest.mark.parametrize("P,V,m", [(2, 2, 4), (4, 2, 8), (4, 2, 16), (4, 3, 8), (4, 4, 8), (4, 1, 8), (2, 3, 6)])
def test_interleaved_takes_mv_plus_p_minus_1_chunks_over_m(name, P, V, m):
    f_c, b_c = 1.0, 2.0            # one chunk's forward and backward
    assert _per_micro_batch(name, P, V, m, f_c, b_c, 0.0) == pytest.approx((m * V + P - 1) * (f_c + b_c) / m)


@pytest.mark.parametrize("f,i,w", [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.0, 0.5),
                                   (2.0, 2.0, 1.0)])
@pytest.mark.parametrize("P,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zero_bubble_1p_at_its_published_bubble(f, i, w, P, m):
    """torch's InterleavedZeroBubble with one stage per device is ZB-H1 (Qi et al., ICLR 2024): a bubble of
    (p - 1)(F + B - W) beside m (F + B + W) of work, for W no longer than F or B; with two chunks, the same
    per chunk."""
    assert _per_micro_batch("interleaved-zb", P, 1, m, f, i, w) == pytest.approx(
        (m * (f + i + w) + (P - 1) * (f + i - w)) / m)
    assert _per_micro_batch("interleaved-zb", P, 2, 2 * m, f, i, w) == pytest.approx(
        (2 * 2 * m * (f + i + w) + (P - 1) * (f + i - w)) / (2 * m))


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
@pytest.mark.parametrize("P,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_v_schedules_have_no_bubble_beyond_the_fill_at_equal_times(name, P, m):
    """ZB-V and DualPipeV at F = B = W per chunk: zero bubble (the ZB paper; the DualPipe repository's table), i.e.
    the device's 2 m (F + B + W) of work plus the pipeline's fill, (p - 1) F: no device can start before the
    forwards of the stages ahead of it have run."""
    f = 1.0
    assert _per_micro_batch(name, P, None, m, f, f, f) == pytest.approx((2 * m * 3 * f + (P - 1) * f) / m)


def test_the_fill_is_a_lower_bound_no_order_beats():
    for name in ("zbv", "dualpipev", "interleaved-zb"):
        for f, i, w in [(2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.0, 2.0)]:
            V = schedule_of(name).chunks(None)
            work = 4 * V * (f + i + w)
            assert _per_micro_batch(name, 4, None, 4 * 4, f, i, w) * 16 >= 4 * work + 3 * f - 1e-9


def test_memory_holds_a_micro_batch_from_its_forward_to_its_weight_gradient():
    """Two devices, interleaved zero bubble with one stage each, 2 micro-batches, hand-checked against the order:
    the last stage runs F0 I0 F1 I1 W0 W1, so it holds two micro-batches' activations."""
    chain = _identical(2, 1.0, 1.0, 1.0, saved=10.0)
    order = torch_order("interleaved-zb", 2, 1, 2)
    assert [str(a) for a in order[1]] == ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"]
    trace = simulate_order(chain, Target.of(2, memory_model="paper"), [(0, 0, 0), (1, 1, 1)], order, 2)
    assert held_counts(trace.ops, 1) == 2
    assert trace.peak_memory().tolist() == [2 * 10.0 + 8.0, 2 * 10.0 + 8.0]   # 2 x saved + the weights (phi = 1)


def test_pending_weight_gradients_count_under_the_full_model():
    chain = Chain(tuple(Layer(f"l{k}", 1.0, 2.0, 0, 4, 4, backward_weight=1.0, weight_pending_bytes=100)
                        for k in range(2)), input_bytes=4)
    order = torch_order("interleaved-zb", 2, 1, 2)
    plat = Target.of(2, optimizer="none")
    with_pending = simulate_order(chain, plat, [(0, 0, 0), (1, 1, 1)], order, 2).peak_memory()
    none = Chain(tuple(Layer(l.name, 1.0, 2.0, 0, 4, 4, backward_weight=1.0, weight_pending_bytes=0)
                       for l in chain.layers), input_bytes=4)
    without = simulate_order(none, plat, [(0, 0, 0), (1, 1, 1)], order, 2).peak_memory()
    # the last stage holds micro-batch 0's and 1's pending bytes at once (I0, I1 before W0); stage 0 runs no I
    assert with_pending[1] - without[1] == 200.0 and with_pending[0] == without[0]


def test_a_deadlocking_order_is_refused():
    from workbench.schedules.ops import Op

    chain = _identical(2, 1.0, 1.0, 0.0)
    bad = {0: (Op(0, "B", 0), Op(0, "F", 0)), 1: (Op(1, "F", 0), Op(1, "B", 0))}
    with pytest.raises(ValueError, match="deadlocks"):
        simulate_order(chain, Target.of(2, memory_model="paper"), [(0, 0, 0), (1, 1, 1)], bad, 1)
