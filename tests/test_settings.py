"""Tests for workbench.experiments.settings: the experiments' settings, their defaults and the method keys."""

from __future__ import annotations

import dataclasses
import math

import pytest

from workbench.experiments.settings import (
    COMPLEXITY_FIGURES,
    FIGURES,
    METHOD_KEYS,
    METHOD_LABELS,
    SWEEP_FIGURES,
    Settings,
    platform_for,
    settings_for,
)
from workbench.methods import METHODS, VARIANTS
from workbench.profiles import available_profiles


def test_quick_settings_are_smaller_in_every_study():
    full, quick = settings_for(networks=("x",)), settings_for(quick=True, networks=("x",))
    assert quick.quick and not full.quick
    assert set(quick.devices) <= set(full.devices) and quick.n_levels < full.n_levels
    assert quick.time_limit < full.time_limit and quick.gain_instances < full.gain_instances
    assert max(quick.scaling_layers) < max(full.scaling_layers) and not quick.largest_ilp
    assert full == Settings(networks=("x",))                    # the full run is the dataclass defaults


def test_default_networks():
    names = available_profiles()
    assert settings_for(quick=True).networks == ("resnet50", "gpt-small")
    full = settings_for().networks
    # the bundled CPU profiles and PipeDream's, not the GPU ones named by a folder
    assert set(full) == {n for n in names if "/" not in n or n.startswith("pipedream/")}
    assert "resnet50" in full and "pipedream/vgg16" in full and not any(n.startswith("h100/") for n in full)


def test_overrides_replace_fields_and_unknown_ones_are_refused():
    s = settings_for(quick=True, networks=("vgg16",), devices=(8,), bandwidth="1GB/s")
    assert (s.networks, s.devices, s.bandwidth, s.n_levels) == (("vgg16",), (8,), "1GB/s", 3)
    assert s.with_(n_levels=9).n_levels == 9 and s.n_levels == 3
    with pytest.raises(TypeError, match="nosuch"):
        settings_for(nosuch=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.devices = (2,)


def test_platform_for_the_sweep():
    s = settings_for(quick=True, networks=("x",), bandwidth="3GB/s", weight_factor=2.0, weights="single")
    p = platform_for(s, 4)
    assert (p.devices, p.bandwidth) == (4, 3e9)
    assert (p.setup.weight_factor, p.setup.weights, p.setup.memory_model) == (2.0, "single", "paper")
    assert math.isinf(p.memory)
    assert platform_for(s.with_(memory_model="full", weight_factor=1.0), 2).setup.memory_model == "full"
    with pytest.raises(ValueError, match=r"^the weight factor \(2\) belongs to the paper's memory model"):
        platform_for(s.with_(memory_model="full"), 2)


def test_method_keys_are_the_registry_variants_in_legend_order():
    assert list(METHOD_KEYS) == [v.key for v in VARIANTS] == list(METHOD_LABELS)
    known = {m.name for m in METHODS}
    for key, (planner, allocation) in METHOD_KEYS.items():
        assert planner in known and allocation in ("contiguous", "general")
    assert METHOD_KEYS["ilp-contiguous"] == ("ilp", "contiguous")
    assert Settings(networks=()).methods == tuple(METHOD_KEYS)


def test_figure_names():
    assert FIGURES == SWEEP_FIGURES + COMPLEXITY_FIGURES and len(set(FIGURES)) == len(FIGURES)
