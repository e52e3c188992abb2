"""Target: a platform (the hardware only) beside a training set-up; what planners, the checker and the memory model
take (docs/model.md, "Instance")."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from workbench.model.chain import Chain, Layer, Platform
from workbench.model.layout import Layout
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
    with pytest.raises(TypeError, match="dp"):              # the data-parallel group is the layout's
        TrainingSetup(dp=2)
    with pytest.raises(ValueError, match="zero=1 shards over the data-parallel group, but dp=1"):
        Target.of(2, zero=1)
    with pytest.raises(ValueError, match="needs the full memory model"):
        Target.of(2, memory_model="paper", dp=2)
    assert Target.of(2, dp=np.int64(4), zero=np.int64(1)).layout.dp == 4     # numpy integers are whole numbers


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


# ----- the layout: a target's devices are its pipeline ranks, each on the GPU of mesh rank (p, 0, 0) -----------

def _old_pipeline_platform(per_node: int | None, layout: Layout) -> Platform:
    """The pipeline's platform as the workbench built it before a target had a layout: ``pp`` devices, a node of
    ``per_node // (tp x dp)`` of them (at least 1): the reference for layouts whose ranks fill nodes evenly."""
    return Platform(layout.pp, bandwidth="450GB/s", node_bandwidth="50GB/s", latency=1e-6,
                    devices_per_node=None if per_node is None else max(1, per_node // (layout.tp * layout.dp)))


def test_a_target_without_a_layout_makes_every_gpu_a_pipeline_stage():
    t = Target.of(4)
    assert t.layout == Layout(pp=4) and t.devices == 4 and [t.device_of(p) for p in range(4)] == [0, 1, 2, 3]
    assert t.with_(devices=6).layout == Layout(pp=6)             # a new GPU count: every GPU a stage again
    assert t.with_(memory=1e9).layout is t.layout
    with pytest.raises(ValueError, match="uses 6 GPUs, not the platform's 4"):
        Target(Platform(4), layout=Layout(pp=3, dp=2))
    with pytest.raises(TypeError, match="layout must be a Layout"):
        Target(Platform(4), layout="tp=1,pp=4")


@pytest.mark.parametrize("per_node", [None, 2, 4, 8, 16])
@pytest.mark.parametrize("tp, pp, dp", [(1, 8, 2), (2, 4, 2), (1, 2, 8), (4, 2, 2), (8, 2, 1), (2, 8, 1)])
def test_a_layouts_pipeline_sees_the_links_and_nodes_its_old_platform_had(per_node, tp, pp, dp):
    """Where the ranks of a pipeline stage (tp x dp GPUs) fill nodes evenly, every pair of pipeline ranks talks
    over the link the pre-layout pipeline platform gave it, and the node count, ``multi_node`` and the recorded
    ``devices_per_node`` are the same."""
    layout = Layout(tp=tp, pp=pp, dp=dp, zero=1 if dp > 1 else 0)
    job = Target(Platform(16, bandwidth="450GB/s", node_bandwidth="50GB/s", latency=1e-6, devices_per_node=per_node))
    if per_node is not None and tp > per_node:
        return
    t, old = job.for_layout(layout), _old_pipeline_platform(per_node, layout)
    assert t.devices == pp and t.platform == job.platform
    assert (t.multi_node, t.devices_per_node) == (old.multi_node, old.devices_per_node)
    for p in range(pp):
        assert layout.coords(t.device_of(p)) == (p, 0, 0)           # its GPU is mesh rank (p, 0, 0)
        for q in range(pp):
            assert t.comm_time(1e9, p, q) == old.comm_time(1e9, p, q), (p, q)


def test_a_stage_of_gpus_that_do_not_fill_nodes_evenly_sits_on_its_own_gpus_node():
    """tp x dp = 3 on nodes of 8: pipeline rank p is GPU 3 p, on node 3 p // 8 (by hand: 0 0 0 1 1 1 2 2)."""
    t = Target(Platform(24, bandwidth=8.0, node_bandwidth=2.0, devices_per_node=8)).for_layout(Layout(pp=8, dp=3))
    assert [t.node_of(p) for p in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert t.comm_time(8.0, 2, 3) == 4.0 and t.comm_time(8.0, 1, 2) == 1.0      # GPUs 6 -> 9 cross, 3 -> 6 do not
    from workbench.planners.partition import SuffixLinks

    links = SuffixLinks(Chain((Layer("a", 1, 1, 0, 8), Layer("b", 1, 1, 0, 8))), t)
    assert links.after(8 - 2).tolist() == [4.0, 0.0] and links.after(8 - 1).tolist() == [1.0, 0.0]


def test_a_pipelines_platform_as_a_plan_records_it_is_widened_to_the_layouts_gpus():
    """check and run build the platform of ``pp`` devices with the plan's ``devices_per_node`` (pipeline ranks):
    the target of the layout has every GPU, and the same links between pipeline ranks."""
    layout = Layout(tp=2, pp=4, dp=2, zero=1)
    recorded = Platform(4, bandwidth=8.0, node_bandwidth=2.0, devices_per_node=2)
    t = Target(recorded).for_layout(layout)
    assert t.platform.devices == 16 and t.platform.devices_per_node == 8 and t.devices_per_node == 2
    assert [[t.comm_time(8.0, p, q) for q in range(4)] for p in range(4)] == \
        [[recorded.comm_time(8.0, p, q) for q in range(4)] for p in range(4)]
    with pytest.raises(ValueError, match="uses 16 GPUs; the platform has 5"):
        Target.of(5).for_layout(layout)


def test_for_layout_holds_the_layouts_data_parallel_group_and_the_memory_model_reads_it():
    job = Target.of(8, optimizer="sgd", weights="stash")
    flushed = job.for_layout(Layout(pp=2, dp=4, zero=2, schedule="gpipe"))
    assert flushed.layout == Layout(pp=2, dp=4, zero=2, schedule="gpipe")
    assert flushed.setup == job.setup.with_(weights="single")                   # torch's engine: one version
    assert job.for_layout(Layout(pp=2, dp=4, zero=1, schedule="pipedream")).setup == job.setup
    assert job.for_layout(Layout(pp=8)).setup.weights == "single"               # no schedule: 1f1b's
    assert job.for_layout(Layout(pp=8), flushed=False).setup == job.setup
    ch, adam = _chain(), Target.of(8, optimizer="adam")
    replica = layer_terms(ch, adam.with_(devices=2, weights="single"))
    assert float(replica.parts["optimizer"][0]) > 0
    for zero in (1, 2, 3):           # ZeRO 1..3 split the optimizer state over the data-parallel group
        sharded = layer_terms(ch, adam.for_layout(Layout(pp=2, dp=4, zero=zero), flushed=True))
        assert float(sharded.parts["optimizer"][0]) * 4 == pytest.approx(float(replica.parts["optimizer"][0]))
    ddp = layer_terms(ch, adam.for_layout(Layout(pp=2, dp=4), flushed=True))
    assert float(ddp.parts["optimizer"][0]) == float(replica.parts["optimizer"][0])    # DDP: a whole replica's
    paper = Target.of(8, memory_model="paper")
    assert layer_terms(ch, paper.for_layout(Layout(pp=2, dp=4), flushed=False)) is \
        layer_terms(ch, paper.with_(devices=2))                                  # rule 7 knows no replicas


class _Uneven(Platform):
    """GPU d holds (d + 1) GB: the accessors, not the field, give a device's limit."""

    def memory_of(self, device: int) -> float:
        return (device + 1) * 1e9


def test_a_pipeline_ranks_memory_limit_is_its_gpus():
    t = Target(_Uneven(8)).for_layout(Layout(pp=4, dp=2))
    assert [t.memory_of(p) for p in range(4)] == [1e9, 3e9, 5e9, 7e9]
    with pytest.raises(ValueError, match="memory limits differ"):
        t.memory_limit
