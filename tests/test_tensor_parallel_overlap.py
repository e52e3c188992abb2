"""workbench.parallel.tensor.overlap: a collective pipelined with the GEMM it feeds or drains (TE's userbuffers)."""

from __future__ import annotations

import itertools

import pytest

from workbench.model.chain import Chain, Layer
from workbench.parallel.tensor.overlap import (
    COMM_SMS,
    METHODS,
    PIPELINE_SPLITS,
    exposed_seconds,
    overlapped_chain,
    overlapped_seconds,
    sms_of,
)

KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@pytest.mark.parametrize("phase,kind", list(itertools.product(("forward", "backward"), KINDS)))
def test_never_below_the_gemm_nor_below_the_longer_of_the_two(phase, kind):
    values = (0.0, 1e-6, 0.3, 1.0, 2.5, 7.0, 40.0)
    for comm, gemm, tp, sms in itertools.product(values, values, (2, 4, 8), (108, 132)):
        got = overlapped_seconds(phase, kind, comm, gemm, tp, sms)
        assert got >= gemm * (1 - 1e-12)
        assert got >= max(gemm, comm) * (1 - 1e-12)
        slow = sms / (sms - COMM_SMS)
        assert got <= slow * gemm + comm + 1e-12        # at worst one after the other, the GEMM on fewer SMs


def test_by_hand_each_method():
    # ring exchange, tp 4: 4 GEMM chunks of 1, 3 steps of 6/3 = 2 on the copy engines: 1 + 3 x max(1, 2)
    assert overlapped_seconds("forward", "all_gather", 6.0, 4.0, 4, 132) == pytest.approx(7.0)
    assert overlapped_seconds("backward", "all_gather", 3.0, 8.0, 4, 132) == pytest.approx(8.0)   # hidden
    # pipeline, 4 chunks, the GEMM on 132 - 16 SMs: g = 8 x 132/116 / 4 = 2.2759, c = 1; g + 3 max(g, c) + c
    g = 8 * 132 / 116 / 4
    assert overlapped_seconds("forward", "reduce_scatter", 4.0, 8.0, 4, 132) == pytest.approx(4 * g + 1)
    assert overlapped_seconds("forward", "reduce_scatter", 40.0, 8.0, 4, 132) == pytest.approx(g + 40)
    # bulk: the whole reduce-scatter beside the GEMM on 116 SMs
    assert overlapped_seconds("backward", "reduce_scatter", 1.0, 8.0, 4, 132) == pytest.approx(8 * 132 / 116)
    assert overlapped_seconds("backward", "reduce_scatter", 20.0, 8.0, 4, 132) == pytest.approx(20.0)
    # an all-reduce, or a collective without a GEMM, stays whole
    assert overlapped_seconds("forward", "all_reduce", 3.0, 8.0, 4, 132) == 11.0
    assert overlapped_seconds("forward", "all_gather", 3.0, 0.0, 4, 132) == 3.0
    assert PIPELINE_SPLITS == 4 and METHODS[("backward", "reduce_scatter")] == "bulk"


def test_exposed_is_what_the_collectives_add_beyond_their_gemms():
    pairs = [("forward", "all_gather", 6.0, 4.0), ("forward", "all_reduce", 2.0, 0.0)]
    assert exposed_seconds(pairs, 4, 132) == pytest.approx((7.0 - 4.0) + 2.0)


def test_sms_of_known_gpus_and_one_line_for_others():
    assert (sms_of("h100-sxm"), sms_of("a100-40gb"), sms_of("h100-pcie")) == (132, 108, 114)
    with pytest.raises(ValueError, match="SMs of GPU 'tpu-v5' not known"):
        sms_of("tpu-v5")


def _layer(name, f, b, **cols):
    return Layer(name, f, b, 10.0, 4.0, **cols)


def test_the_chain_priced_overlapped_and_only_once():
    ch = Chain((_layer("a", 0.010, 0.020, comm_forward=0.002, comm_backward=0.004, exposed_forward=0.0005,
                       exposed_backward=0.001),
                _layer("b", 0.001, 0.002, comm_forward=0.0, comm_backward=0.0, exposed_forward=0.0,
                       exposed_backward=0.0)))
    out = overlapped_chain(ch)
    assert out.layers[0].forward == pytest.approx(0.010 - 0.002 + 0.0005)
    assert out.layers[0].backward == pytest.approx(0.020 - 0.004 + 0.001)
    assert out.layers[1] == ch.layers[1]
    assert out.meta["tp_overlap"] == "true" and overlapped_chain(out) is out


def test_a_chain_without_the_columns_is_refused():
    with pytest.raises(ValueError, match="tpo=1: layer 'a' of this profile has no comm_forward"):
        overlapped_chain(Chain((_layer("a", 0.01, 0.02),)))
