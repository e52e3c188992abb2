"""``python -m workbench``: the command line (DESIGN.md section 4).

Sub-commands: ``profile-info``, ``profile``, ``plan``, ``check``,
``simulate``, ``run``, ``reproduce``, ``largest``, ``demo``. Each handler imports what it
needs lazily so ``--help`` stays fast.

>>> build_parser().parse_args(["plan", "--profile", "x.csv", "--devices", "4", "--memory", "16GiB"]).devices
4
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Callable

__all__ = ["main", "build_parser", "platform_from_args"]


def _add_platform_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--profile", required=required, help="profile: a CSV file, a PipeDream graph.txt, or a known name")
    p.add_argument("--devices", "-P", type=int, required=required, help="number of devices (GPUs)")
    p.add_argument("--memory", default="inf", help="memory per device: bytes or 16GiB, 12GB, ... (default: unlimited)")
    p.add_argument("--bandwidth", default="12GB/s", help="link bandwidth, e.g. 12GB/s (default), 16GiB/s, or bytes/s")
    p.add_argument("--latency", type=float, default=0.0, help="link latency in seconds (default 0)")
    p.add_argument("--weights", choices=["stash", "single"], default="stash", help="weight versions: stash (PipeDream) or single")
    p.add_argument("--memory-model", choices=["full", "paper"], default=None,
                   help="what a device holds (docs/model.md, 'Memory'): full (default: parameters, gradients, optimizer "
                        "state, activations, transients) or paper (rule 7 of the paper: k A + phi W + stashed versions)")
    p.add_argument("--optimizer", default=None, help="full model: none, sgd, momentum, adam (default) or adamw")
    p.add_argument("--precision", default=None,
                   help="full model: fp32, bf16-mixed (bf16 compute, fp32 master copies and optimizer state) or bf16; "
                        "default: the profile's dtype")
    p.add_argument("--weight-factor", type=float, default=None,
                   help="paper model only: memory bytes per weight byte of the live version (default 1)")
    p.add_argument("--no-zero-input", action="store_true", help="PipeDream graphs: keep the Input nodes' data-loading time")
    p.add_argument("--host-bandwidth", default=None,
                   help="each device's link to host memory, for offloaded activations (default: the plan's, else "
                        "31.5GB/s: PCIe 4.0 x16)")


def platform_from_args(args: argparse.Namespace, plan=None):
    """The platform of the command line; the memory set-up options default to the plan's (when a plan is
    given and recorded one), else to the full model with Adam."""
    from .chain import Platform

    setup = dict(getattr(plan, "setup", None) or {})
    model = args.memory_model or setup.get("memory_model", "full")
    if args.weight_factor is not None and model != "paper":
        raise ValueError("--weight-factor belongs to the paper's memory model: add --memory-model paper (the full "
                         "model counts gradients and optimizer state from --optimizer and --precision)")
    if model == "paper" and (args.optimizer or args.precision):
        raise ValueError("--optimizer and --precision belong to the full memory model, not --memory-model paper")
    extra = ({"weight_factor": args.weight_factor if args.weight_factor is not None else setup.get("weight_factor", 1.0)}
             if model == "paper" else
             {"optimizer": args.optimizer or setup.get("optimizer", "adam"),
              "precision": args.precision or (setup.get("precision") if setup.get("memory_model") == "full" else None)})
    return Platform(args.devices, memory=args.memory, bandwidth=args.bandwidth, latency=args.latency,
                    weights=args.weights, memory_model=model,
                    host_bandwidth=getattr(args, "host_bandwidth", None) or setup.get("host_bandwidth", "31.5GB/s"),
                    **extra)


def chain_from_args(args: argparse.Namespace):
    from .profiles import load_profile

    opts = {}
    if getattr(args, "no_zero_input", False):
        opts["zero_input"] = False
    return load_profile(args.profile, **opts)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile-info", help="summarise a profile (and how a graph was linearised)")
    p.add_argument("file")
    p.add_argument("--no-zero-input", action="store_true", help="keep the Input nodes' data-loading time")
    p.set_defaults(handler="workbench.profiles.commands:profile_info_command")

    p = sub.add_parser("profile", help="profile a zoo model with the built-in profiler")
    p.add_argument("--model", required=True, help="zoo model name (resnet50, resnet101, vgg16, gpt, ...)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", required=True, help="output CSV")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="zoo model option, e.g. image_size=96 or layers=12 (repeatable)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads while profiling (default 1)")
    p.add_argument("--dtype", default="float32",
                   help="precision of the model and its floating inputs: float32 (default) or bfloat16 (pure bf16)")
    p.set_defaults(handler="workbench.profiles.profiler:profile_command")

    p = sub.add_parser("plan", help="plan a pipeline under a memory limit")
    _add_platform_args(p)
    p.add_argument("--method", default="dp",
                   help="planner: dp, ilp, pipedream, mcap, uniform, parameters, torchgpipe, gpipe, 1f1b, brute")
    p.add_argument("--activations", default="keep", choices=["keep", "recompute", "offload", "auto"],
                   help="activation policy of every layer (docs/model.md, 'Activation policies'); auto: chosen per "
                        "layer (dp, ilp, brute; other periodic methods: for their own partition)")
    p.add_argument("--allocation", choices=["contiguous", "general"], default="contiguous")
    p.add_argument("--time-limit", type=float, default=None, help="solver time limit in seconds (ILP)")
    p.add_argument("--micro-batches", type=int, default=None, help="flushed schedules: micro-batches per flush")
    p.add_argument("--json", dest="json_out", default=None, help="write the plan as JSON here")
    p.set_defaults(handler="workbench.cli:plan_command")

    p = sub.add_parser("check", help="re-check a plan against the validity rules")
    p.add_argument("plan_file")
    _add_platform_args(p, required=False)
    p.set_defaults(handler="workbench.cli:check_command")

    p = sub.add_parser("simulate", help="simulate a plan for N mini-batches and write the trace")
    p.add_argument("plan_file")
    _add_platform_args(p, required=False)
    p.add_argument("--batches", type=int, default=20, help="mini-batches to run (default 20)")
    p.add_argument("--out", required=True, help="trace file (.csv or .parquet); memory goes beside it")
    p.set_defaults(handler="workbench.cli:simulate_command")

    p = sub.add_parser("run", help="run a plan with torch.distributed and compare with the prediction")
    p.add_argument("plan_file")
    p.add_argument("--model", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--backend", default=None, help="gloo (CPU) or nccl (GPU); default by device")
    _add_platform_args(p, required=False)  # --profile: the chain the plan was made on; platform options
    p.add_argument("--out", default="build/run", help="folder for the measured trace and summary")
    p.add_argument("--dtype", default=None,
                   help="precision without --profile (float32 or bfloat16); with one, the profile's (default)")
    p.add_argument("--replay", action="store_true",
                   help="replay each device alone instead (one GPU or core at a time): its compute time and, "
                        "on a GPU, the allocator's peak against the prediction; writes replay.csv")
    p.set_defaults(handler="workbench.runtime.commands:run_command")

    p = sub.add_parser("reproduce", help="recompute every figure of the experiments")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default=None)
    p.add_argument("--out", default=None)
    p.set_defaults(handler="workbench.experiments:reproduce_command")

    p = sub.add_parser("largest", help="the largest GPT (grown by depth and by width) each method fits")
    p.add_argument("--family", action="append", choices=["depth", "width"], help="family (repeatable; default both)")
    p.add_argument("--devices", type=int, action="append", help="device count (repeatable; default 2, 4, 8)")
    p.add_argument("--memory", default="2GiB", help="memory per device (default 2GiB)")
    p.add_argument("--time-limit", type=float, default=10.0, help="per general-ILP solve, seconds (default 10)")
    p.add_argument("--quick", action="store_true", help="P = 2 and 4, no ILP")
    p.add_argument("--out", default=None, help="write the table here (CSV)")
    p.set_defaults(handler="workbench.largest:largest_command")

    p = sub.add_parser("demo", help="headless demo: summarise profiles, plan, report and Gantt HTML")
    p.add_argument("--out", default="build/demo")
    p.set_defaults(handler="workbench.demo:demo_command")
    return ap


def _load_handler(spec: str) -> Callable[[argparse.Namespace], int]:
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def _resolve_plan_context(args: argparse.Namespace, plan):
    """For check/simulate: the profile and devices default to nothing; devices can come from the plan."""
    if args.profile is None:
        raise SystemExit("error: --profile is required to check or simulate a plan")
    if args.devices is None:
        args.devices = plan.devices
    return chain_from_args(args), platform_from_args(args, plan)


def plan_command(args: argparse.Namespace) -> int:
    from .planners import plan as run_planner

    chain = chain_from_args(args)
    platform = platform_from_args(args)
    opts = {}
    if args.micro_batches is not None:
        opts["micro_batches"] = args.micro_batches
    result = run_planner(chain, platform, args.method, allocation=args.allocation, time_limit=args.time_limit,
                         activations=args.activations, **opts)
    print(f"{chain.name}: {len(chain)} layers on {platform.devices} devices")
    print(result.summary())
    if result.feasible and not result.fits:
        over = result.peak_memory - result.memory_limit
        from .units import format_bytes

        print(f"  does NOT fit: peak memory exceeds the limit by {format_bytes(over)}")
    if args.json_out:
        result.to_json(args.json_out)
        print(f"wrote {args.json_out}")
    return 0 if result.feasible and result.fits else 2


def check_command(args: argparse.Namespace) -> int:
    from .check import check
    from .plan import Plan

    plan = Plan.from_json(Path(args.plan_file))
    chain, platform = _resolve_plan_context(args, plan)
    violations = check(plan, chain, platform)
    if not violations:
        print(f"{args.plan_file}: valid ({len(plan.stages)} stages, period {plan.period:.6g} s)")
        return 0
    from .check import format_violations

    print(f"{args.plan_file}: INVALID")
    print(format_violations(violations, platform.devices))
    return 1


def simulate_command(args: argparse.Namespace) -> int:
    from .plan import Plan
    from .simulate import simulate

    plan = Plan.from_json(Path(args.plan_file))
    chain, platform = _resolve_plan_context(args, plan)
    trace = simulate(plan, chain, platform, batches=args.batches)
    trace.save(args.out)
    print(f"simulated {args.batches} mini-batches: makespan {trace.makespan:.6g} s, "
          f"steady period {trace.steady_period():.6g} s (plan: {plan.period:.6g} s)")
    print("peak memory per device: " + ", ".join(f"{m:.4g}" for m in trace.peak_memory()))
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = _load_handler(args.handler)
    try:
        return int(handler(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
