"""A layout evaluated (workbench.parallel.evaluate): what it refuses, its step against its parts and the planners
it calls, the extension of long flushes against their whole simulation, tokens/s and MFU by hand."""

from __future__ import annotations

import math

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.layout import Layout
from workbench.model.target import Target
from workbench.parallel.evaluate import Job, complete_layout, evaluate, extrapolation_points
from workbench.planners import plan
from workbench.profiles import load_profile


def chain(L: int = 8, weight: float = 4e6) -> Chain:
    layers = tuple(Layer(f"l{i}", 0.01, 0.02, weight, 1e6, 2e6, grad_bytes=weight) for i in range(L))
    return Chain(layers, input_bytes=1e6, meta={"dtype": "float32", "device": "cuda (test)"})


def job(devices: int = 8, batch: int = 32, memory: str = "80GB", **kw) -> Job:
    platform = Target.on("h100-sxm", devices, memory=memory, devices_per_node=4, optimizer="adam", **kw)
    return Job(platform, global_batch=batch, tokens_per_sample=1000, parameters=8 * 1e6, peak_flops=1e15)


@pytest.mark.parametrize("text,message", [
    ("tp=1,pp=2,dp=2", "uses 4 GPUs, not the 8"),
    ("tp=8,pp=1,dp=1", "must divide the 4 GPUs of a node"),
    ("pp=1,dp=8,mbs=3", "global batch 32 is not a multiple of dp=8 x micro-batch size 3"),
    ("pp=2,dp=4,zero=2,schedule=dp", "a periodic plan stashes whole weight versions"),
    ("pp=8,dp=1,zero=1", "zero=1 shards over the data-parallel group, but dp=1"),
    ("pp=2,dp=4,schedule=1f1b,chunks=2", "chunks=2 needs one of torch's multi-stage schedules"),
])
def test_refused_naming_the_values(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        evaluate(job(), Layout.parse(text), lambda tp, mbs: chain())


def test_micro_batches_and_schedule_filled_in():
    lay = complete_layout(job(), Layout.parse("pp=2,dp=4,mbs=2,schedule=zbv"))
    assert (lay.micro_batches, lay.chunks, lay.micro_batch_size) == (4, 2, 2)
    assert complete_layout(job(), Layout(pp=2, dp=4)).schedule == "1f1b"


def test_step_is_the_pipeline_plus_its_parts_and_throughput_by_hand():
    """The step adds up its parts; the pipeline part is the planner's own makespan for the same platform."""
    j = job()
    e = evaluate(j, Layout.parse("pp=2,dp=4,zero=1,schedule=1f1b"), lambda tp, mbs: chain())
    assert e.fits and e.step_seconds == pytest.approx(sum(e.breakdown.values()))
    own = plan(chain(), j.platform.for_layout(e.layout), "1f1b", micro_batches=8)
    assert e.breakdown["pipeline"] == pytest.approx(own.extra["makespan"])
    assert e.breakdown["post_step"] > 0                                  # ZeRO-1's gather after the step
    assert e.tokens_per_second == pytest.approx(32 * 1000 / e.step_seconds)
    assert e.mfu == pytest.approx(6 * 8e6 * e.tokens_per_second / (8 * 1e15))
    assert e.memory == tuple(own.memory)       # the plan's memory is the rank's, with its data-parallel group
    assert [e.rank_memory(r) for r in range(8)] == [e.memory[r // 4] for r in range(8)]


def test_memory_falls_with_zero_and_time_grows_with_collectives():
    """One stage, eight ranks: each ZeRO level holds less; FSDP's per-micro-batch gathers cost time."""
    ch = chain(weight=4e8)
    evs = [evaluate(job(), Layout(pp=1, dp=8, zero=z), lambda tp, mbs: ch) for z in range(4)]
    assert evs[0].peak > evs[1].peak > evs[2].peak > evs[3].peak
    assert evs[3].step_seconds >= evs[2].step_seconds


def test_a_layout_that_does_not_fit_says_so():
    e = evaluate(job(memory="1GB"), Layout(pp=1, dp=8), lambda tp, mbs: chain(weight=4e8))
    assert e.status == "over" and e.peak > 1e9


def test_not_enough_layers_is_infeasible_not_an_error():
    e = evaluate(job(), Layout(pp=8, schedule="interleaved-1f1b"), lambda tp, mbs: chain(L=8))
    assert e.status == "infeasible" and "cannot fill 16" in e.note and math.isinf(e.step_seconds)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv",
                                      "dualpipev"])
def test_extended_flush_within_its_stated_error(schedule):
    """Llama-3-8B's chain, pp 4, 96 micro-batches: the flush simulated at 16 and 24 and extended is within
    1.5 % of the whole simulation (exactly for GPipe, 1F1B and looped BFS), and its memory within 1 %."""
    ch = load_profile("data/profiles/fake/llama3-8b-h100-sxm.csv")
    j = Job(Target.on("h100-sxm", 4, memory="inf", optimizer="adamw", precision="bf16-mixed"), global_batch=96)
    lay = Layout(pp=4, schedule=schedule)
    assert extrapolation_points(4, 96) == (16, 24)
    ext = evaluate(j, lay, lambda tp, mbs: ch)
    whole = evaluate(j, lay, lambda tp, mbs: ch, extrapolate=False)
    assert "extrapolated_from" in ext.plan.extra and "extrapolated_from" not in whole.plan.extra
    error = ext.breakdown["pipeline"] / whole.breakdown["pipeline"] - 1
    exact = schedule in ("1f1b", "gpipe", "looped-bfs")
    assert abs(error) <= (1e-9 if exact else 0.015), f"{schedule}: {error:+.3%}"
    assert max(ext.memory) == pytest.approx(max(whole.memory), rel=0.01)


def test_a_layouts_switches_choose_its_chain():
    lean = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6, 1e6, grad_bytes=4e6) for i in range(8)), input_bytes=1e6,
                 meta={"dtype": "float32", "device": "cuda (test)"})
    calls = []

    def chain_for(tp: int, mbs: int, sequence_parallel: bool = False, loss_parallel: bool = False) -> Chain:
        calls.append((tp, sequence_parallel, loss_parallel))
        return lean if sequence_parallel else chain()

    plain = evaluate(job(), Layout(tp=2, pp=2, dp=2, schedule="1f1b"), chain_for)
    sp = evaluate(job(), Layout(tp=2, pp=2, dp=2, schedule="1f1b", sequence_parallel=True), chain_for)
    assert calls == [(2, False, False), (2, True, False)]
    assert max(sp.memory) < max(plain.memory), (sp.memory, plain.memory)
    with pytest.raises(ValueError, match="sequence_parallel: this chain source has no such per-rank profile"):
        evaluate(job(), Layout(tp=2, pp=2, dp=2, sequence_parallel=True), lambda tp, mbs: chain())


