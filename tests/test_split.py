"""The backward split: measured columns win, estimates where missing, torch's stage 0 runs its backward as W."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.split import split_columns, split_note, stage_split
from workbench.profiles.csvio import parse_profile_text, write_profile


def test_estimates_follow_the_documented_rules():
    ch = Chain((Layer("a", 3.0, 4.0, 8, 2, 6), Layer("b", 1.0, 4.0, 8, 2, 6), Layer("relu", 1.0, 1.0, 0, 2, 2)))
    w, pending, est = split_columns(ch)
    assert w.tolist() == [2.0, 1.0, 0.0]            # min(forward, backward / 2) with parameters, else 0
    assert pending.tolist() == [6.0, 6.0, 0.0]      # saved with parameters, else 0
    assert est == ("backward_weight", "weight_pending_bytes") and "estimated" in split_note(ch)


def test_measured_columns_are_used_and_round_trip(tmp_path):
    ch = Chain((Layer("a", 1.0e-3, 4.0e-3, 8, 2, 6, backward_weight=1.25e-3, weight_pending_bytes=7),))
    assert split_note(ch) is None and stage_split(ch, 0, 0, first_stage=False) == (pytest.approx(2.75e-3),
                                                                                  1.25e-3, 7.0)
    write_profile(ch, tmp_path / "p.csv")
    back = parse_profile_text((tmp_path / "p.csv").read_text())
    assert back.layers[0].backward_weight == pytest.approx(1.25e-3) and back.layers[0].weight_pending_bytes == 7


def test_a_weight_part_longer_than_the_backward_is_refused():
    with pytest.raises(ValueError, match="exceeds its backward"):
        Layer("a", 1.0, 1.0, backward_weight=2.0)
    text = "name,forward_ms,backward_ms,weight_bytes,activation_bytes,backward_weight_ms\na,1,1,0,4,3\n"
    with pytest.raises(ValueError, match="backward_weight_ms"):
        parse_profile_text(text)


def test_coarsened_layers_sum_the_split_or_estimate_it():
    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 4, 2, 2, backward_weight=0.5, weight_pending_bytes=3) for i in range(4)))
    merged = ch.coarsen([(0, 1), (2, 3)])
    assert [l.backward_weight for l in merged.layers] == [1.0, 1.0]
    mixed = Chain((Layer("a", 1.0, 2.0, backward_weight=0.5), Layer("b", 1.0, 2.0))).coarsen([(0, 1)])
    assert mixed.layers[0].backward_weight is None
    assert np.isclose(split_columns(ch)[0].sum(), 2.0)
