"""Two profiles of one network side by side (workbench.profiles.compare)."""

from __future__ import annotations

import math

import pytest

from workbench.model.chain import Chain, Layer
from workbench.profiles.compare import layer_ratios, profile_ratios, ratio_table


def _chain(scale_t: float, scale_b: float, names=("a", "b", "c")) -> Chain:
    base = [(1e-3, 2e-3, 100, 40, 80), (3e-3, 3e-3, 0, 40, 40), (2e-3, 4e-3, 60, 10, None)]
    return Chain(tuple(Layer(n, f * scale_t, b * scale_t, w * scale_b, a * scale_b,
                             None if s is None else s * scale_b) for n, (f, b, w, a, s) in zip(names, base)),
                 input_bytes=20 * scale_b)


def test_layer_ratios_per_column():
    per = layer_ratios(_chain(1, 1), _chain(0.25, 0.5))
    assert list(per["layer"]) == ["a", "b", "c"]
    assert per["compute_ratio"].tolist() == pytest.approx([0.25] * 3)
    assert per["saved_ratio"].tolist() == pytest.approx([0.5] * 3)   # c's default (its input) halves too
    assert per["weight_ratio"].iloc[0] == 0.5 and math.isnan(per["weight_ratio"].iloc[1])  # 0 / 0


def test_profile_ratios_sum_the_network_first():
    a = _chain(1, 1)
    b = Chain((Layer("a", 1e-3, 2e-3, 50, 20, 40), Layer("b", 1e-3, 1e-3, 0, 20, 20), Layer("c", 2e-3, 4e-3, 30, 5)),
              input_bytes=10)
    r = profile_ratios(a, b)
    assert r["base_compute"] == pytest.approx(15e-3) and r["other_compute"] == pytest.approx(11e-3)
    assert r["compute_ratio"] == pytest.approx(11 / 15)
    assert r["forward_ratio"] == pytest.approx(4 / 6) and r["backward_ratio"] == pytest.approx(7 / 9)
    assert r["layer_ratio_min"] == pytest.approx(2 / 6) and r["layer_ratio_max"] == pytest.approx(1.0)
    assert r["saved_ratio"] == pytest.approx((40 + 20 + 20) / (80 + 40 + 40))
    assert r["activation_ratio"] == 0.5 and r["weight_ratio"] == 0.5 and r["layers"] == 3


def test_ratio_table_and_refusal():
    t = ratio_table({"x": (_chain(1, 1), _chain(0.5, 0.5)), "y": (_chain(1, 1), _chain(2, 1))})
    assert list(t["network"]) == ["x", "y"] and t["compute_ratio"].tolist() == pytest.approx([0.5, 2.0])
    with pytest.raises(ValueError, match="not of the same chain"):
        profile_ratios(_chain(1, 1), _chain(1, 1, names=("a", "b", "d")))


def test_bf16_profile_of_a_zoo_model_against_float32():
    from workbench.profiles.profiler import profile_zoo

    r = profile_ratios(profile_zoo("tiny-resnet", 2, repeats=1, warmup=0),
                       profile_zoo("tiny-resnet", 2, repeats=1, warmup=0, dtype="bfloat16"))
    assert r["weight_ratio"] == 0.5 and r["activation_ratio"] == 0.5
    assert 0.5 <= r["saved_ratio"] < 0.52          # BatchNorm and the loss keep a few float32 bytes