def _overlap_chain():
    """Four layers whose collectives take 2 ms a phase, 0.5 ms (forward) and 1 ms (backward) when overlapped."""
    return Chain(tuple(Layer(f"l{i}", 0.010, 0.020, 4e6, 1e6, comm_forward=0.002, comm_backward=0.002,
                             exposed_forward=0.0005, exposed_backward=0.001) for i in range(4)), input_bytes=1e6)


def test_tp_overlap_prices_each_layer_compute_plus_its_exposed_collectives():
    job = Job(Target.of(2, memory="16GB", bandwidth="100GB/s"), global_batch=4)
    chain = _overlap_chain()
    source = lambda tp, mbs, **kw: chain  # noqa: E731
    plain = evaluate(job, Layout(tp=2, sequence_parallel=True), source)
    overlapped = evaluate(job, Layout(tp=2, sequence_parallel=True, tp_overlap=True), source)
    # one stage, 4 micro-batches one after the other: 4 x 4 layers x (forward + backward), by hand
    assert plain.breakdown["pipeline"] == pytest.approx(4 * 4 * 0.030)
    assert overlapped.breakdown["pipeline"] == pytest.approx(4 * 4 * (0.030 - 0.004 + 0.0015))
    assert overlapped.layout.tp_overlap and overlapped.to_dict()["parallel"]["tp_overlap"] is True


