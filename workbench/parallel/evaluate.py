"""One layout evaluated: its pipeline planned on the per-rank chain, data parallelism priced, the step's time,
throughput, MFU and every rank's peak memory (docs/model.md, "Layouts").

A :class:`Job` is what every layout of a search shares: the GPUs and the training set-up (a
:class:`~workbench.model.target.Target` whose platform's ``devices`` is their number, with its nodes, links and
memory), the global batch (samples per optimizer step), the tokens a sample holds and the parameters that count in
MFU. A layout's ``micro_batches`` is ``global_batch / (dp x micro_batch_size)``.

:func:`evaluate` plans the pipeline of one data-parallel replica of tensor-parallel rank 0 with the workbench's
planners (``plan``'s methods) on the chain of one rank (:func:`rank_chain`: ``chain_for(tp, micro_batch_size)``,
tensor-parallel shards for tp > 1, with the layout's sequence parallelism and vocabulary-parallel loss) and a
target of the layout's ``pp`` pipeline ranks whose memory model knows the rank's data-parallel group
(:meth:`Target.for_layout <workbench.model.target.Target.for_layout>`: :mod:`workbench.model.memory_zero`), so every
planner plans under the memory a rank really has. The step is

* flushed schedules: the makespan of one flush of the micro-batches (simulated), plus what data parallelism
  adds (:mod:`workbench.parallel.data.time`: FSDP2's exposed gathers and reductions, DDP's exposed all-reduce,
  ZeRO-1's gather after the step, or with ``dpo=1`` Megatron's bucketed reduce-scatter behind the last backward and
  its gather behind the next forward) and the optimizer step;
* the seed's periodic plans (weight stashing: every mini-batch steps its stage): ``micro_batches`` periods,
  each at least the stage's optimizer step beyond the period and at least its all-reduce on the link (it
  overlaps the next mini-batch's compute).

Long flushes are simulated at two smaller counts of micro-batches (:func:`extrapolation_points`) and extended
linearly: a pipeline's steady state adds about the same time and memory per micro-batch (for GPipe, 1F1B and
looped BFS exactly; torch's interleaved, zero-bubble and V orders are not exactly periodic: on Llama-3-8B and
70B chains the extended makespan is within 1.5 % of the whole simulation, ``tests/test_parallel_evaluate.py``).
A plan file's pipeline is simulated whole when the flush has at most :data:`EXACT_FLUSH` operations.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6) for i in range(8)), input_bytes=1e6)
>>> job = Job(Target.of(4, memory="16GB", bandwidth="100GB/s"), global_batch=8)
>>> e = evaluate(job, Layout(pp=2, dp=2, zero=1, schedule="1f1b"), lambda tp, mbs: ch)
>>> e.layout.micro_batches, e.fits, e.step_seconds > 5 * 0.12   # 4 micro-batches + 1 of fill, of 2 x 0.12 s
(4, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from workbench.methods import METHODS, names
from workbench.methods import method as method_of
from workbench.model.chain import Chain
from workbench.model.layout import Layout
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.parallel.data import time as dptime

__all__ = ["Job", "Evaluation", "evaluate", "complete_layout", "extrapolation_points",
           "ChainFor", "rank_chain", "rank_memory", "optimizer_seconds", "data_parallel_ring", "plan_pipeline",
           "step_parts"]

#: ``chain_for(tp, micro_batch_size)``: the chain of one rank of a tensor-parallel group of ``tp``; called with the
#: keywords ``sequence_parallel=True`` / ``loss_parallel=True`` for a layout that sets them (:func:`rank_chain`)
ChainFor = Callable[..., Chain]


def rank_chain(chain_for: ChainFor, layout: Layout) -> Chain:
    """The chain of one rank of ``layout``: ``chain_for(tp, micro_batch_size)``, with ``sequence_parallel`` and
    ``loss_parallel`` passed when the layout sets them (a chain source that does not take them is refused in one
    line: it would plan the layout on the profile without them); with ``tp_overlap``, its layers' collectives
    overlapped with their GEMMs (:func:`workbench.parallel.tensor.overlap.overlapped_chain`).

    >>> rank_chain(lambda tp, mbs, **kw: (tp, mbs, kw), Layout(tp=2, micro_batch_size=1, sequence_parallel=True))
    (2, 1, {'sequence_parallel': True})
    >>> rank_chain(lambda tp, mbs: None, Layout(tp=2, loss_parallel=True))
    Traceback (most recent call last):
    ValueError: tp=2 with loss_parallel: this chain source has no such per-rank profile (it takes tp and the \
micro-batch size only)
    """
    import inspect

    flags = {k: True for k in ("sequence_parallel", "loss_parallel") if getattr(layout, k)}
    mbs = int(layout.micro_batch_size or 1)
    if flags:
        try:
            inspect.signature(chain_for).bind(layout.tp, mbs, **flags)
        except TypeError:
            raise ValueError(f"tp={layout.tp} with {', '.join(flags)}: this chain source has no such per-rank "
                             "profile (it takes tp and the micro-batch size only)") from None
        except ValueError:          # no signature to read: call it
            pass
    chain = chain_for(layout.tp, mbs, **flags)
    if layout.tp_overlap:
        from workbench.parallel.tensor.overlap import overlapped_chain

        return overlapped_chain(chain)
    return chain


@dataclass(frozen=True)
class Job:
    """What every layout of one search shares (module docstring). ``parameters``: N of the 6 N FLOPs-per-token
    convention; ``peak_flops``: one GPU's dense peak in the set-up's precision (0: MFU unknown)."""

    platform: Target
    global_batch: int
    tokens_per_sample: int = 1
    parameters: float = 0.0
    peak_flops: float = 0.0
    micro_batch_size: int = 1

    @property
    def devices(self) -> int:
        return self.platform.devices


@dataclass(frozen=True)
class Evaluation:
    """One layout's figures: ``memory`` per pipeline rank (every rank of the layout holds its pipeline rank's:
    :meth:`rank_memory`), ``breakdown`` the step's seconds by part, ``status`` ``fits``, ``over`` (planned, but
    a rank exceeds the memory) or ``infeasible`` (no plan: ``note`` says why)."""

    layout: Layout
    activations: str
    status: str
    step_seconds: float
    memory: tuple[float, ...]
    tokens_per_second: float
    mfu: float
    breakdown: dict = field(default_factory=dict)
    note: str = ""
    plan: Plan | None = field(default=None, compare=False, repr=False)

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    @property
    def peak(self) -> float:
        return max(self.memory) if self.memory else math.inf

    def rank_memory(self, rank: int) -> float:
        """The predicted peak bytes of ``rank`` (the layout's rank order: tp innermost, then dp, then pp)."""
        return self.memory[self.layout.coords(rank)[0]]

    def to_dict(self) -> dict[str, Any]:
        """One frontier entry of the plan JSON (docs/model.md, "Layouts")."""
        fin = lambda x: x if math.isfinite(x) else None  # noqa: E731
        return {"parallel": self.layout.to_dict(), "activations": self.activations, "status": self.status,
                "step_seconds": fin(self.step_seconds), "tokens_per_second": self.tokens_per_second,
                "tokens_per_second_per_gpu": self.tokens_per_second / self.layout.devices, "mfu": self.mfu,
                "peak_memory": fin(self.peak), "fits": self.fits, "note": self.note}


def rank_memory(evaluation: Evaluation, rank: int) -> float:
    """The predicted peak bytes of one rank of an evaluated layout (:meth:`Evaluation.rank_memory`)."""
    return evaluation.rank_memory(rank)


def complete_layout(job: Job, layout: Layout) -> Layout:
    """``layout`` with its micro-batching and schedule filled in and checked against the job: the micro-batch
    size (the job's), the micro-batches of the global batch, the schedule (default ``1f1b``), its stages per
    rank. A ``ValueError`` names what does not divide or fit."""
    layout.check(job.devices, job.platform.devices_per_node)
    mbs = layout.micro_batch_size or job.micro_batch_size
    if job.global_batch % (layout.dp * mbs):
        raise ValueError(f"global batch {job.global_batch} is not a multiple of dp={layout.dp} x micro-batch size "
                         f"{mbs} (= {layout.dp * mbs})")
    m = job.global_batch // (layout.dp * mbs)
    if layout.micro_batches is not None and layout.micro_batches != m:
        raise ValueError(f"layout: {layout.micro_batches} micro-batches of {mbs} on dp={layout.dp} make "
                         f"{layout.micro_batches * mbs * layout.dp} samples, not the global batch {job.global_batch}")
    schedule = layout.schedule or "1f1b"
    chosen = method_of(schedule)
    chunks = layout.chunks
    if chosen.fixed_chunks:
        chunks = chosen.fixed_chunks
    elif chosen.torch_schedule and chunks == 1:
        chunks = 2
    elif not chosen.torch_schedule and chunks != 1:
        raise ValueError(f"layout: chunks={chunks} needs one of torch's multi-stage schedules, not {schedule!r}")
    if chosen.family == "periodic" and layout.zero >= 2:
        raise ValueError(f"layout: zero={layout.zero} with {schedule!r}: a periodic plan stashes whole weight versions "
                         "per mini-batch in flight; FSDP (zero 2, 3) keeps one sharded version. Use zero 0 or 1, or a "
                         "flushed schedule (gpipe, 1f1b, interleaved-1f1b, ...)")
    if layout.dp_overlap and chosen.family == "periodic":
        raise ValueError(f"layout: dpo=1 with {schedule!r}: Megatron's overlapped distributed optimizer runs flushed "
                         "schedules (its gather waits for the step); use a flushed schedule or dpo=0")
    return replace(layout, micro_batch_size=mbs, micro_batches=m, schedule=schedule, chunks=chunks)


#: the largest flush (micro-batches x stages) a plan file's pipeline is simulated whole for
EXACT_FLUSH = 20_000


#: schedules whose flush grows linearly from pp micro-batches on (the V schedules: from 2 pp on)
_LINEAR_FROM_PP = tuple(m.name for m in METHODS if m.family == "flushed" and m.layout != "v")


def extrapolation_points(pp: int, micro_batches: int, schedule: str = "1f1b") -> tuple[int, int] | None:
    """Two micro-batch counts a flush of ``micro_batches`` on ``pp`` ranks is simulated at when it has more than
    twice the larger: max(16, pp) and that plus max(8, pp / 2); for the V schedules max(16, 2 pp) and that plus
    max(8, pp); None when it is simulated as it is.

    >>> extrapolation_points(8, 128), extrapolation_points(8, 128, "zbv"), extrapolation_points(8, 32)
    ((16, 24), (16, 24), None)
    """
    linear = schedule in _LINEAR_FROM_PP
    first = max(16, pp if linear else 2 * pp)
    second = first + max(8, pp // 2 if linear else pp)
    return (first, second) if micro_batches > 2 * second else None


def _planned(chain: Chain, platform: Target, layout: Layout, activations: str, m: int) -> Plan:
    """The pipeline plan of ``m`` micro-batches (the planner of ``layout.schedule``, not re-checked)."""
    from workbench.model.activations import apply_policies
    from workbench.planners import get_planner

    fn = get_planner(layout.schedule)
    chosen = method_of(layout.schedule)
    options: dict[str, Any] = {}
    if chosen.family == "flushed":
        options["micro_batches"] = m
    if chosen.torch_schedule and not chosen.fixed_chunks:
        options["chunks"] = layout.chunks
    if activations == "auto":
        if not chosen.auto_activations:
            raise ValueError(f"activations auto: {layout.schedule!r} does not choose policies "
                             f"({', '.join(names(auto_activations=True))} do)")
        return fn(chain, platform, activations="auto", **options)
    if activations == "keep":
        return fn(chain, platform, **options)
    return fn(apply_policies(chain, activations), platform, **options).with_(
        activations=(activations,) * len(chain))


def plan_pipeline(chain: Chain, platform: Target, layout: Layout, activations: str,
                  extrapolate: bool = True) -> Plan:
    """The pipeline plan of the layout's micro-batches, extrapolated past :func:`extrapolation_points` (unless
    ``extrapolate`` is False)."""
    m = int(layout.micro_batches or 1)
    flushed = method_of(layout.schedule).family == "flushed"
    points = extrapolation_points(layout.pp, m, layout.schedule) if (flushed and extrapolate) else None
    if points is None:
        return _planned(chain, platform, layout, activations, m)
    (m1, m2) = points
    b = _planned(chain, platform, layout, activations, m2)
    if not b.feasible:
        return b
    a = _same_partition(chain, platform, layout, activations, b, m1)
    if not a.feasible:
        return a
    grow = lambda x, y: y + (m - m2) * (y - x) / (m2 - m1)  # noqa: E731
    makespan = grow(a.extra["makespan"], b.extra["makespan"])
    memory = tuple(grow(x, y) for x, y in zip(a.memory, b.memory))     # GPipe's grows, 1F1B's is flat
    if method_of(layout.schedule).torch_schedule:      # the order's peaks at m, exactly (no clock needed)
        from workbench.parallel.data.ranks import pipeline_peaks

        eff = b.with_(micro_batches=m)
        memory = tuple(float(x) for x in pipeline_peaks(eff, chain, platform))
    note = f"simulated at {m1} and {m2} micro-batches, extended linearly to {m}"
    return b.with_(micro_batches=m, period=makespan / m, memory=memory, notes=tuple(b.notes) + (note,),
                   extra={**b.extra, "makespan": makespan, "extrapolated_from": [m1, m2]})


def _same_partition(chain: Chain, platform: Target, layout: Layout, activations: str, plan: Plan,
                    micro_batches: int) -> Plan:
    """The flush of ``plan``'s partition with ``micro_batches`` micro-batches: torch's multi-stage schedules on
    the chain merged into its stages (one partition left to plan, no memory search); GPipe and 1F1B plan their
    partition without the memory (the same)."""
    from workbench.model.activations import apply_policies

    if not method_of(layout.schedule).torch_schedule:
        return _planned(chain, platform, layout, activations, micro_batches)
    eff = apply_policies(chain, (activations,) * len(chain)) if activations not in ("keep", "auto") else chain
    merged = eff.coarsen([(s.first, s.last) for s in sorted(plan.stages, key=lambda s: s.first)])
    return _planned(merged, platform.with_(memory=math.inf), layout, "keep", micro_batches)


def evaluate(job: Job, layout: Layout, chain_for: ChainFor, activations: str = "keep",
             extrapolate: bool = True) -> Evaluation:
    """Evaluate ``layout`` for ``job`` (module docstring); a layout the job cannot take raises ``ValueError``.
    ``extrapolate=False``: every flush simulated whole."""
    layout = complete_layout(job, layout)
    chain = rank_chain(chain_for, layout)
    platform = job.platform.for_layout(layout)
    if len(chain) < layout.pp * layout.chunks:
        return _infeasible(job, layout, activations, f"{len(chain)} layers cannot fill {layout.pp * layout.chunks} "
                                                       "pipeline stages")
    try:
        pipe = plan_pipeline(chain, platform, layout, activations, extrapolate)
    except ValueError as e:
        return _infeasible(job, layout, activations, str(e))
    if not pipe.feasible:
        return _infeasible(job, layout, activations, "; ".join(pipe.notes) or "no pipeline plan", pipe)
    parts = {k: float(v) for k, v in step_parts(chain, platform, layout, pipe, job).items()}
    step = sum(parts.values())
    tokens = job.global_batch * job.tokens_per_sample / step if step > 0 else 0.0
    mfu = 6 * job.parameters * tokens / (job.devices * job.peak_flops) if job.peak_flops and job.parameters else 0.0
    memory = tuple(float(x) for x in pipe.memory)
    fits = all(x <= job.platform.memory_limit * (1 + REL_TOL) for x in memory)
    return Evaluation(layout, activations, "fits" if fits else "over", step, memory, tokens, mfu, parts,
                      "; ".join(n for n in pipe.notes if "extended linearly" in n), pipe)


def _infeasible(job: Job, layout: Layout, activations: str, why: str, pipe: Plan | None = None) -> Evaluation:
    return Evaluation(layout, activations, "infeasible", math.inf, (), 0.0, 0.0, {}, why, pipe)


def step_parts(chain: Chain, platform: Target, layout: Layout, pipe: Plan, job: Job) -> dict[str, float]:
    """The step's seconds by part: ``pipeline`` (the flush, or the periodic plan's periods), and what data
    parallelism and the optimizer add (module docstring)."""
    from workbench.model.activations import apply_policies

    eff = apply_policies(chain, pipe.activations) if pipe.activations else chain
    devices = _device_layers(pipe)
    optimizer = optimizer_seconds(eff, platform, layout, job, devices)
    ring = data_parallel_ring(job, layout)
    m = int(layout.micro_batches or 1)
    if method_of(layout.schedule).family == "periodic":
        return _periodic_parts(eff, pipe, layout, devices, optimizer, ring, m)
    parts = {"pipeline": float(pipe.extra.get("makespan", pipe.period * m)), "optimizer": max(optimizer)}
    if layout.dp == 1:
        return parts
    if layout.pp == 1 and layout.zero >= 2:
        parts.update(_fsdp_layer_parts(eff, layout, ring, m, parts["pipeline"]))
    else:
        parts.update(_end_of_step_parts(eff, pipe, layout, devices, ring, m))
    return parts


def _device_layers(pipe: Plan) -> list[list[int]]:
    """Per pipeline rank, its layers in chain order."""
    out: list[list[int]] = [[] for _ in range(pipe.devices)]
    for s in pipe.stages:
        out[s.device] += list(range(s.first, s.last + 1))
    return [sorted(x) for x in out]


def data_parallel_ring(job: Job, layout: Layout) -> Callable[[str, float], float]:
    """``ring(kind, nbytes)``: the seconds of one collective over the layout's slowest data-parallel group."""
    bw = dptime.dp_bandwidth(layout, bandwidth=job.platform.bandwidth, node_bandwidth=job.platform.node_bandwidth,
                             devices_per_node=job.platform.devices_per_node)
    return lambda kind, nbytes: dptime.ring(kind, nbytes, layout.dp, bw, job.platform.latency)


def optimizer_seconds(chain: Chain, platform: Target, layout: Layout, job: Job,
                      devices: list[list[int]]) -> list[float]:
    """Per pipeline rank, its optimizer step (its shard from ZeRO-1 on), as the GPU time model prices it
    (:func:`workbench.profiles.optimizer_time.optimizer_step_seconds`, torch's foreach step); 0 without a GPU."""
    from workbench.model.memory import validate_setup
    from workbench.profiles.optimizer_time import optimizer_step_seconds

    if platform.gpu is None or platform.setup.optimizer == "none":
        return [0.0] * len(devices)
    dtype = _dtype_bytes(chain)
    precision = validate_setup(platform, chain)
    share = 1.0 / layout.dp if layout.zero >= 1 else 1.0
    return [optimizer_step_seconds(sum(chain.layers[l].weight_bytes for l in ls) / dtype * share,
                                   platform.setup.optimizer, precision, platform.gpu, tensors=max(1, len(ls)))
            for ls in devices]


def _dtype_bytes(chain: Chain) -> int:
    """Bytes of one element of the profile's parameters."""
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(chain.meta.get("dtype", "float32")), 4)


def _grad(chain: Chain, l: int) -> float:
    g = chain.layers[l].grad_bytes
    return float(chain.layers[l].weight_bytes if g is None else g)


def _periodic_parts(chain: Chain, pipe: Plan, layout: Layout, devices: list[list[int]], optimizer: list[float],
                    ring: Callable[[str, float], float], m: int) -> dict[str, float]:
    """A periodic plan: every mini-batch's period, stretched by the stage's step and bounded below by its
    all-reduce (and ZeRO-1's gather) on the link; ``micro_batches`` of them."""
    link = 0.0
    for ls in devices:
        w = sum(chain.layers[l].weight_bytes for l in ls)
        g = sum(_grad(chain, l) for l in ls)
        if layout.dp > 1:
            link = max(link, ring("all_reduce", g) + (ring("all_gather", w) if layout.zero == 1 else 0.0))
    period = max(pipe.period + max(optimizer), link)
    return {"pipeline": m * pipe.period, "optimizer": m * max(optimizer), "data_parallel": m * period
            - m * (pipe.period + max(optimizer))}


def _fsdp_layer_parts(chain: Chain, layout: Layout, ring: Callable[[str, float], float], m: int,
                      pipeline: float) -> dict[str, float]:
    """FSDP2 layer by layer on a one-stage pipeline: the micro-batches with their gathers and reductions."""
    gather = [ring("all_gather", chain.layers[l].weight_bytes) for l in range(len(chain))]
    scatter = [ring("reduce_scatter", _grad(chain, l)) for l in range(len(chain))]
    total = dptime.fsdp_micro_batch_seconds(list(chain.forward), list(chain.backward), gather, scatter,
                                            layout.zero, m)
    return {"data_parallel": max(total - pipeline, 0.0)}


def _end_of_step_parts(chain: Chain, pipe: Plan, layout: Layout, devices: list[list[int]],
                       ring: Callable[[str, float], float], m: int) -> dict[str, float]:
    """DDP and ZeRO-1 (any pp) and FSDP2 in a pipeline: the reductions at the end of the step (behind each
    rank's last backward, and the drain of the stages before it), FSDP2's gathers, ZeRO-1's gather after (with
    ``dpo``: what the rank's first forward does not hide of it, :func:`_megatron_zero1`)."""
    first_stage = {d: min((s_i for s_i, s in enumerate(pipe.stages) if s.device == d), default=0)
                   for d in range(len(devices))}
    stage_backward = [float(chain.backward[s.first:s.last + 1].sum()) for s in pipe.stages]
    tail = once = per_mb = post = 0.0
    for d, ls in enumerate(devices):
        if not ls:
            continue
        slack = sum(stage_backward[:first_stage[d]])
        w = [chain.layers[l].weight_bytes for l in ls]
        if layout.dp_overlap:
            exposed, gathered = _megatron_zero1(chain, ls, ring, layout.dp)
            post = max(post, gathered)
        elif layout.zero <= 1:
            exposed = dptime.ddp_exposed_seconds([chain.backward[l] for l in ls],
                                                 [ring("all_reduce", _grad(chain, l)) for l in ls])
            if layout.zero == 1:
                post = max(post, ring("all_gather", sum(w)))
        else:
            exposed = ring("reduce_scatter", sum(_grad(chain, l) for l in ls))
            gathered = dptime.fsdp_step_seconds([chain.forward[l] for l in ls], [ring("all_gather", x) for x in w])
            once += gathered
            if layout.zero == 3:
                per_mb = max(per_mb, 2 * gathered)
        tail = max(tail, exposed - slack)
    return {"data_parallel": max(tail, 0.0) + once + m * per_mb, "post_step": post}


def _megatron_zero1(chain: Chain, layers: list[int], ring: Callable[[str, float], float],
                    dp: int) -> tuple[float, float]:
    """ZeRO-1 as Megatron's distributed optimizer overlaps it on one rank's ``layers``: (its reduce-scatters'
    exposed tail, its all-gathers' exposed part), :func:`workbench.parallel.data.time.distributed_optimizer_seconds`;
    gradients reduced in fp32, parameters gathered in the profile's dtype."""
    dtype = _dtype_bytes(chain)
    params = [chain.layers[l].weight_bytes / dtype for l in layers]
    gather = [chain.layers[l].weight_bytes for l in layers]
    reduce = [_grad(chain, l) / dtype * dptime.GRAD_REDUCE_BYTES for l in layers]
    return dptime.distributed_optimizer_seconds([chain.forward[l] for l in layers], [chain.backward[l] for l in layers],
                                                params, gather, reduce, dptime.megatron_bucket_parameters(dp), ring)
