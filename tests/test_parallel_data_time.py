"""Data parallelism's time (workbench.parallel.data.time) against hand-computed timelines and a brute-force
event simulation that shares no code with it."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.model.layout import Layout
from workbench.parallel.data.time import (
    collective_bytes,
    ddp_exposed_seconds,
    distributed_optimizer_seconds,
    dp_bandwidth,
    fsdp_micro_batch_seconds,
    fsdp_step_seconds,
    megatron_bucket_parameters,
    megatron_buckets,
    overlapped_seconds,
)


def brute_overlap(compute, comms):
    """The same timeline by fixed-point iteration over start times (no issue queue): a collective starts at
    max(its trigger, the previous collective's end); an operation at max(the previous operation's end, its
    collectives' ends)."""
    n = len(compute)
    start = [0.0] * n
    for _ in range(4 * (n + len(comms)) + 4):
        end = [s + c for s, c in zip(start, compute)]
        link, done = 0.0, []
        for sec, at, when, _ in comms:
            t = 0.0 if at < 0 else (start[at] if when == "start" else end[at])
            link = max(link, t) + sec
            done.append(link)
        new = []
        for i in range(n):
            prev = new[i - 1] + compute[i - 1] if i else 0.0
            need = [done[j] for j, c in enumerate(comms) if c[3] == i]
            new.append(max([prev] + need))
        if new == start:
            break
        start = new
    end = [s + c for s, c in zip(start, compute)]
    return max(end[-1], max(done) if done else 0.0)


@pytest.mark.parametrize("seed", range(20))
def test_overlap_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    compute = [float(x) for x in rng.uniform(0.1, 2.0, n)]
    comms = [(0.0 + float(rng.uniform(0.1, 2.0)), -1, "end", 0)]
    for i in range(1, n):          # a prefetch of i while i - 1 computes, and a reduction after i - 1
        comms.append((float(rng.uniform(0.0, 2.0)), i - 1, "start", i))
        comms.append((float(rng.uniform(0.0, 1.0)), i - 1, "end", None))
    assert overlapped_seconds(compute, comms) == pytest.approx(brute_overlap(compute, comms))


def test_fsdp_compute_bound_hides_all_but_the_first_gather_and_last_reduction():
    """Cheap collectives: one micro-batch takes its compute, plus the first layer's gather (nothing to hide it),
    under zero 3 the last layer's gather again when its backward starts (it was resharded after its forward),
    and the first layer's reduce-scatter (issued after the last backward)."""
    f, b = [1.0] * 4, [2.0] * 4
    total = fsdp_micro_batch_seconds(f, b, [0.1] * 4, [0.2] * 4, zero=3, micro_batches=1)
    assert total == pytest.approx(12.0 + 0.1 + 0.1 + 0.2)
    assert fsdp_micro_batch_seconds(f, b, [0.1] * 4, [0.2] * 4, zero=2, micro_batches=1) == pytest.approx(12.3)


def test_fsdp_link_bound_takes_the_link_time():
    """Collectives far slower than compute: the link's total is the floor, and each micro-batch adds its share."""
    f, b = [0.01] * 4, [0.02] * 4
    one = fsdp_micro_batch_seconds(f, b, [1.0] * 4, [1.0] * 4, zero=3, micro_batches=1)
    assert one >= 4 * (1.0 + 1.0 + 1.0) - 1e-9           # zero 3: two gathers and one reduce-scatter per layer
    four = fsdp_micro_batch_seconds(f, b, [1.0] * 4, [1.0] * 4, zero=3, micro_batches=4)
    assert 4 * 12.0 <= four <= 4 * (12.0 + sum(f) + sum(b))     # the link's, and at most its compute beside
    zero2 = fsdp_micro_batch_seconds(f, b, [1.0] * 4, [1.0] * 4, zero=2, micro_batches=1)
    assert 8.0 <= zero2 <= 8.0 + sum(f) + sum(b) < one   # no backward gathers: the link's 8 s and little more


def test_ddp_exposes_what_the_backward_cannot_hide():
    # backward runs layers 2, 1, 0 (1 s each); all-reduces of 1.5 s start after each: ends at 1+1.5*3 = 5.5
    assert ddp_exposed_seconds([1.0, 1.0, 1.0], [1.5, 1.5, 1.5]) == pytest.approx(5.5 - 3.0)
    assert ddp_exposed_seconds([1.0, 1.0, 1.0], [0.1, 0.1, 0.1]) == pytest.approx(0.1)


def test_first_forward_gathers():
    assert fsdp_step_seconds([1.0, 1.0], [0.5, 0.5]) == pytest.approx(0.5)   # the first gather only
    assert fsdp_step_seconds([0.1, 0.1], [1.0, 1.0]) == pytest.approx(2.0 + 0.1 - 0.2)   # gathers, then the last layer


def test_dp_group_on_the_node_link_when_it_crosses_nodes():
    inside = Layout(tp=1, pp=8, dp=8)                     # a dp group = 8 consecutive ranks: one node
    across = Layout(tp=8, pp=1, dp=8)                     # a dp group = ranks 0, 8, 16, ...: every node
    kw = dict(bandwidth=450e9, node_bandwidth=50e9, devices_per_node=8)
    assert dp_bandwidth(inside, **kw) == 450e9 and dp_bandwidth(across, **kw) == 50e9


def test_collective_bytes_by_level():
    per_mb = {z: collective_bytes(z, weights=10.0, grads=20.0, micro_batches=3, pipelined=False) for z in range(4)}
    assert per_mb[0] == {"all_reduce": 20.0}
    assert per_mb[1] == {"all_reduce": 20.0, "all_gather": 10.0}
    assert per_mb[2] == {"all_gather": 30.0, "reduce_scatter": 60.0}
    assert collective_bytes(2, weights=10.0, grads=20.0, micro_batches=3, pipelined=True) == \
        {"all_gather": 10.0, "reduce_scatter": 20.0}


# ZeRO-1 as Megatron's distributed optimizer overlaps it (dpo=1); seconds = bytes in the hand cases
def as_seconds(kind, nbytes):
    return nbytes


def test_megatron_buckets_pack_from_the_last_layer_and_split_layers_between_buckets():
    assert megatron_buckets([2.0, 2.0, 2.0], 2.0) == [[(2, 2.0)], [(1, 2.0)], [(0, 2.0)]]
    assert megatron_buckets([1.0, 3.0], 2.0) == [[(1, 2.0)], [(1, 1.0), (0, 1.0)]]
    assert megatron_buckets([5.0, 0.0, 1.0], 40.0) == [[(2, 1.0), (0, 5.0)]]         # one bucket, whatever is left
    assert megatron_bucket_parameters(16) == 40_000_000 and megatron_bucket_parameters(100) == 100_000_000


def test_a_long_forward_hides_every_gather_but_the_first():
    """One bucket per layer, 0.4 s each: the first waits before the forward starts; each next one is dispatched when
    the forward reaches the bucket before it and is done 0.4 s later, inside that layer's 1 s forward."""
    reduce, gather = distributed_optimizer_seconds([1.0] * 3, [2.0] * 3, [2.0] * 3, [0.4] * 3, [0.4] * 3, 2.0,
                                                   as_seconds)
    assert gather == pytest.approx(0.4)
    assert reduce == pytest.approx(0.4)        # the first layer's bucket, after the backward has ended


def test_a_short_forward_leaves_the_gathers_exposed():
    """0.1 s forwards: bucket 0 done at 0.4, layer 0 runs 0.4-0.5; bucket 1 (dispatched at 0.4) done at 0.8, layer
    1 runs 0.8-0.9; bucket 2 (dispatched at 0.8) done at 1.2, layer 2 runs 1.2-1.3: 1.3 - 0.3 s of forward."""
    _, gather = distributed_optimizer_seconds([0.1] * 3, [2.0] * 3, [2.0] * 3, [0.4] * 3, [0.4] * 3, 2.0, as_seconds)
    assert gather == pytest.approx(1.0)


def test_a_bucket_across_two_layers_reduces_when_its_last_piece_is_made():
    """params [1, 3], buckets of 2: bucket 0 = 2 of layer 1's 3 (made after 2 of its 3 s of backward), bucket 1 =
    the rest of layer 1 and layer 0 (made when the backward ends at 4 s). Reduce-scatters: 3.0 x 2/3 = 2 s from 2 s
    to 4 s, then 3.0 / 3 + 0.6 = 1.6 s from 4 s: 1.6 s exposed."""
    reduce, gather = distributed_optimizer_seconds([0.5, 1.5], [1.0, 3.0], [1.0, 3.0], [0.6, 3.0], [0.6, 3.0], 2.0,
                                                   as_seconds)
    assert reduce == pytest.approx(1.6)
    # forward: bucket 1 (layer 0 and a third of layer 1: 0.6 + 1.0 s) first, exposed; bucket 0 (2.0 s) dispatched at
    # 1.6 s, done at 3.6 s; the forward reaches it at 1.6 + 0.5 + 0.5 = 2.6 s: 1.0 s more
    assert gather == pytest.approx(1.6 + 1.0)


def test_a_layer_without_parameters_still_computes():
    reduce, gather = distributed_optimizer_seconds([1.0, 5.0], [1.0, 5.0], [2.0, 0.0], [0.5, 0.0], [0.5, 0.0], 2.0,
                                                   as_seconds)
    assert reduce == pytest.approx(0.5)        # layer 0's bucket after the whole 6 s backward
    assert gather == pytest.approx(0.5)


def brute_distributed_optimizer(forward, backward, params, gather, reduce, bucket):
    """The same by interval arithmetic on the parameters' positions (chain order, each layer's compute spread
    evenly over its parameters; no timeline shared with the module)."""
    edges = np.concatenate([[0.0], np.cumsum(params)])
    total = edges[-1]
    cuts = sorted({total - k * bucket for k in range(int(total // bucket) + 1) if total - k * bucket > 0} | {0.0})
    spans = list(zip(cuts[:-1], cuts[1:])) if len(cuts) > 1 else [(0.0, total)]

    def integral(costs, a, b):       # of a per-layer cost spread over [a, b)
        return sum(c * max(0.0, min(b, e1) - max(a, e0)) / (e1 - e0)
                   for c, e0, e1 in zip(costs, edges[:-1], edges[1:]))

    # backward runs from the end: a span is made when the backward reaches its start
    link = 0.0
    back_total = float(sum(backward))
    for a, b in reversed(spans):
        ready = integral(backward, a, total)
        link = max(link, ready) + integral(reduce, a, b)
    reduce_exposed = max(link - back_total, 0.0)
    # forward from the start: bucket j + 1's gather is dispatched when the forward reaches bucket j
    link = t = integral(gather, *spans[0])
    for j in range(1, len(spans)):
        link = max(link, t) + integral(gather, *spans[j])
        t = max(t + integral(forward, spans[j - 1][0], spans[j][0]), link)
    t += integral(forward, spans[-1][0], total)
    return reduce_exposed, t - float(sum(forward))


@pytest.mark.parametrize("seed", range(15))
def test_distributed_optimizer_matches_interval_arithmetic(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 7))
    params = [float(x) for x in rng.integers(1, 6, n)]
    fwd, bwd = ([float(x) for x in rng.uniform(0.05, 2.0, n)] for _ in range(2))
    gather, reduce = ([float(x) for x in rng.uniform(0.0, 1.5, n)] for _ in range(2))
    bucket = float(rng.integers(1, 8))
    got = distributed_optimizer_seconds(fwd, bwd, params, gather, reduce, bucket, as_seconds)
    assert got == pytest.approx(brute_distributed_optimizer(fwd, bwd, params, gather, reduce, bucket))
