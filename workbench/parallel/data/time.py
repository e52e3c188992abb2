"""What data parallelism costs in time, and how much of it compute hides (docs/model.md, "Layouts").

A rank of a data-parallel group of D ranks moves, per optimizer step, with W_l and G_l a layer's parameter and
gradient bytes on that rank (its tensor-parallel shard, in the profile's dtype: FSDP2 gathers the bf16
parameters and reduces bf16 gradients under bf16-mixed):

====  =============================================  ======================================================
zero  no pipeline around it (pp = 1)                  in a pipeline (pp > 1: torch's ``PipelineStage``)
====  =============================================  ======================================================
0     all-reduce of G in the last micro-batch         the same, in the stage's last backward
1     as 0, then an all-gather of W after the step    the same
2     per micro-batch: all-gather of W, reduce-       all-gather of W before the first forward; one
      scatter of G                                    reduce-scatter of G after the last backward
3     per micro-batch: all-gather of W for the        one all-gather per micro-batch (and the first);
      forward and again for the backward, reduce-     one reduce-scatter after the last backward
      scatter of G
====  =============================================  ======================================================

each a ring collective on the group's slowest link (:func:`dp_bandwidth`: NVLink inside a node, a node link
across). **Overlap**, as torch runs them: one compute stream and one link, collectives queued in the order the
CPU issues them (:func:`overlapped_seconds`):

* DDP all-reduces a layer's bucket as soon as the last micro-batch's backward has made its gradients (layer =
  bucket), while the backward of the layers before it runs; what is left when the backward ends is exposed;
* FSDP2 gathers layer l + 1 while layer l's forward runs (and, zero 3, layer l - 1 while l's backward runs):
  a layer waits only for what its predecessor's compute did not hide; it reduce-scatters a layer's gradients
  once its backward ends, behind the backward of the layers before it;
* in a pipeline, a stage's end-of-step collectives overlap what the stages before it still compute (the drain:
  stage s ends its last backward about the backward time of stages 0..s-1 before stage 0 does); ZeRO-1's
  all-gather after the step waits for the step and is exposed.

**ZeRO-1 as Megatron-Core runs it** (``dpo=1``: its distributed optimizer with ``--overlap-grad-reduce`` and
``--overlap-param-gather``; :func:`distributed_optimizer_seconds`): the parameters are packed, last layer first, into
buckets of max(40 M, 1 M x D) parameters (:func:`megatron_buckets`); in the last micro-batch's backward a bucket's
gradients are reduce-scattered (in fp32: Megatron's bf16 default) once all of them are made, behind the backward of
the layers before it; after the step each bucket's parameters are all-gathered (in the parameters' dtype) in the
next step's first forward: the first bucket before the forward starts, each next one dispatched when the forward
reaches the bucket before it. A layer's parameters (and its compute) split between two buckets in proportion.

The optimizer step is the GPU time model's (:func:`workbench.profiles.optimizer_time.optimizer_step_seconds`),
over a rank's share of the parameters.

>>> overlapped_seconds([1.0, 1.0], [(0.5, -1, "end", 0), (0.5, 0, "start", 1)])   # gather 0, then prefetch 1
2.5
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

from workbench.model.layout import Layout
from workbench.parallel.collectives import group_bandwidth, ring_seconds

__all__ = ["dp_bandwidth", "overlapped_seconds", "fsdp_micro_batch_seconds", "fsdp_step_seconds",
           "ddp_exposed_seconds", "DataParallelTime", "collective_bytes", "megatron_bucket_parameters",
           "megatron_buckets", "distributed_optimizer_seconds", "GRAD_REDUCE_BYTES"]

#: a collective on the link: (seconds, the compute operation that issues it (-1: before the first), "start" or
#: "end" of it, the compute operation that must wait for it, or None)
Comm = tuple[float, int, str, int | None]


def dp_bandwidth(layout: Layout, *, bandwidth: float, node_bandwidth: float, devices_per_node: int | None) -> float:
    """The bus bandwidth of the layout's slowest data-parallel group (every group runs each collective)."""
    return min(group_bandwidth(g, bandwidth=bandwidth, node_bandwidth=node_bandwidth,
                               devices_per_node=devices_per_node) for g in layout.groups("dp"))


def overlapped_seconds(compute: Sequence[float], comms: Sequence[Comm]) -> float:
    """The time from the first compute operation's start to the end of the last operation or collective: compute
    runs in order, each operation once the collectives it waits for are done; collectives run one at a time on
    the link, in the order they are issued (module docstring)."""
    issued: dict[tuple[int, str], list[int]] = defaultdict(list)
    waits: dict[int, list[int]] = defaultdict(list)
    for j, (_, at, when, needed_by) in enumerate(comms):
        issued[(at, when)].append(j)
        if needed_by is not None:
            waits[needed_by].append(j)
    done: dict[int, float] = {}
    link = 0.0

    def issue(key: tuple[int, str], t: float) -> None:
        nonlocal link
        for j in issued.get(key, ()):
            link = max(link, t) + comms[j][0]
            done[j] = link

    issue((-1, "end"), 0.0)
    t = 0.0
    for i, seconds in enumerate(compute):
        missing = [j for j in waits.get(i, ()) if j not in done]
        if missing:
            raise ValueError(f"compute operation {i} waits for collective {missing[0]}, issued after it starts")
        t = max([t] + [done[j] for j in waits.get(i, ())])
        issue((i, "start"), t)
        t += seconds
        issue((i, "end"), t)
    return max(t, link)


