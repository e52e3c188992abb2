"""The layout search (workbench.parallel.search) against evaluating every layout it enumerates: the answer is
at least as fast as every layout that fits, its bounds are bounds, every frontier entry is what evaluating that
layout alone gives."""

from __future__ import annotations

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.parallel.evaluate import Job, evaluate
from workbench.parallel.search import candidates, describe_switches, factorisations, memory_bound, search, time_bound


def chain(mbs: int = 1) -> Chain:
    """Eight layers with a heavy head; activations and time scale with the micro-batch size."""
    layers = [Layer(f"l{i}", 0.01 * mbs * (1 + (i == 7)), 0.02 * mbs * (1 + (i == 7)), 2e8 * (1 + 3 * (i == 7)),
                    1e7 * mbs, 3e8 * mbs, grad_bytes=2e8 * (1 + 3 * (i == 7))) for i in range(8)]
    return Chain(tuple(layers), input_bytes=1e7 * mbs, meta={"dtype": "bfloat16", "device": "cuda (test)"})


CHAINS = {m: chain(m) for m in (1, 2)}


def chain_for(tp: int, mbs: int | None) -> Chain:
    return CHAINS[mbs or 1]


def job(memory: str) -> Job:
    platform = Target.on("h100-sxm", 8, memory=memory, devices_per_node=4, optimizer="adamw",
                           precision="bf16-mixed")
    return Job(platform, global_batch=16, tokens_per_sample=100, parameters=2e9, peak_flops=1e15)


def test_factorisations_cover_every_split():
    got = factorisations(16, 8, tps=(1, 2, 4, 8))
    assert len(got) == len(set(got)) and all(t * p * d == 16 and 8 % t == 0 for t, p, d in got)
    assert len(got) == sum(1 for t in (1, 2, 4, 8) for p in range(1, 17) if (16 // t) % p == 0)


@pytest.mark.parametrize("memory", ["6GB", "40GB"])
def test_search_finds_the_fastest_layout_that_fits(memory):
    j = job(memory)
    sizes = (1, 2)
    every = search(j, chain_for, micro_batch_sizes=sizes, prune=False)
    pruned = search(j, chain_for, micro_batch_sizes=sizes)
    fitting = [e for e in every.evaluated if e.fits]
    assert fitting, "the instance should have layouts that fit"
    fastest = min(e.step_seconds for e in fitting)
    assert pruned.best is not None and pruned.best.step_seconds == pytest.approx(fastest)
    assert pruned.best.step_seconds <= min(e.step_seconds for e in pruned.evaluated if e.fits) + 1e-12
    assert len(pruned.evaluated) < len(every.evaluated)
    # the bounds are bounds: no layout is faster than its time bound or holds less than its memory bound
    by_key = {(c.layout, c.activations): c for c in candidates(j, 8, micro_batch_sizes=sizes)}
    for e in every.evaluated:
        c = by_key[(e.layout, e.activations)]
        ch = chain_for(1, e.layout.micro_batch_size)
        assert time_bound(j, c, ch) <= e.step_seconds * (1 + 1e-9)
        if e.memory:
            assert memory_bound(j, c, ch) <= e.peak * (1 + 1e-9)


def test_every_frontier_entry_is_its_own_evaluation():
    j = job("12GB")
    result = search(j, chain_for, micro_batch_sizes=(1, 2))
    for e in result.evaluated:
        again = evaluate(j, e.layout, chain_for, e.activations)
        assert (again.status, again.step_seconds, again.memory) == (e.status, e.step_seconds, e.memory)


def test_nothing_fits_says_the_least_memory():
    result = search(job("1GB"), chain_for, micro_batch_sizes=(1,))
    assert result.best is None
    least = result.least_memory()
    assert 1e9 < least < float("inf")


def test_the_switches_asked_are_tried_for_tp_above_one_each_on_its_chain():
    asked = []

    def switched(tp: int, mbs: int | None, sequence_parallel: bool = False, loss_parallel: bool = False) -> Chain:
        asked.append((tp, sequence_parallel, loss_parallel))
        return CHAINS[mbs or 1]

    result = search(job("40GB"), switched, micro_batch_sizes=(1,), tps=(1, 2), prune=False,
                    sequence_parallel=(False, True), loss_parallel=(True,))
    seen = {(e.layout.tp, e.layout.sequence_parallel, e.layout.loss_parallel) for e in result.evaluated}
    assert seen == {(1, False, False), (2, False, True), (2, True, True)}
    assert set(asked) == seen | {(1, False, False)}
    plain = search(job("40GB"), chain_for, micro_batch_sizes=(1,), tps=(1, 2), sequence_parallel=(True,))
    assert all(e.layout.tp == 1 for e in plain.evaluated)        # a chain source without the switch: not profiled
    assert any("tp=2" in n and "sequence parallel" in n for n in plain.notes)


def test_tp_overlap_is_asked_for_and_set_on_the_sequence_parallel_layouts_only():
    j = job("80GB")
    plain = candidates(j, 8, tps=None, sequence_parallel=(False, True))
    asked = candidates(j, 8, tps=None, sequence_parallel=(False, True), tp_overlap=True)
    assert not any(c.layout.tp_overlap for c in plain) and len(plain) == len(asked)
    assert all(c.layout.tp_overlap == (c.layout.tp > 1 and c.layout.sequence_parallel) for c in asked)
    assert any(c.layout.tp_overlap for c in asked)


def test_dp_overlap_is_set_on_the_flushed_zero_1_layouts_only():
    j = job("80GB")
    plain = candidates(j, 8, tps=(1,))
    asked = candidates(j, 8, tps=(1,), dp_overlap=True)
    assert not any(c.layout.dp_overlap for c in plain) and len(plain) == len(asked)
    from workbench.methods import method

    flushed = lambda c: method(c.layout.schedule).family == "flushed"  # noqa: E731
    assert all(c.layout.dp_overlap == (c.layout.zero == 1 and flushed(c)) for c in asked)
    assert any(c.layout.dp_overlap for c in asked)


def test_by_default_both_settings_are_searched_where_the_chain_source_takes_them():
    asked = set()

    def switched(tp: int, mbs: int | None, sequence_parallel: bool = False, loss_parallel: bool = False) -> Chain:
        asked.add((tp, sequence_parallel, loss_parallel))
        return CHAINS[mbs or 1]

    few = dict(micro_batch_sizes=(1,), tps=(1, 2), prune=False, degrees=[(1, 1, 8), (2, 1, 4), (2, 2, 2)],
               schedules=("1f1b",), zeros=(0,), activations=("keep",))
    result = search(job("40GB"), switched, **few)
    assert result.switches == {"sequence_parallel": (False, True), "loss_parallel": (False, True)}
    seen = {(e.layout.tp, e.layout.sequence_parallel, e.layout.loss_parallel) for e in result.evaluated}
    assert seen == asked == {(1, False, False)} | {(2, sp, lp) for sp in (False, True) for lp in (False, True)}
    assert not result.notes
    pinned = search(job("40GB"), switched, loss_parallel=(False,), **few)
    assert {e.layout.loss_parallel for e in pinned.evaluated} == {False}
    assert {e.layout.sequence_parallel for e in pinned.evaluated if e.layout.tp == 2} == {False, True}
    plain = search(job("40GB"), chain_for, **few)
    assert plain.switches == {"sequence_parallel": (False,), "loss_parallel": (False,)}     # takes neither keyword
    assert any(e.layout.tp == 2 for e in plain.evaluated) and len(plain.notes) == 2
    assert describe_switches(result.switches) == "sp 0/1, lp 0/1 for tp > 1"
