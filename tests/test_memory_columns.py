"""Tests for workbench.model.memory_columns: the profile's memory columns, measured or estimated, and the
training set-up checked against the profile's dtype."""

from __future__ import annotations

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.memory_columns import ESTIMATES, measured_columns, validate_setup
from workbench.model.target import Target

MEASURED = dict(grad_bytes=90.0, max_param_bytes=60.0, saved_input_bytes=7.0, saved_output_bytes=3.0,
                forward_peak_bytes=33.0, backward_peak_bytes=44.0, backward_fresh_peak_bytes=55.0)


def two_layers(**b_extra) -> Chain:
    """Input 7 B; ``a``: 100 B of parameters, output 20 B, saves its input; ``b``: 50 B, output 5 B, saves 30 B."""
    return Chain((Layer("a", 1, 1, 100, 20), Layer("b", 1, 1, 50, 5, 30, **b_extra)), input_bytes=7)


def test_every_column_estimated_by_hand():
    cols, missing = measured_columns(two_layers())
    assert missing == tuple(ESTIMATES)           # all seven, in the order ESTIMATES lists them
    expect = {
        "in": [7, 20], "out": [20, 5], "saved": [7, 30],
        "grad_bytes": [100, 50], "max_param_bytes": [100, 50],       # the parameters' bytes
        "saved_input_bytes": [7, 20],                                 # min(saved, input)
        "saved_output_bytes": [0, 0],
        "forward_peak_bytes": [0 + 20, (30 - 20) + 5],                # saved beyond the input, and the output
        "backward_peak_bytes": [20 + 7 + 100, 5 + 20 + 50],           # output grad + input grad + weight grad
        "backward_fresh_peak_bytes": [127, 75],                       # = the backward peak where it is estimated
    }
    assert {k: cols[k].tolist() for k in expect} == expect


def test_measured_columns_are_taken_as_they_are():
    chain = Chain((Layer("a", 1, 1, 100, 20, **MEASURED), Layer("b", 1, 1, 50, 5, 30, **MEASURED)), input_bytes=7)
    cols, missing = measured_columns(chain)
    assert missing == ()
    for name, value in MEASURED.items():
        assert cols[name].tolist() == [value, value]


def test_a_column_measured_on_some_layers_is_estimated_on_the_others():
    chain = Chain((Layer("a", 1, 1, 100, 20, backward_peak_bytes=40.0), Layer("b", 1, 1, 50, 5, 30)),
                  input_bytes=7)
    cols, missing = measured_columns(chain)
    assert "backward_peak_bytes" in missing
    assert cols["backward_peak_bytes"].tolist() == [40, 75]
    # a measured backward peak adds into existing gradients: written fresh they are on top of it
    assert cols["backward_fresh_peak_bytes"].tolist() == [40 + 100, 75]


def test_cut_bytes_are_the_next_layer_input():
    chain = Chain((Layer("a", 1, 1, 0, 20), Layer("b", 1, 1, 0, 5)), input_bytes=7, cut_bytes=(12.0,))
    cols, _ = measured_columns(chain)
    assert cols["in"].tolist() == [7, 12] and cols["saved_input_bytes"].tolist() == [7, 12]


def test_columns_estimated_upstream_are_still_named():
    chain = Chain(two_layers(**{k: v for k, v in MEASURED.items()}).layers[1:], input_bytes=20,
                  meta={"estimated_columns": "grad_bytes,,forward_peak_bytes"})
    _, missing = measured_columns(chain)
    assert missing == ("grad_bytes", "forward_peak_bytes")


def test_validate_setup_defaults_to_the_profile_dtype():
    bf16 = Chain((Layer("a", 1, 1),), meta={"dtype": "bfloat16"})
    fp32 = Chain((Layer("a", 1, 1),), meta={"dtype": "float32"})
    assert validate_setup(Target.of(1), bf16) == "bf16"
    assert validate_setup(Target.of(1), fp32) == "fp32"
    assert validate_setup(Target.of(1)) == "fp32"
    assert validate_setup(Target.of(1, precision="bf16-mixed"), bf16) == "bf16-mixed"
    assert validate_setup(Target.of(1, precision="bf16"), Chain((Layer("a", 1, 1),))) == "bf16"   # no dtype named


def test_validate_setup_refuses_a_precision_the_profile_was_not_measured_in():
    fp32 = Chain((Layer("a", 1, 1),), meta={"network": "net", "dtype": "float32"})
    bf16 = Chain((Layer("a", 1, 1),), meta={"network": "net", "dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"^precision 'bf16-mixed' needs a bfloat16 profile; this profile \(net\) "
                                         r"was measured in float32 \(profile it with --dtype bfloat16, or plan with "
                                         r"--precision fp32\)$"):
        validate_setup(Target.of(1, precision="bf16-mixed"), fp32)
    with pytest.raises(ValueError, match="--precision bf16"):
        validate_setup(Target.of(1, precision="fp32"), bf16)
    assert validate_setup(Target.of(1, precision="fp32", memory_model="paper"), bf16) == "fp32"   # paper: no dtype