def _micro_batch_ops(forward: Sequence[float], backward: Sequence[float], gather: Sequence[float],
                     scatter: Sequence[float], zero: int, offset: int, first_issue: tuple[int, str]) -> list[Comm]:
    """The collectives of one micro-batch whose forwards are compute operations ``offset..offset+L-1`` and
    backwards the next L (last layer first)."""
    L = len(forward)
    comms: list[Comm] = []
    for l in range(L):          # forward: gather l + 1 while l computes
        at, when = first_issue if l == 0 else (offset + l - 1, "start")
        comms.append((gather[l], at, when, offset + l))
    for k in range(L):          # backward of layer l = L - 1 - k is operation offset + L + k
        l = L - 1 - k
        if zero == 3:
            at, when = (offset + L - 1, "end") if k == 0 else (offset + L + k - 1, "start")
            comms.append((gather[l], at, when, offset + L + k))
        comms.append((scatter[l], offset + L + k, "end", None))
    return comms


def fsdp_micro_batch_seconds(forward: Sequence[float], backward: Sequence[float], gather: Sequence[float],
                             scatter: Sequence[float], zero: int, micro_batches: int) -> float:
    """FSDP2 layer by layer (no pipeline): the seconds of ``micro_batches`` micro-batches' forwards and
    backwards with their all-gathers and reduce-scatters (per layer, seconds), as :func:`overlapped_seconds`
    runs them. One and two micro-batches are run; more add the second's increment each (the steady state)."""
    def run(m: int) -> float:
        compute: list[float] = []
        comms: list[Comm] = []
        for i in range(m):
            offset = len(compute)
            compute += list(forward) + list(reversed(backward))
            comms += _micro_batch_ops(forward, backward, gather, scatter, zero, offset,
                                      (-1, "end") if i == 0 else (offset - 1, "end"))
        return overlapped_seconds(compute, comms)

    one = run(1)
    if micro_batches == 1:
        return one
    two = run(2)
    return two + (micro_batches - 2) * (two - one)


def ddp_exposed_seconds(backward: Sequence[float], reduce: Sequence[float]) -> float:
    """DDP: what the all-reduces of a backward's buckets (one per layer, seconds) add after it ends; layers in
    chain order, the backward runs the last first."""
    compute = list(reversed(backward))
    comms: list[Comm] = [(reduce[len(backward) - 1 - k], k, "end", None) for k in range(len(backward))]
    return overlapped_seconds(compute, comms) - sum(compute)


def fsdp_step_seconds(forward: Sequence[float], gather: Sequence[float]) -> float:
    """A pipeline stage's first forward with FSDP2's gathers (prefetching one layer): what they add to it."""
    comms: list[Comm] = [(gather[l], -1 if l == 0 else l - 1, "end" if l == 0 else "start", l)
                         for l in range(len(forward))]
    return overlapped_seconds(forward, comms) - sum(forward)


#: bytes a gradient element moves in Megatron's reduce-scatter: fp32 (``--bf16`` sets
#: ``accumulate_allreduce_grads_in_fp32`` unless ``--grad-reduce-in-bf16``; NeMo's ``grad_reduce_in_fp32=True``)
GRAD_REDUCE_BYTES = 4


def megatron_bucket_parameters(dp: int) -> int:
    """Megatron-Core's default bucket, in parameters: max(40 M, 1 M x dp) (``DistributedDataParallel``).

    >>> megatron_bucket_parameters(8), megatron_bucket_parameters(64)
    (40000000, 64000000)
    """
    return max(40_000_000, 1_000_000 * dp)


