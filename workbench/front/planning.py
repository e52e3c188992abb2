"""``plan``, ``check`` and ``simulate``: a profile and a platform from the command line, a plan made or re-read.

The options are parsed in :mod:`workbench.front.cli`; the model, the validity rules and the plan JSON are in
docs/model.md.

>>> import argparse
>>> from workbench.front.cli import build_parser
>>> args = build_parser().parse_args(["plan", "--profile", "resnet50", "--devices", "2", "--optimizer", "sgd"])
>>> platform_from_args(args).devices, platform_from_args(args).setup.optimizer
(2, 'sgd')
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from workbench.methods import METHODS, method
from workbench.model.training_setup import DEFAULT_BANDWIDTH, TrainingSetup, recorded_link

if TYPE_CHECKING:
    from workbench.model.chain import Chain
    from workbench.model.target import Target

__all__ = ["platform_from_args", "chain_from_args", "chain_for_platform", "plan_command", "check_command",
           "simulate_command"]


def _links(args: argparse.Namespace, recorded: dict) -> dict:
    """The platform's memory and links: each option given, else the ``--gpu``'s (or the plan's GPU), else what
    the plan ``recorded`` (its ``memory_setup``), else the defaults (unlimited memory,
    :data:`~workbench.model.training_setup.DEFAULT_BANDWIDTH`, one node)."""
    from workbench.model.accelerators import DEFAULT_NODE_BANDWIDTH, accelerator
    from workbench.model.chain import DEFAULT_HOST_BANDWIDTH

    name = getattr(args, "gpu", None) or recorded.get("gpu")
    gpu = accelerator(name) if name else None          # an unknown name: one line listing the known ones
    per_node = getattr(args, "devices_per_node", None) or recorded.get("devices_per_node")
    bandwidth = gpu.link_bandwidth if gpu else recorded_link(recorded, "bandwidth", DEFAULT_BANDWIDTH)
    return {"memory": args.memory or (gpu.memory if gpu else "inf"), "bandwidth": args.bandwidth or bandwidth,
            "devices_per_node": per_node, "gpu": gpu.name if gpu else None,
            "node_bandwidth": getattr(args, "node_bandwidth", None) or recorded_link(recorded, "node_bandwidth",
                                                                                     DEFAULT_NODE_BANDWIDTH),
            "host_bandwidth": getattr(args, "host_bandwidth", None) or recorded_link(recorded, "host_bandwidth",
                                                                                     DEFAULT_HOST_BANDWIDTH)}


def platform_from_args(args: argparse.Namespace, plan=None, setup: TrainingSetup | None = None):
    """The platform of the command line: the training ``setup`` (default: :meth:`TrainingSetup.resolve` of the
    options and the plan: the plan's set-up where a plan is given, an option that contradicts it refused, else
    the options', else the full model with Adam and torch's default loop); memory and links to ``--gpu``'s
    (:func:`_links`); ``--devices`` pipeline ranks, each the data-parallel group the plan records (a layout's
    ``dp`` and ``zero``: :meth:`Target.of <workbench.model.target.Target.of>`)."""
    from workbench.model.target import Target
    from workbench.model.training_setup import recorded_data_parallel

    setup = setup or TrainingSetup.resolve(args, plan)
    recorded = dict(getattr(plan, "setup", None) or {})
    dp, zero = recorded_data_parallel(recorded)
    target = Target.of(args.devices, latency=args.latency, **_links(args, recorded), dp=dp, zero=zero)
    return Target(target.platform, setup, target.layout)


def chain_from_args(args: argparse.Namespace):
    from workbench.profiles import load_profile

    opts = {}
    if getattr(args, "no_zero_input", False):
        opts["zero_input"] = False
    return load_profile(args.profile, **opts)


def chain_for_platform(chain: Chain, platform: Target) -> Chain:
    """``chain`` with times for the platform's GPU (a fake profile re-estimated for it; a profile measured on
    another device refused in one line: :func:`workbench.profiles.retime.chain_for_gpu`), its note printed."""
    from workbench.profiles.retime import chain_for_gpu

    chain, note = chain_for_gpu(chain, getattr(platform, "gpu", None))
    if note:
        print(note)
    return chain


def _progress(quiet: bool) -> Callable[[str], None] | None:
    """A progress sink for planners: each line on stderr, with the seconds since the call started."""
    if quiet:
        return None
    import time

    t0 = time.perf_counter()

    def emit(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f} s] {line}", file=sys.stderr, flush=True)

    return emit


def _layout_chain(args: argparse.Namespace, plan) -> Chain:
    """The chain of one rank of a layout plan: ``--profile``'s, refused when it is another ``tp``'s or micro-batch
    size's; without ``--profile`` the plan's model profiled (or read from the cache) as ``plan`` made it; its
    collectives overlapped with their GEMMs when the layout says so (``tp_overlap``), as the plan priced it."""
    from workbench.model.layout import Layout
    from workbench.parallel.profiles import check_rank_chain, plan_rank_chain
    from workbench.parallel.tensor.overlap import overlapped_chain

    layout = Layout.from_dict(plan.parallel["parallel"])
    if args.profile is None:
        chain = plan_rank_chain(plan, layout, progress=_progress(getattr(args, "quiet", False)))
    else:
        chain = chain_from_args(args)
        check_rank_chain(chain, layout, f"--profile {args.profile}")
    return overlapped_chain(chain) if layout.tp_overlap else chain


def _resolve_plan_context(args: argparse.Namespace, plan):
    """For check/simulate: the profile (a layout plan's: its rank's, :func:`_layout_chain`) and devices default to
    nothing; devices can come from the plan; the set-up is the plan's (checked against the profile's dtype, as
    ``plan`` checks it)."""
    from workbench.model.memory import validate_setup

    layout = plan.parallel.get("parallel", {})
    if args.profile is None and not layout:
        raise ValueError("--profile is required to check or simulate a plan (the chain the plan was made for)")
    if args.devices is None or (layout and args.devices == layout["tp"] * layout["pp"] * layout["dp"]):
        args.devices = plan.devices         # a layout's plan is one replica's pipeline of pp ranks
    chain, platform = _layout_chain(args, plan) if layout else chain_from_args(args), platform_from_args(args, plan)
    chain = chain_for_platform(chain, platform)
    validate_setup(platform, chain)
    return chain, platform


def plan_command(args: argparse.Namespace) -> int:
    from workbench.model.plan import chain_for_plan
    from workbench.planners import GENERAL_METHODS
    from workbench.planners import plan as run_planner

    if not args.profile:
        raise ValueError("plan: give --profile FILE (a pipeline) or --module FILE.py:FUNC --parallel ... (a layout)")
    if getattr(args, "global_batch", None) or getattr(args, "fake", False):
        raise ValueError("--global-batch and --fake go with --parallel (a layout of tensor x pipeline x data "
                         "parallelism)")
    args.method = args.method or "dp"
    args.activations = args.activations or "keep"
    chosen = method(args.method)  # an unknown method is refused before the profile is read
    if args.allocation not in chosen.allocations:
        raise ValueError(f"--allocation {args.allocation}: method {args.method!r} plans contiguous allocations only; "
                         f"use one of {', '.join(sorted(GENERAL_METHODS))}")
    if args.micro_batches is not None and chosen.family != "flushed":    # refused, not silently ignored
        raise ValueError(f"--micro-batches: method {args.method!r} plans a periodic schedule (a mini-batch enters "
                         f"every period, no flush); --micro-batches is for the flushed methods "
                         f"{', '.join(m.name for m in METHODS if m.family == 'flushed')}")
    chain = chain_from_args(args)
    platform = platform_from_args(args)
    chain = chain_for_platform(chain, platform)
    opts = {}
    if args.micro_batches is not None:
        opts["micro_batches"] = args.micro_batches
    if getattr(args, "chunks", None) is not None:
        if not chosen.torch_class:
            raise ValueError(f"--chunks: method {args.method!r} puts one stage on each device; --chunks is for "
                             f"{', '.join(m.name for m in METHODS if m.torch_class)}")
        opts["chunks"] = args.chunks
    result = run_planner(chain, platform, args.method, allocation=args.allocation, time_limit=args.time_limit,
                         progress=_progress(getattr(args, "quiet", False)), activations=args.activations, **opts)
    import json

    # `run` checks a plan against the model by these names before it starts anything
    names = list(result.chain_order) if result.chain_order else [l.name for l in chain.layers]
    tied = json.loads(chain.meta.get("tied") or "[]")      # shared parameters (docs/model.md, Tied parameters)
    result = result.with_(extra={**result.extra, "layer_names": names, **({"tied": tied} if tied else {})})
    from workbench.model.explain import IDLE, MEMORY, explain

    result = explain(result, chain_for_plan(result, chain), platform)   # idle devices, a period memory sets
    print(f"{chain.name}: {len(chain)} layers on {platform.devices} devices")
    print(result.summary())
    for note in result.notes:
        if note.startswith((IDLE, MEMORY)):
            print(f"  {note}")
    for t in result.extra.get("tied", []):
        print(f"  tied: {t['parameter']} shared by {', '.join(t['layers'])}; counted at {t['owner']}, and a stage "
              "holding a sharer without it holds a copy")
    if result.feasible and not result.fits:
        over = result.peak_memory - result.memory_limit
        from workbench.model.units import format_bytes

        print(f"  does NOT fit: peak memory exceeds the limit by {format_bytes(over)}")
    if result.extra.get("violations"):
        print(f"  INVALID: the checker rejects this plan ({len(result.extra['violations'])} violation(s)); "
              f"first: {result.extra['violations'][0]}")
    if args.json_out:
        result.to_json(args.json_out)
        print(f"wrote {args.json_out}")
    if not (result.feasible and result.fits):
        return 2
    return 1 if result.extra.get("violations") else 0       # as check: a plan that breaks a rule exits 1


def check_command(args: argparse.Namespace) -> int:
    from workbench.model.plan import Plan
    from workbench.verify.check import check

    plan = Plan.from_json(Path(args.plan_file))
    chain, platform = _resolve_plan_context(args, plan)
    violations = check(plan, chain, platform)
    if not violations:
        print(f"{args.plan_file}: valid ({len(plan.stages)} stages, period {plan.period:.6g} s)")
        return 0
    from workbench.verify.check import format_violations

    print(f"{args.plan_file}: INVALID")
    print(format_violations(violations, platform.devices))
    return 1


def simulate_command(args: argparse.Namespace) -> int:
    from workbench.model.plan import Plan
    from workbench.model.units import format_bytes, format_seconds
    from workbench.schedules.simulate import simulate

    plan = Plan.from_json(Path(args.plan_file))
    chain, platform = _resolve_plan_context(args, plan)
    trace = simulate(plan, chain, platform, batches=args.batches)
    trace.save(args.out)
    print(f"simulated {args.batches} mini-batches: makespan {format_seconds(trace.makespan)}, "
          f"steady period {format_seconds(trace.steady_period())} (plan: {format_seconds(plan.period)})")
    print("peak memory per device: " + ", ".join(f"GPU{d}: {format_bytes(m)}"
                                                 for d, m in enumerate(trace.peak_memory())))
    print(f"wrote {args.out}")
    return 0
