import math

import numpy as np
import pytest

from oracles import paper_stage_memory
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target


def toy(n=4):
    return Chain(tuple(Layer(f"l{i}", 0.001 * (i + 1), 0.002 * (i + 1), 10 * (i + 1), 100 + i) for i in range(n)),
                 input_bytes=50)


def test_saved_defaults_to_input_size():
    c = toy()
    assert c.saved(0) == 50
    assert c.saved(2) == 101
    c2 = Chain((Layer("a", 1, 1, 0, 10, saved_bytes=7), Layer("b", 1, 1, 0, 3)))
    assert c2.saved(0) == 7 and c2.saved(1) == 10


def test_stage_costs_match_sums():
    c = toy(5)
    plat = Target.of(2, bandwidth=1000, latency=0.5, memory_model="paper")
    s = c.stage_costs(1, 3, plat)
    assert s.forward == pytest.approx(0.002 + 0.003 + 0.004)
    assert s.backward == pytest.approx(2 * s.forward)
    assert s.weights == 20 + 30 + 40
    assert s.saved == c.saved(1) + c.saved(2) + c.saved(3)
    assert s.cut_bytes == 103
    assert s.comm == pytest.approx(0.5 + 103 / 1000)
    assert c.stage_costs(2, 4, plat).comm == 0.0  # last stage sends nothing


def test_cut_bytes_override_and_coarsen():
    c = Chain(tuple(Layer(f"l{i}", 1, 1, 1, 10) for i in range(4)), cut_bytes=(5, 6, 7))
    assert [c.cut(i) for i in range(4)] == [5, 6, 7, 0]
    k = c.coarsen([(0, 1), (2, 3)])
    assert len(k) == 2 and k.cut(0) == 6
    assert k.layers[0].forward == 2 and k.saved(0) == c.saved(0) + c.saved(1)
    with pytest.raises(ValueError, match="cover"):
        c.coarsen([(0, 1), (3, 3)])


def test_chain_validation():
    with pytest.raises(ValueError, match="at least one"):
        Chain(())
    with pytest.raises(ValueError, match="duplicate"):
        Chain((Layer("a", 1, 1), Layer("a", 1, 1)))
    with pytest.raises(ValueError, match="forward"):
        Layer("x", -1, 1)
    with pytest.raises(ValueError, match="backward"):
        Layer("x", 1, float("nan"))


def test_frame_view():
    df = toy(3).to_frame()
    assert list(df["name"]) == ["l0", "l1", "l2"]
    assert np.allclose(df["forward_ms"], [1, 2, 3])


def test_platform_parsing_and_memory_rule():
    p = Target.of(4, memory="16GiB", bandwidth="12GB/s", weight_factor=4, memory_model="paper")
    assert p.memory == 16 * 2**30 and p.bandwidth == 12e9
    assert paper_stage_memory(p, 10, 100, 3) == 3 * 10 + 4 * 100 + 2 * 100
    assert paper_stage_memory(Target.of(2, weights="single", memory_model="paper"), 10, 100, 3) == 30 + 100
    assert Target.of(1, memory_model="paper").memory == math.inf
    with pytest.raises(ValueError, match="devices"):
        Target.of(0, memory_model="paper")
    with pytest.raises(ValueError, match="weights"):
        Target.of(2, weights="many", memory_model="paper")


def test_collective_bytes_are_optional_checked_and_summed_when_merged():
    from workbench.model.chain import Chain, Layer

    with pytest.raises(ValueError, match="comm_forward_bytes must be a finite non-negative number"):
        Layer("a", 1.0, 1.0, comm_forward_bytes=-1.0)
    layers = (Layer("a", 1.0, 1.0, 1, 1, comm_forward_bytes=2.0, comm_backward_bytes=3.0),
              Layer("b", 1.0, 1.0, 1, 1, comm_forward_bytes=4.0, comm_backward_bytes=5.0), Layer("c", 1.0, 1.0, 1, 1))
    merged = Chain(layers).coarsen([(0, 1), (2, 2)])
    assert (merged[0].comm_forward_bytes, merged[0].comm_backward_bytes) == (6.0, 8.0)
    assert merged[1].comm_forward_bytes is None
    assert list(Chain(layers).to_frame()["comm_backward_bytes"].fillna(-1)) == [3.0, 5.0, -1.0]
