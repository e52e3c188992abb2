"""``plan --parallel``: a layout of tensor x pipeline x data parallelism, one evaluated or the fastest searched
(docs/model.md, "Layouts").

    plan --module FILE.py:FUNC [--fake --gpu NAME] --devices N [--devices-per-node K] [--node-bandwidth B]
         --global-batch G --parallel auto[,sp=S][,lp=L][,tpo=O][,dpo=Q]
                                   |tp=T,pp=P,dp=D[,zero=Z][,sp=S][,lp=L][,tpo=O][,dpo=Q]
         [--method M]
         [--chunks V]
         [--activations keep|recompute|auto] [--optimizer ...] [--precision ...] --json OUT

The model is profiled as ``profile`` would (``--fake --gpu``: under fake tensors for that GPU; else on this
machine), once per tensor-parallel degree and micro-batch size, cached by content
(:class:`workbench.parallel.profiles.RankChains`); ``--profile FILE`` instead gives the chain of ``tp = 1`` and
its batch. ``--parallel auto`` searches every layout (:func:`workbench.parallel.search.search`), prints the
frontier and writes the fastest that fits with the whole frontier (its ``tp > 1`` layouts each with and without
sequence parallelism and the vocabulary-parallel loss, every setting on its own per-rank profile; ``auto,sp=0``,
``auto,lp=1`` pin one);
``--parallel tp=..,pp=..,dp=..`` evaluates one (:func:`workbench.parallel.evaluate.evaluate`), ``sp=1``/``lp=1``
on the per-rank profile with them; ``tpo=1`` (with ``sp=1``; ``auto,sp=1,tpo=1`` for the search's) prices their
collectives overlapped with their GEMMs, as Megatron's ``--tp-comm-overlap`` runs them
(:mod:`workbench.parallel.tensor.overlap`; off by default); ``dpo=1`` (with ``zero=1``; ``auto,dpo=1`` for the
search's ZeRO-1 layouts) prices ZeRO-1 as Megatron's distributed optimizer overlaps it
(:func:`workbench.parallel.data.time.distributed_optimizer_seconds`; off by default). Bad input (a layout that
is not ``--devices``, a ``tp`` larger than a node or not dividing the heads, a global batch the micro-batches and
``dp`` do not divide, a ``zero`` the schedule cannot shard) is one ``error:`` line, exit 2; a layout that fits
nowhere says the least memory it needs per rank (exit 2).

>>> tokens_per_sample({"input_shape": "1x2048", "input_dtype": "int64"})
2048
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any, Callable

from workbench.front.planning import _progress, chain_from_args, platform_from_args
from workbench.model.chain import Chain
from workbench.model.layout import Layout
from workbench.model.units import format_bytes
from workbench.parallel.evaluate import ChainFor, Evaluation, Job, evaluate, rank_chain

__all__ = ["layout_command", "auto_switches", "job_from_args", "tokens_per_sample", "model_parameters", "layout_plan",
           "frontier_table", "MFU_CONVENTION"]

MFU_CONVENTION = ("6 N FLOPs per token (forward 2 N, backward 4 N), N the parameters of every layer but an input "
                  "embedding's (a lookup: no multiply-add); attention's score FLOPs not counted; recomputation not "
                  "counted (model FLOPs, not hardware FLOPs); over the GPUs' dense peak in the set-up's precision")


def tokens_per_sample(meta: dict) -> int:
    """Tokens in one sample: the input's size past the batch dimension when the input is integer token ids
    (``input_shape`` ``BxT...``), else 1 (a sample is the unit)."""
    shape = str(meta.get("input_shape", "") or "")
    if "int" not in str(meta.get("input_dtype", "")) or "x" not in shape:
        return 1
    return math.prod(int(x) for x in shape.split("x")[1:])


def model_parameters(chain: Chain) -> float:
    """N of the 6 N convention: the parameters of every layer, but a first layer that is an embedding lookup."""
    dtype = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}.get(str(chain.meta.get("dtype", "float32")), 4)
    first = chain.layers[0].name.lower()
    skip = 1 if any(k in first for k in ("embed", "wte", "word_embeddings")) else 0
    return float(sum(l.weight_bytes for l in chain.layers[skip:])) / dtype


def _check_args(args: argparse.Namespace) -> None:
    """What ``plan --parallel`` needs before anything is profiled."""
    if not getattr(args, "parallel", None):
        raise ValueError("plan --module: give --parallel auto (search every layout) or --parallel tp=T,pp=P,dp=D")
    if args.global_batch is None:
        raise ValueError("--parallel needs --global-batch G: the samples of one optimizer step")
    if bool(args.module) == bool(args.profile):
        both = "not both" if args.module else "one of them"
        raise ValueError(f"--parallel: give --module FILE.py:FUNC (profiled for every tp and micro-batch size) or "
                         f"--profile FILE (the chain of tp=1 and its batch), {both}")
    if args.fake and not (args.module and args.gpu):
        raise ValueError("--fake needs --module FILE.py:FUNC and --gpu NAME (the GPU whose times it estimates)")
    if getattr(args, "kernels", "eager") != "eager" and not args.fake:
        raise ValueError(f"--kernels {args.kernels} goes with --module and --fake (fused kernels are priced under "
                         "fake tensors)")
    if args.memory_model == "paper":
        raise ValueError("--parallel needs the full memory model (data parallelism shards what it counts), "
                         "not --memory-model paper")
    if args.allocation != "contiguous" or args.micro_batches is not None:
        raise ValueError("--parallel: the micro-batches come from --global-batch and the pipeline is contiguous; "
                         "drop --allocation and --micro-batches")


def _chains(args: argparse.Namespace, progress: Callable[[str], None] | None) -> tuple[ChainFor, Chain, tuple]:
    """(chain_for, the tp = 1 chain of the example's batch, the micro-batch sizes to try)."""
    if args.profile:
        chain = chain_from_args(args)
        example = int(chain.meta.get("batch_size", 1) or 1)

        def from_profile(tp: int, mbs: int | None, **switches: bool) -> Chain:
            if tp != 1 or (mbs is not None and mbs != example) or any(switches.values()):
                raise ValueError(f"--profile {args.profile} is the chain of tp=1 and micro-batch size {example}; "
                                 f"tp={tp}, micro-batch size {mbs} needs --module FILE.py:FUNC")
            return chain

        return from_profile, chain, (example,)
    from workbench.parallel.profiles import DEFAULT_CACHE, RankChains

    rc = RankChains(args.module, gpu=args.gpu if args.fake else None,
                    cache=Path(args.profile_cache) if args.profile_cache else DEFAULT_CACHE, progress=progress,
                    kernels=getattr(args, "kernels", "eager"))
    first = rc(1, None)
    example = int(first.meta.get("batch_size", 1) or 1)
    sizes = rc.micro_batch_sizes()
    if sizes == (None,):
        def fixed(tp: int, mbs: int | None, **switches: bool) -> Chain:
            if mbs is not None and mbs != example:
                raise ValueError(f"micro-batch size {mbs}: {args.module} takes no batch_size; its batch is {example}")
            return rc(tp, None, **switches)

        return fixed, first, (example,)

    def sized(tp: int, mbs: int | None, **switches: bool) -> Chain:
        return rc(tp, None if mbs == example else mbs, **switches)

    return sized, first, tuple(s for s in sizes if s is not None)


def job_from_args(args: argparse.Namespace, first: Chain) -> Job:
    """The job of the command line: the GPUs and their set-up, the global batch, what counts in MFU."""
    from workbench.model.accelerators import accelerator
    from workbench.model.memory import validate_setup

    platform = platform_from_args(args)
    precision = validate_setup(platform, first)
    peak = 0.0
    if platform.gpu:
        peak = accelerator(platform.gpu).peak("float32" if precision == "fp32" else "bfloat16")
    return Job(platform, int(args.global_batch), tokens_per_sample(first.meta), model_parameters(first), peak,
               int(first.meta.get("batch_size", 1) or 1))


def _layout_arg(args: argparse.Namespace) -> Layout:
    layout = Layout.parse(args.parallel)
    if args.method and layout.schedule and args.method != layout.schedule:
        raise ValueError(f"--method {args.method} contradicts --parallel's schedule={layout.schedule}")
    changes: dict[str, Any] = {}
    if args.method:
        changes["schedule"] = args.method
    if args.chunks is not None:
        changes["chunks"] = args.chunks
    return layout.with_(**changes) if changes else layout


def auto_switches(text: str) -> tuple[tuple[bool, ...] | None, tuple[bool, ...] | None] | None:
    """The settings of sequence parallelism and of the vocabulary-parallel loss ``--parallel auto[,sp=S][,lp=L]``
    searches for its ``tp > 1`` layouts: None for one not given (the search tries both), the one given where it
    is pinned; None when ``text`` is a layout, not ``auto``.

    >>> auto_switches("auto"), auto_switches("auto, sp=1"), auto_switches("auto,lp=0"), auto_switches("tp=2")
    ((None, None), ((True,), None), (None, (False,)), None)
    >>> auto_switches("auto,pp=2")
    Traceback (most recent call last):
    ValueError: --parallel auto,pp=2: auto takes only sp=, lp=, tpo= and dpo= (the search chooses the rest)
    """
    switches = _auto_layout(text)
    if switches is None:
        return None
    keys = set(_auto_keys(text))
    sp = (switches.sequence_parallel,) if {"sp", "sequence_parallel"} & keys else None
    lp = (switches.loss_parallel,) if {"lp", "loss_parallel"} & keys else None
    return sp, lp


def auto_overlaps(text: str) -> tuple[bool, bool]:
    """Whether ``--parallel auto,...`` asks its ``tp > 1`` layouts to overlap their collectives (``tpo=1``, which
    needs ``sp=1``) and its ZeRO-1 layouts to run as Megatron's overlapped distributed optimizer (``dpo=1``);
    (False, False) for a layout, not ``auto``.

    >>> auto_overlaps("auto,tpo=1"), auto_overlaps("auto,dpo=1"), auto_overlaps("auto,sp=1")
    ((True, False), (False, True), (False, False))
    >>> auto_overlaps("tp=2,sp=1,tpo=1"), auto_overlaps("dp=2,zero=1,dpo=1")
    ((False, False), (False, False))
    >>> auto_overlaps("auto,sp=0,tpo=1")
    Traceback (most recent call last):
    ValueError: --parallel auto,sp=0,tpo=1: layout: tpo=1 overlaps sequence parallelism's all-gathers and \
reduce-scatters with their GEMMs: it needs sp=1 (Megatron's --tp-comm-overlap asserts the same)
    """
    switches = _auto_layout(text)
    return (False, False) if switches is None else (switches.tp_overlap, switches.dp_overlap)


#: the switches ``--parallel auto,...`` takes (the search chooses the rest)
_AUTO_KEYS = ("sp", "lp", "tpo", "dpo", "sequence_parallel", "loss_parallel", "tp_overlap", "dp_overlap")


def _auto_keys(text: str) -> list[str]:
    """The keys given after ``auto,`` in ``text``."""
    rest = text.strip().partition(",")[2]
    return [p.partition("=")[0].strip().lower() for p in rest.split(",") if p.strip()]


def _auto_layout(text: str) -> Layout | None:
    """The switches of ``--parallel auto[,sp=S][,lp=L][,tpo=O][,dpo=Q]`` as a tp=2, dp=2 ZeRO-1 layout; None when
    not ``auto``."""
    head, _, rest = text.strip().partition(",")
    if head.strip().lower() != "auto":
        return None
    keys = _auto_keys(text)
    if any(k not in _AUTO_KEYS for k in keys):
        raise ValueError(f"--parallel {text}: auto takes only sp=, lp=, tpo= and dpo= (the search chooses the rest)")
    if "tpo" in keys or "tp_overlap" in keys:        # tpo=1 applies to the searched layouts with sp=1
        rest += "" if {"sp", "sequence_parallel"} & set(keys) else ",sp=1"
    try:
        return Layout.parse(f"tp=2,dp=2,zero=1,{rest}") if rest.strip() else Layout(tp=2, dp=2, zero=1)
    except ValueError as e:
        raise ValueError(f"--parallel {text}: {str(e).partition(': ')[2]}") from None


def layout_command(args: argparse.Namespace) -> int:
    """``plan --parallel ...`` (the module docstring); 0 when the layout fits, 2 when none does."""
    _check_args(args)
    auto = auto_switches(args.parallel) is not None
    if not auto:
        layout = _layout_arg(args)
        layout.check(args.devices, args.devices_per_node)      # before anything is profiled
    progress = _progress(getattr(args, "quiet", False))
    chain_for, first, sizes = _chains(args, progress)
    job = job_from_args(args, first)
    if auto:
        return _auto(args, job, chain_for, first, sizes, progress)
    e = evaluate(job, layout, chain_for, args.activations or "keep")
    print(f"{first.name}: {job.devices} GPUs, global batch {job.global_batch}")
    print(frontier_table([e], job.devices))
    plan = layout_plan(e, job, chain_for, args)
    _write(args, plan)
    return _verdict(e, job)


def _auto(args: argparse.Namespace, job: Job, chain_for: ChainFor, first: Chain, sizes: tuple,
          progress: Callable[[str], None] | None) -> int:
    from workbench.methods import method as method_of
    from workbench.parallel.profiles import tensor_parallel_available
    from workbench.parallel.search import SCHEDULES, SWITCHES, describe_switches, search

    tps = None if (args.module and args.fake and tensor_parallel_available()) else (1,)
    schedules = (args.method,) if args.method else SCHEDULES
    if args.method:
        method_of(args.method)
    acts = (args.activations,) if args.activations else None
    sp, lp = auto_switches(args.parallel) or (None, None)
    tpo, dpo = auto_overlaps(args.parallel)
    if progress and tps is None:
        progress("searching tp x pp x dp, " + describe_switches({"sequence_parallel": sp or SWITCHES,
                                                                  "loss_parallel": lp or SWITCHES})
                 + " (each its own per-rank profile; auto,sp=0 / auto,lp=0 pin them)")
    result = search(job, chain_for, micro_batch_sizes=sizes, schedules=schedules, chunks=args.chunks, tps=tps,
                    activations=acts, progress=progress, sequence_parallel=sp, loss_parallel=lp,
                    tp_overlap=tpo, dp_overlap=dpo)
    searched = describe_switches(result.switches)
    if tps == (1,):
        searched = "tp 1 only"
        result.notes.append("tp > 1 not searched: it needs --module with --fake and per-rank tensor-parallel "
                            "profiles (workbench.parallel.tensor)")
    print(f"{first.name}: {job.devices} GPUs, global batch {job.global_batch}: {len(result.evaluated)} layouts "
          f"evaluated, {len(result.pruned)} skipped by a bound ({searched}), in {result.seconds:.1f} s")
    for note in result.notes:
        print(f"  note: {note}")
    print(frontier_table(result.evaluated, job.devices, top=15))
    if result.best is None:
        need = result.least_memory()
        raise ValueError(f"no layout of {job.devices} GPUs fits in {format_bytes(job.platform.memory_limit)} per GPU: "
                         f"the least any needs on its fullest rank is {format_bytes(need)}")
    plan = layout_plan(result.best, job, chain_for, args, result)
    print(f"chosen: {result.best.layout.describe()}, activations {result.best.activations}")
    _write(args, plan)
    return 0


def _verdict(e: Evaluation, job: Job) -> int:
    if e.status == "infeasible":
        raise ValueError(f"{e.layout.describe()}: no plan ({e.note})")
    if not e.fits:
        worst = max(range(len(e.memory)), key=lambda d: e.memory[d])
        raise ValueError(f"{e.layout.describe()} does not fit: its fullest ranks (pipeline rank {worst}) need "
                         f"{format_bytes(e.memory[worst])}, more than the {format_bytes(job.platform.memory_limit)} "
                         "of a GPU")
    return 0


def _write(args: argparse.Namespace, plan) -> None:
    if args.json_out and plan is not None:
        plan.to_json(args.json_out)
        print(f"wrote {args.json_out}")


def layout_plan(e: Evaluation, job: Job, chain_for: ChainFor, args: argparse.Namespace | None = None,
                result: Any = None):
    """The plan JSON's plan of an evaluated layout: its pipeline (re-checked, unless extended from fewer
    micro-batches), the layout's keys (docs/model.md, "Layouts"), the frontier of a search."""
    import json

    from workbench.parallel.evaluate import EXACT_FLUSH
    from workbench.planners import platform_links, recheck

    if e.plan is None or not e.plan.feasible:
        return None
    lay = e.layout
    if "extrapolated_from" in e.plan.extra and (lay.micro_batches or 1) * lay.pp * lay.chunks <= EXACT_FLUSH:
        exact = evaluate(job, lay, chain_for, e.activations, extrapolate=False)
        e = exact if exact.plan is not None and exact.plan.feasible else e
    chain = rank_chain(chain_for, lay)
    platform = job.platform.for_layout(lay)
    plan = e.plan if "extrapolated_from" in e.plan.extra else recheck(e.plan, chain, platform)
    parallel = {"parallel": e.layout.to_dict(), "global_batch": job.global_batch,
                "tokens_per_sample": job.tokens_per_sample, "step_seconds": e.step_seconds,
                **({"sequence_length": job.tokens_per_sample} if job.tokens_per_sample > 1 else {}),
                "tokens_per_second": e.tokens_per_second,
                "tokens_per_second_per_gpu": e.tokens_per_second / job.devices,
                "mfu": e.mfu, "mfu_convention": MFU_CONVENTION, "step_breakdown": dict(e.breakdown)}
    if result is not None:
        parallel["frontier"] = [x.to_dict() for x in result.evaluated] + [
            {"parallel": c.layout.to_dict(), "activations": c.activations, "status": "pruned", "why": why,
             "bound_seconds": c.bound_seconds, "bound_memory": c.bound_memory} for c, why in result.pruned]
        parallel["search"] = {"evaluated": len(result.evaluated), "pruned": len(result.pruned),
                              "seconds": result.seconds, "notes": list(result.notes),
                              **{k: list(v) for k, v in result.switches.items()}}
    extra = {**plan.extra, "layer_names": [layer.name for layer in chain.layers]}
    tied = json.loads(chain.meta.get("tied") or "[]")
    if tied:
        extra["tied"] = tied
    module = args.module if args is not None and args.module else None
    if not module and chain.meta.get("module"):       # a profile names its model relative to its own folder
        from workbench.profiles.usermodel import parse_spec, resolve_spec

        path, func = parse_spec(resolve_spec(str(chain.meta["module"]),
                                             Path(str(chain.meta.get("source_file", "."))).parent))
        module = f"{os.path.normpath(path)}:{func}"
    if module:
        extra["module"] = str(module)
    if args is not None and getattr(args, "kernels", "eager") != "eager":
        extra["kernels"] = args.kernels              # plan_rank_chain profiles the model again with them
    setup = {**plan.setup, **platform_links(platform)}
    return plan.with_(parallel=parallel, extra=extra, setup=setup)


def frontier_table(evaluations: list[Evaluation], devices: int, top: int | None = None) -> str:
    """The evaluated layouts, fastest first (those that fit, then the others): layout, policy, step, tokens/s
    per GPU, MFU, the fullest rank's peak, whether it fits."""
    rows = sorted(evaluations, key=lambda e: (not e.fits, e.step_seconds))
    shown = rows if top is None else rows[:top]
    width = max([len("layout")] + [len(e.layout.describe()) for e in shown])      # whole, never cut
    head = f"{'layout':<{width}} {'act':<9} {'step':>9} {'tok/s/GPU':>10} {'MFU':>6} {'peak':>11} {'fits':>5}"
    lines = [head, "-" * len(head)]
    for e in shown:
        step = f"{e.step_seconds:.2f}s" if math.isfinite(e.step_seconds) else "-"
        peak = format_bytes(e.peak) if e.memory else "-"
        lines.append(f"{e.layout.describe():<{width}} {e.activations:<9} {step:>9} "
                     f"{e.tokens_per_second / devices:>10,.0f} {e.mfu:>6.1%} {peak:>11} {e.status:>5}")
    if top is not None and len(rows) > top:
        lines.append(f"... and {len(rows) - top} more (the plan JSON's frontier holds every one)")
    return "\n".join(lines)