def megatron_buckets(params: Sequence[float], bucket: float) -> list[list[tuple[int, float]]]:
    """Layers' parameters (chain order) packed as Megatron packs them, last layer first, into buckets of at least
    ``bucket`` (the last one what is left): per bucket (backward order), its ``(layer, parameters)`` pieces in
    backward order. A layer without parameters is in none.

    >>> megatron_buckets([3.0, 0.0, 4.0], 5.0)
    [[(2, 4.0), (0, 1.0)], [(0, 2.0)]]
    """
    buckets: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    fill = 0.0
    for layer in reversed(range(len(params))):
        left = float(params[layer])
        while left > 0:
            take = min(left, bucket - fill)
            current.append((layer, take))
            fill, left = fill + take, left - take
            if fill >= bucket:
                buckets.append(current)
                current, fill = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def distributed_optimizer_seconds(forward: Sequence[float], backward: Sequence[float], params: Sequence[float],
                                  gather: Sequence[float], reduce: Sequence[float], bucket: float,
                                  seconds: Callable[[str, float], float]) -> tuple[float, float]:
    """Megatron's distributed optimizer with both overlaps (module docstring), on one rank's layers in chain
    order: ``params`` their parameters, ``gather`` / ``reduce`` the bytes each layer's all-gather / reduce-scatter
    moves (the whole tensors: a bucket moves its pieces' shares), ``seconds(kind, nbytes)`` one collective's time.
    Returns (what the reduce-scatters add after the last backward ends, what the all-gathers add to the first
    forward).

    >>> bytes_as_seconds = lambda kind, nbytes: nbytes
    >>> distributed_optimizer_seconds([1.0, 1.0], [2.0, 2.0], [1.0, 1.0], [0.5, 0.5], [0.5, 0.5], 1.0,
    ...                               bytes_as_seconds)
    (0.5, 0.5)
    >>> [round(x, 6) for x in distributed_optimizer_seconds([0.1, 0.1], [2.0, 2.0], [1.0, 1.0], [0.5, 0.5],
    ...                                                     [0.5, 0.5], 1.0, bytes_as_seconds)]
    [0.5, 0.9]
    """
    buckets = megatron_buckets(params, bucket)
    of_layer: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for b, pcs in enumerate(buckets):
        for layer, n in pcs:
            of_layer[layer].append((b, n / params[layer]))
    # backward order: (bucket or None, layer, share of the layer); a layer without parameters is all compute
    pieces = [(b, layer, f) for layer in reversed(range(len(params))) for b, f in of_layer.get(layer, [(None, 1.0)])]
    cost = lambda b, costs: sum(costs[layer] * f for c, layer, f in pieces if c == b)  # noqa: E731
    back = [backward[layer] * f for _, layer, f in pieces]
    closes = {b: i for i, (b, _, _) in enumerate(pieces) if b is not None}         # at its last piece's end
    comms: list[Comm] = [(seconds("reduce_scatter", cost(b, reduce)), i, "end", None) for b, i in closes.items()]
    reduce_exposed = overlapped_seconds(back, comms) - sum(back)
    order = pieces[::-1]                                                             # forward order
    fwd = [forward[layer] * f for _, layer, f in order]
    first: dict[int, int] = {}
    for i, (b, _, _) in enumerate(order):
        if b is not None:
            first.setdefault(b, i)
    needed = sorted(first, key=first.__getitem__)
    comms = [(seconds("all_gather", cost(b, gather)), -1 if k == 0 else first[needed[k - 1]],
              "end" if k == 0 else "start", first[b]) for k, b in enumerate(needed)]
    gather_exposed = overlapped_seconds(fwd, comms) - sum(fwd)
    return reduce_exposed, gather_exposed


def collective_bytes(zero: int, *, weights: float, grads: float, micro_batches: int, pipelined: bool) -> dict:
    """Bytes each collective moves per optimizer step for a rank holding ``weights`` and ``grads`` bytes (the
    whole tensors, as :func:`workbench.parallel.collectives.ring_seconds` takes them), by kind.

    >>> collective_bytes(3, weights=10.0, grads=10.0, micro_batches=4, pipelined=False)
    {'all_gather': 80.0, 'reduce_scatter': 40.0}
    """
    if zero <= 1:
        out = {"all_reduce": grads}
        if zero == 1:
            out["all_gather"] = weights
        return out
    if pipelined:
        gathers = 1 if zero == 2 else micro_batches + 1
        return {"all_gather": gathers * weights, "reduce_scatter": grads}
    gathers = micro_batches * (2 if zero == 3 else 1)
    return {"all_gather": gathers * weights, "reduce_scatter": micro_batches * grads}


@dataclass(frozen=True)
class DataParallelTime:
    """What data parallelism adds to a step (seconds): ``micro_batch`` per micro-batch on the slowest device
    (zero 3 in a pipeline), ``once`` once per step (zero 2's first gathers in a pipeline), ``tail`` the exposed
    end-of-step reductions, ``post_step`` ZeRO-1's gather after the step, ``optimizer`` the (sharded) step;
    ``bytes`` per collective kind per step for the busiest rank."""

    micro_batch: float = 0.0
    once: float = 0.0
    tail: float = 0.0
    post_step: float = 0.0
    optimizer: float = 0.0
    bytes: dict | None = None

    @property
    def total_extra(self) -> float:
        return self.once + self.tail + self.post_step + self.optimizer


def ring(kind: str, nbytes: float, dp: int, bandwidth: float, latency: float) -> float:
    """One ring collective of ``nbytes`` over the data-parallel group."""
    return ring_seconds(kind, nbytes, ranks=dp, bandwidth=bandwidth, latency=latency)