def test_without_tp_overlap_the_overlap_columns_change_nothing():
    import dataclasses

    from workbench.model.chain import OVERLAP_FIELDS

    job = Job(Target.of(4, memory="16GB", bandwidth="100GB/s"), global_batch=8)
    chain = _overlap_chain()
    bare = dataclasses.replace(chain, layers=tuple(dataclasses.replace(l, **dict.fromkeys(OVERLAP_FIELDS))
                                                   for l in chain.layers))
    for lay in (Layout(tp=2, pp=2, sequence_parallel=True, schedule="1f1b"), Layout(tp=2, dp=2, zero=1,
                                                                                  sequence_parallel=True)):
        a = evaluate(job, lay, lambda tp, mbs, **kw: chain)
        b = evaluate(job, lay, lambda tp, mbs, **kw: bare)
        assert (a.step_seconds, a.memory, a.breakdown) == (b.step_seconds, b.memory, b.breakdown)


def test_tp_overlap_on_a_profile_without_the_columns_is_refused():
    job = Job(Target.of(2, memory="16GB", bandwidth="100GB/s"), global_batch=2)
    chain = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6) for i in range(2)), input_bytes=1e6)
    with pytest.raises(ValueError, match="tpo=1: layer 'l0' of this profile has no comm_forward"):
        evaluate(job, Layout(tp=2, sequence_parallel=True, tp_overlap=True), lambda tp, mbs, **kw: chain)


@pytest.mark.parametrize("dtype,element", [("float32", 4), ("bfloat16", 2)])
def test_dp_overlap_prices_megatrons_reduce_scatter_and_gather_by_hand(dtype, element):
    """4 layers of 4 MB on 2 ranks at 100 GB/s: one bucket (under Megatron's 40 M parameters), its fp32
    reduce-scatter after the backward (half the fp32 bytes sent) and its gather before the first forward (half the
    parameter bytes); the pipeline and the optimizer as without dpo."""
    j = Job(Target.of(2, memory="16GB", bandwidth="100GB/s"), global_batch=4)
    ch = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6) for i in range(4)), input_bytes=1e6,
               meta={"dtype": dtype})
    plain = evaluate(j, Layout(dp=2, zero=1), lambda tp, mbs: ch)
    megatron = evaluate(j, Layout(dp=2, zero=1, dp_overlap=True), lambda tp, mbs: ch)
    fp32_grads = 16e6 / element * 4
    assert megatron.breakdown["data_parallel"] == pytest.approx(fp32_grads / 2 / 100e9)
    assert megatron.breakdown["post_step"] == pytest.approx(16e6 / 2 / 100e9)
    assert plain.breakdown["post_step"] == pytest.approx(16e6 / 2 / 100e9)        # torch's gather after the step
    for part in ("pipeline", "optimizer"):
        assert megatron.breakdown.get(part) == plain.breakdown.get(part)
    assert megatron.memory == plain.memory and megatron.to_dict()["parallel"]["dp_overlap"] is True


def test_dp_overlap_hides_the_gathers_behind_a_long_forward():
    """100 M-parameter fp32 layers (one 40 M bucket is smaller than a layer): on 8 ranks across 2 nodes, every gather
    but the first bucket's runs behind the first forward, so ZeRO-1's exposed gather shrinks."""
    platform = Target.of(8, memory="80GB", bandwidth="400GB/s", node_bandwidth="50GB/s", devices_per_node=4)
    j = Job(platform, global_batch=16)
    ch = Chain(tuple(Layer(f"l{i}", 0.5, 1.0, 4e8, 1e6) for i in range(4)), input_bytes=1e6,
               meta={"dtype": "float32"})
    plain = evaluate(j, Layout(dp=8, zero=1), lambda tp, mbs: ch)
    megatron = evaluate(j, Layout(dp=8, zero=1, dp_overlap=True), lambda tp, mbs: ch)
    bucket_gather = 40e6 * 4 * 7 / 8 / 50e9            # one 40 M-parameter fp32 bucket over the node link
    assert plain.breakdown["post_step"] == pytest.approx(4 * 4e8 * 7 / 8 / 50e9)
    assert megatron.breakdown["post_step"] == pytest.approx(bucket_gather)
    assert megatron.step_seconds < plain.step_seconds


def test_dp_overlap_with_a_periodic_schedule_is_refused():
    with pytest.raises(ValueError, match="dpo=1 with 'dp'"):
        evaluate(job(), Layout.parse("pp=2,dp=4,zero=1,schedule=dp,dpo=1"), lambda tp, mbs: chain())
