"""Target: a platform (the hardware only) beside a training set-up; what planners, the checker and the memory model
take (docs/model.md, "Instance")."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from workbench.model.chain import Chain, Layer, Platform
from workbench.model.memory import layer_terms
from workbench.model.target import HARDWARE_KEYS, Target
from workbench.model.training_setup import SETUP_KEYS, TrainingSetup
from workbench.planners import plan as make_plan
from workbench.verify.check import check


def _chain(n: int = 4) -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1.0 + i, 2.0, 100.0, 10.0) for i in range(n)), input_bytes=10.0)


def test_the_platform_holds_the_hardware_only():
    assert set(SETUP_KEYS).isdisjoint(f.name for f in fields(Platform))
    assert set(HARDWARE_KEYS) == {"devices", "memory", "bandwidth", "latency", "host_bandwidth", "devices_per_node",
                                  "node_bandwidth", "gpu"}
    for key, value in (("optimizer", "sgd"), ("memory_model", "paper"), ("dp", 2), ("weights", "single")):
        with pytest.raises(TypeError, match=key):
            Platform(2, **{key: value})


def test_of_splits_the_keywords_between_the_platform_and_the_set_up():
    t = Target.of(4, memory="1GiB", bandwidth="12GB/s", optimizer="sgd", zero_grad="zeros", weights="single")
    assert t.platform == Platform(4, memory="1GiB", bandwidth="12GB/s")
    assert t.setup == TrainingSetup(optimizer="sgd", zero_grad="zeros", weights="single")
    assert Target.of(2).setup == TrainingSetup()            # the set-up's defaults are the class's
    on = Target.on("h100-sxm", 16, devices_per_node=8, precision="bf16-mixed")
    assert on.platform == Platform.on("h100-sxm", 16, devices_per_node=8) and on.setup.precision == "bf16-mixed"
    with pytest.raises(TypeError, match="unknown platform or set-up keyword.*colour"):
        Target.of(2, colour="red")
    with pytest.raises(TypeError, match="must be a Platform"):
        Target(TrainingSetup())                                 # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a TrainingSetup"):
        Target(Platform(1), {"optimizer": "sgd"})               # type: ignore[arg-type]


def test_the_set_up_checks_itself():
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        TrainingSetup(optimizer="lion")
    with pytest.raises(ValueError, match="weight factor .* belongs to the paper's memory model"):
        TrainingSetup(weight_factor=2.0)
    with pytest.raises(ValueError, match="zero=1 shards over the data-parallel group, but dp=1"):
        TrainingSetup(zero=1)
    with pytest.raises(ValueError, match="needs the full memory model"):
        TrainingSetup(memory_model="paper", dp=2)
    assert TrainingSetup(dp=np.int64(4), zero=np.int64(1)).dp == 4     # numpy integers are whole numbers


def test_with_changes_each_field_where_it_belongs():
    t = Target.of(4, memory=1e9, optimizer="sgd")
    wider = t.with_(memory=2e9, devices=8)
    assert wider.setup is t.setup and wider.platform == Platform(8, memory=2e9)
    zeros = t.with_(zero_grad="zeros")
    assert zeros.platform is t.platform and zeros.setup == TrainingSetup(optimizer="sgd", zero_grad="zeros")
    with pytest.raises(TypeError, match="unknown .*: speed"):
        t.with_(speed=3)


def test_the_hardware_is_read_through_the_platforms_accessors():
    t = Target.of(16, bandwidth="450GB/s", devices_per_node=8, node_bandwidth="50GB/s", host_bandwidth="4B/s",
                  memory="80GB", latency=1e-6, gpu=None, optimizer="adamw")
    p = t.platform
    assert (t.devices, t.memory_limit, t.memory_of(9), t.multi_node, t.node_of(9), t.devices_per_node) == \
        (p.devices, p.memory_limit, p.memory_of(9), p.multi_node, p.node_of(9), p.devices_per_node)
    assert t.comm_time(1e9, 7, 8) == p.comm_time(1e9, 7, 8) == pytest.approx(1e-6 + 1e9 / 50e9)
    assert t.comm_time(1e9, 6, 7) == pytest.approx(1e-6 + 1e9 / 450e9)
    assert t.host_time(8.0) == 2.0 and t.gpu is None


def test_the_memory_model_reads_the_set_up_not_the_hardware():
    """The memory terms depend on the set-up and on whether there is more than one device: two targets with the
    same set-up on different memory and links share one cached value, and a layer's resident bytes are by hand
    parameters + gradients (zeroed in place) + the optimizer's states."""
    ch = _chain()
    a = layer_terms(ch, Target.of(2, memory=1e3, optimizer="momentum", zero_grad="zeros"))
    b = layer_terms(ch, Target.of(3, memory=1e9, bandwidth=5.0, optimizer="momentum", zero_grad="zeros"))
    assert a is b
    assert float(a.static[0]) == 100.0 + 100.0 + 1 * 100.0          # W, G, one momentum buffer
    adam = layer_terms(ch, Target.of(2, memory=1e3, optimizer="adam", zero_grad="zeros"))
    assert float(adam.static[0]) == 100.0 + 100.0 + 2 * 100.0


def test_a_plan_records_the_set_up_it_was_made_for_and_is_checked_on_it():
    ch = _chain(6)
    target = Target.of(3, memory=5e3, bandwidth=100.0, optimizer="sgd", zero_grad="zeros", weights="single")
    p = make_plan(ch, target, "dp")
    assert p.feasible
    recorded = TrainingSetup.from_memory_setup(p.setup)
    assert recorded == replace(target.setup, precision="fp32")      # the precision computed with: the profile's
    assert check(p, ch, Target(target.platform, recorded)) == []     # no violation
