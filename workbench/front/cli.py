"""``python -m workbench``: the command line; the model, the validity rules and the plan JSON are in docs/model.md.

Sub-commands: ``profile-info``, ``profile``, ``plan``, ``check``,
``simulate``, ``run``, ``export``, ``reproduce``, ``largest``, ``demo``. Each handler lives in a module
of :mod:`workbench.front` imported when its command runs, so ``--help`` stays fast. Bad input (an option out of range, a
file that is not a profile or a plan, an output path that is a folder or in a
missing folder) gets one line ``error: ...`` on stderr and exit status 2, before
any planning runs; ``check`` exits 1 for a plan that breaks a rule. Long
planning prints a line per phase on stderr (``--quiet``: none).

>>> build_parser().parse_args(["plan", "--profile", "x.csv", "--devices", "4", "--memory", "16GiB"]).devices
4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.front import is_out_of_memory
from workbench.front.option_types import (
    checked_by,
    finite_bandwidth,
    gpu_name,
    int_in,
    named,
    non_negative,
    positive_seconds,
)
from workbench.methods import METHODS, names
from workbench.model.training_setup import DEFAULT_BANDWIDTH

__all__ = ["main", "build_parser", "int_in", "positive_seconds", "check_outputs"]


def _add_platform_args(p: argparse.ArgumentParser, *, required: bool = True, profile: bool | None = None) -> None:
    from workbench.model.plan import MAX_DEVICES

    p.add_argument("--profile", type=named("profile name"), required=required if profile is None else profile,
                   help="profile: a CSV file, a PipeDream graph.txt, or a known name")
    p.add_argument("--devices", "-P", type=int_in(1, MAX_DEVICES), required=required,
                   help="number of devices (GPUs)" + ("" if required else "; default: the plan's"))
    from workbench.model.units import parse_size

    p.add_argument("--gpu", type=gpu_name, default=None, metavar="NAME",
                   help="the accelerator (profile --list-gpus): its memory is the default --memory, its link "
                        "within a node the default --bandwidth")
    p.add_argument("--memory", type=checked_by(parse_size), default=None,
                   help="memory per device: bytes or 16GiB, 12GB, ... (default: the --gpu's, else unlimited)")
    p.add_argument("--bandwidth", type=checked_by(finite_bandwidth), default=None,
                   help="link bandwidth between two devices of a node, one way, e.g. 12GB/s, 16GiB/s, or bytes/s "
                        f"(default: the --gpu's, else the plan's, else {DEFAULT_BANDWIDTH})")
    p.add_argument("--devices-per-node", type=int_in(1), default=None, metavar="N",
                   help="devices per node: a stage boundary between two nodes pays --node-bandwidth "
                        "(default: one node)")
    p.add_argument("--node-bandwidth", type=checked_by(finite_bandwidth), default=None,
                   help="bandwidth between two nodes, one way (default 50GB/s: one 400 Gb/s InfiniBand port per "
                        "GPU)")
    p.add_argument("--latency", type=non_negative, default=0.0, help="link latency in seconds (default 0)")
    p.add_argument("--weights", choices=["stash", "single"], default=None,
                   help="weight versions: stash (PipeDream, the default) or single" + ("" if required else
                                                                                     "; default: the plan's"))
    p.add_argument("--zero-grad", choices=["none", "zeros"], default=None, dest="zero_grad",
                   help="the training loop (docs/model.md, 'Memory'): none (torch's default zero_grad(): gradients "
                        "set to None between steps; the default) or zeros (zeroed in place, resident)"
                        + ("" if required else "; default: the plan's"))
    p.add_argument("--memory-model", choices=["full", "paper"], default=None,
                   help="what a device holds (docs/model.md, 'Memory'): full (default: parameters, gradients, "
                        "optimizer state, activations, transients) or paper (rule 7 of the paper: k A + phi W + "
                        "stashed versions)")
    p.add_argument("--optimizer", default=None,
                   help="full model: none, sgd, momentum, adam (default) or adamw; run steps it with learning rate 0 "
                        "(default: the plan's)")
    p.add_argument("--precision", default=None,
                   help="full model: fp32, bf16-mixed (bf16 compute, fp32 master copies and optimizer state) or bf16; "
                        "default: the profile's dtype")
    p.add_argument("--weight-factor", type=non_negative, default=None,
                   help="paper model only: memory bytes per weight byte of the live version (default 1)")
    p.add_argument("--no-zero-input", action="store_true",
                   help="PipeDream graphs: keep the Input nodes' data-loading time")
    p.add_argument("--host-bandwidth", type=checked_by(finite_bandwidth), default=None,
                   help="each device's link to host memory, for offloaded activations (default: the plan's, else "
                        "31.5GB/s: PCIe 4.0 x16)")


def _add_module_arg(group) -> None:
    group.add_argument("--module", metavar="FILE.py:FUNC",
                       help="your own model: FUNC() returns (model, example_inputs, example_targets, loss_fn); "
                            "the layers are found for you")


#: ``--kernels`` (workbench.profiles.fused.KERNELS: not imported here, it imports torch)
_KERNELS_HELP = ("with --fake: eager (default; the operations Hugging Face's eager model dispatches) or fused (norms, "
                 "MLP activation, rotary embedding and cross-entropy one kernel each, attention at cuDNN's fused "
                 "rate, as Transformer Engine / Megatron-Core run them: docs/model.md, \"Fused kernels\")")
MAX_BATCHES = 100_000  # simulate --batches: the trace holds 2 S rows per mini-batch
#: largest --devices: each size tried is planned on every device count (dp's work grows with L^2 P, L up to 4096)
LARGEST_MAX_DEVICES = 64


def _finite_size(text: str) -> str:
    """An argparse type: a memory size above 0 and finite (``largest --memory``; the text is kept).

    >>> _finite_size("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 0 is not a memory size above 0 and finite (e.g. 2GiB)
    """
    import math

    from workbench.model.units import parse_size

    try:
        value = parse_size(text, what="value")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a memory size above 0 and finite (e.g. 2GiB)")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command; each sets ``handler``, one of the functions below."""
    ap = argparse.ArgumentParser(prog="python -m workbench", description=__doc__.split("\n\n")[0].strip("`"),
                                 epilog="The model and the validity rules: docs/model.md. "
                                        "Exit status: 0 done, 1 a plan breaks a rule, 2 bad input or no plan.")
    sub = ap.add_subparsers(dest="command", required=True)

    _profile_parsers(sub)
    _plan_parser(sub)
    _check_and_simulate_parsers(sub)
    _run_parser(sub)
    _export_parser(sub)
    _study_parsers(sub)
    return ap


def _profile_parsers(sub: argparse._SubParsersAction) -> None:
    """``profile-info`` and ``profile``."""
    p = sub.add_parser("profile-info", help="summarise a profile (and how a graph was linearised)")
    p.add_argument("file", help="a CSV profile, a PipeDream graph.txt (or its folder), or a known profile name")
    p.add_argument("--no-zero-input", action="store_true", help="keep the Input nodes' data-loading time")
    p.set_defaults(handler=_profile_info)

    p = sub.add_parser("profile", help="profile a zoo model or your own (--module) with the built-in profiler")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="zoo model name (resnet50, resnet101, vgg16, gpt, ...)")
    _add_module_arg(src)
    p.add_argument("--split-at", metavar="NAME,NAME,...", dest="split_at",
                   help="with --module: cut the model before these modules (names as model.named_modules() gives "
                        "them, as torch's pipeline(split_spec=...) takes them) instead of finding the layers")
    p.add_argument("--batch-size", type=int_in(1), default=8, help="mini-batch size (default 8)")
    p.add_argument("--device", default="cpu", help="torch device to profile on: cpu (default), cuda, cuda:1, ...")
    p.add_argument("--repeats", type=int_in(1), default=5, help="timed runs per layer; the median is kept (default 5)")
    p.add_argument("--warmup", type=int_in(0), default=2, help="untimed runs before (default 2)")
    p.add_argument("--out", help="output CSV file (required to profile)")
    p.add_argument("--fake", action="store_true",
                   help="fake tensors: nothing is allocated (any model size profiles here); memory columns measured "
                        "as in a real profile, times estimated for --gpu")
    p.add_argument("--gpu", type=gpu_name, default=None, metavar="NAME",
                   help="with --fake: the GPU whose times are estimated")
    p.add_argument("--tp", type=int_in(1), default=1, metavar="T",
                   help="with --fake --module: tensor parallelism over T GPUs of a node (Megatron's split with "
                        "torch's parallelize_module); the profile is one rank's, measured (default 1)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: the norms on 1/T of the sequence (Megatron's sequence parallelism)")
    p.add_argument("--loss-parallel", action="store_true",
                   help="with --tp: the logits kept split over the vocabulary for the loss (torch's loss_parallel)")
    p.add_argument("--kernels", choices=("eager", "fused"), default="eager",
                   help=_KERNELS_HELP)
    p.add_argument("--list-gpus", action="store_true", help="list the GPUs --gpu knows, with their numbers, and exit")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="zoo model option, e.g. image_size=96 or layers=12 (repeatable)")
    p.add_argument("--threads", type=int_in(1), default=1, help="CPU threads while profiling (default 1)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="CPU clock of the layer times: wall (time.perf_counter, default) or cpu (the thread's CPU "
                        "time: a core of its own, whatever else runs; needs --threads 1)")
    p.add_argument("--dtype", default="float32",
                   help="precision of the model and its floating inputs: float32 (default) or bfloat16 (pure bf16)")
    p.set_defaults(handler=_profile)


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    """``plan``: the methods and what they accept come from the registry (:mod:`workbench.methods`)."""
    p = sub.add_parser("plan", help="plan a pipeline under a memory limit, or a layout of tensor x pipeline x data "
                                    "parallelism (--parallel)")
    _add_platform_args(p, profile=False)
    p.add_argument("--method", default=None, help="planner: " + ", ".join(m.name for m in METHODS)
                   + " (default dp; with --parallel: the schedule, default 1f1b, or every one with auto)")
    p.add_argument("--activations", default=None, choices=["keep", "recompute", "offload", "auto"],
                   help="activation policy of every layer (docs/model.md, 'Activation policies'); auto: chosen per "
                        f"layer ({', '.join(names(auto_activations=True))}; other periodic methods: for their own "
                        "partition)")
    p.add_argument("--allocation", choices=["contiguous", "general"], default="contiguous",
                   help="contiguous: one stage per device (default); general: a device may hold several stages "
                        f"({' and '.join(m.name for m in METHODS if 'general' in m.allocations)} only)")
    p.add_argument("--time-limit", type=positive_seconds, default=None,
                   help="seconds for the whole call of every method (ilp, brute, dp with --activations auto: "
                        "the best plan and gap found by then; about 10%% + 2 s later at most, the import of "
                        "torch that torch's schedules need counted)")
    from workbench.model.plan import MAX_MICRO_BATCHES

    p.add_argument("--micro-batches", type=int_in(1, MAX_MICRO_BATCHES), default=None,
                   help=f"flushed schedules: micro-batches per flush (1..{MAX_MICRO_BATCHES}; torch's schedules: "
                        "default the fastest of 4P, 2P, P that fits)")
    p.add_argument("--chunks", type=int_in(1), default=None,
                   help="stages per device for "
                        f"{', '.join(m.name for m in METHODS if m.torch_class and not m.fixed_chunks)} "
                        "(default 2; the V schedules always take 2)")
    p.add_argument("--json", dest="json_out", default=None, help="write the plan as JSON to this file")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    _add_layout_args(p)
    p.set_defaults(handler=_plan)


def _add_layout_args(p: argparse.ArgumentParser) -> None:
    """``plan``'s layout options (docs/model.md, "Layouts")."""
    _add_module_arg(p)
    p.add_argument("--fake", action="store_true", help="with --module: profile under fake tensors for --gpu")
    p.add_argument("--kernels", choices=("eager", "fused"), default="eager",
                   help=_KERNELS_HELP)
    p.add_argument("--parallel", default=None, metavar="auto|tp=T,pp=P,dp=D[,zero=Z]",
                   help="a layout of the --devices: auto (search every one: the fastest that fits; auto,sp=1,lp=1: "
                        "its tp > 1 layouts sequence-parallel with a vocabulary-parallel loss) or one to evaluate "
                        "(also mbs=, schedule=, chunks=, sp= sequence parallelism, lp= vocabulary-parallel loss, tpo= "
                        "TP communication overlapped with the GEMMs as Megatron's --tp-comm-overlap, needs sp=1; "
                        "dpo= ZeRO-1 as Megatron's distributed optimizer overlaps it, needs zero=1; auto,dpo=1 for "
                        "the search's)")
    p.add_argument("--global-batch", type=int_in(1), default=None, metavar="G",
                   help="with --parallel: samples per optimizer step (micro-batches = G / (dp x micro-batch size))")
    p.add_argument("--profile-cache", default=None, metavar="DIR",
                   help="with --module: where profiles are cached by content (default build/profiles)")


def _check_and_simulate_parsers(sub: argparse._SubParsersAction) -> None:
    """``check`` and ``simulate``: a plan file against a profile."""
    p = sub.add_parser("check", help="re-check a plan against the validity rules")
    p.add_argument("plan_file", help="a plan JSON file (plan --json)")
    _add_platform_args(p, required=False)
    p.set_defaults(handler=_check)

    p = sub.add_parser("simulate", help="simulate a plan for N mini-batches and write the trace")
    p.add_argument("plan_file", help="a plan JSON file (plan --json)")
    _add_platform_args(p, required=False)
    p.add_argument("--batches", type=int_in(1, MAX_BATCHES), default=20, help="mini-batches to run (default 20)")
    p.add_argument("--out", required=True, help="trace file (.csv or .parquet); memory goes beside it")
    p.set_defaults(handler=_simulate)


def _run_parser(sub: argparse._SubParsersAction) -> None:
    """``run``: a plan on torch.distributed."""
    p = sub.add_parser("run", help="run a plan with torch.distributed and compare with the prediction")
    p.add_argument("plan_file", help="a plan JSON file (plan --json)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="zoo model name (default: the model --profile records)")
    _add_module_arg(src)
    p.add_argument("--engine", choices=["auto", "torch", "pipedream"], default="auto",
                   help="torch.distributed.pipelining, or the PipeDream fallback (auto: torch where it "
                        "expresses the plan; weight stashing needs pipedream)")
    p.add_argument("--steps", type=int_in(1), default=None,
                   help="mini-batches to run (default 20, or more where the plan's steady state needs them); a "
                        "flushed plan of m micro-batches runs them as optimizer steps of m: a multiple of m")
    p.add_argument("--batch-size", type=int_in(1), default=8, help="mini-batch size without --profile (default 8)")
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="gloo (CPU) or nccl (GPU); default by device")
    _add_platform_args(p, required=False)  # --profile: the chain the plan was made on; platform options
    p.add_argument("--out", default="build/run", help="folder for the measured trace and summary")
    p.add_argument("--dtype", default=None,
                   help="precision without --profile (float32 or bfloat16); with one, the profile's (default)")
    p.add_argument("--max-ranks", type=int_in(1), default=None, dest="max_ranks",
                   help="a layout plan (tp or dp above 1): the most ranks this machine starts (default 16)")
    p.add_argument("--replay", action="store_true",
                   help="replay each device alone instead (one GPU or core at a time): its compute time and, "
                        "on a GPU, the allocator's peak against the prediction; writes replay.csv")
    p.set_defaults(handler=_run)


def _export_parser(sub: argparse._SubParsersAction) -> None:
    """``export``: a plan with a layout as torchtitan's settings or Megatron-LM's flags."""
    p = sub.add_parser("export", help="a plan (plan --parallel) as torchtitan's settings or Megatron-LM's flags")
    p.add_argument("plan_file", help="a plan JSON file with a \"parallel\" layout (plan --parallel ... --json)")
    p.add_argument("--to", required=True, choices=["torchtitan", "megatron"],
                   help="torchtitan: a TOML file for torchtitan 0.2 (--job.config_file), torchtitan 0.3's command "
                        "line in a comment; megatron: Megatron-LM's command-line flags")
    p.add_argument("--seq-len", type=int_in(1), default=None, help="sequence length (default: the plan's)")
    p.add_argument("--out", default=None, help="write here (default: standard output)")
    p.set_defaults(handler=_export)


def _study_parsers(sub: argparse._SubParsersAction) -> None:
    """``reproduce``, ``largest`` and ``demo``."""
    p = sub.add_parser("reproduce", help="recompute every figure of the experiments")
    p.add_argument("--quick", action="store_true", help="small settings: a few minutes")
    p.add_argument("--only", default=None, help="comma-separated figure names to recompute (default: all); "
                   "the report still shows the others from their cached results")
    p.add_argument("--out", default=None,
                   help="results folder (default data/results; with --quick build/reproduce-quick)")
    p.add_argument("--executor", choices=["serial", "processes", "dask"], default=None,
                   help="where the units run: here one after the other (default; $WORKBENCH_JOBS > 1: processes), "
                        "in local processes, or as tasks on Dask's distributed scheduler")
    p.add_argument("--workers", type=int_in(1, 1024), default=None, metavar="N",
                   help="processes, or the workers of a local Dask cluster (default: the cores, at most 4)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="with --executor dask: a running scheduler (tcp://HOST:8786) instead of a local cluster")
    p.set_defaults(handler=_reproduce)

    p = sub.add_parser("largest", help="the largest GPT (grown by depth and by width) each method fits")
    p.add_argument("--family", action="append", choices=["depth", "width"], help="family (repeatable; default both)")
    p.add_argument("--devices", type=int_in(1, LARGEST_MAX_DEVICES), action="append",
                   help=f"device count, 1..{LARGEST_MAX_DEVICES} (repeatable; default 2, 4, 8)")
    p.add_argument("--memory", type=_finite_size, default="2GiB",
                   help="memory per device, more than 0 and finite (default 2GiB)")
    p.add_argument("--time-limit", type=positive_seconds, default=10.0,
                   help="per general-ILP solve, seconds (default 10)")
    p.add_argument("--quick", action="store_true", help="P = 2 and 4, no ILP")
    p.add_argument("--zero-grad", choices=["none", "zeros"], default="none", dest="zero_grad",
                   help="the training loop: none (torch's default, gradients set to None) or zeros (default none)")
    p.add_argument("--out", default=None, help="write the table here (CSV)")
    p.set_defaults(handler=_largest)

    p = sub.add_parser("demo", help="headless demo: summarise profiles, plan, report and Gantt HTML")
    p.add_argument("--out", default="build/demo", help="output folder (default build/demo)")
    p.set_defaults(handler=_demo)

# The handlers: each imports its command's module when the command runs, so that ``--help`` stays quick.
def _profile_info(args: argparse.Namespace) -> int:
    from workbench.front.profiling import profile_info_command
    return profile_info_command(args)


def _profile(args: argparse.Namespace) -> int:
    from workbench.front.profiling import profile_command
    return profile_command(args)


def _plan(args: argparse.Namespace) -> int:
    if getattr(args, "parallel", None) or getattr(args, "module", None):
        from workbench.front.layouts import layout_command  # a layout (docs/model.md, "Layouts")
        return layout_command(args)
    from workbench.front.planning import plan_command
    return plan_command(args)


def _check(args: argparse.Namespace) -> int:
    from workbench.front.planning import check_command
    return check_command(args)


def _simulate(args: argparse.Namespace) -> int:
    from workbench.front.planning import simulate_command
    return simulate_command(args)


def _run(args: argparse.Namespace) -> int:
    from workbench.front.running import run_command
    return run_command(args)


def _export(args: argparse.Namespace) -> int:
    from workbench.front.exporting import export_command
    return export_command(args)


def _reproduce(args: argparse.Namespace) -> int:
    from workbench.front.studies import reproduce_command
    return reproduce_command(args)


def _largest(args: argparse.Namespace) -> int:
    from workbench.front.studies import largest_command
    return largest_command(args)


def _demo(args: argparse.Namespace) -> int:
    from workbench.front.demo import demo_command
    return demo_command(args)


# sub-command -> (attribute, option, "file" or "folder") of the paths it writes
OUTPUTS: dict[str, list[tuple[str, str, str]]] = {
    "plan": [("json_out", "--json", "file")],
    "simulate": [("out", "--out", "file")],
    "profile": [("out", "--out", "file")],
    "run": [("out", "--out", "folder")],
    "export": [("out", "--out", "file")],
    "reproduce": [("out", "--out", "folder")],
    "demo": [("out", "--out", "folder")],
}


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse (ValueError) an output file that is a folder or lies in a missing folder, an output folder
    that is a file, and an output on a read-only or full disk: before any work is done.

    >>> import tempfile
    >>> check_outputs(argparse.Namespace(command="plan", json_out=tempfile.gettempdir()))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: --json ...: is a folder; give a file name
    """
    for attr, option, kind in OUTPUTS.get(args.command, []):
        value = getattr(args, attr, None)
        if value is None:
            continue
        if not str(value).strip():
            raise ValueError(f"{option}: an empty {'file' if kind == 'file' else 'folder'} name")
        path = Path(value)
        if kind == "file":
            if path.is_dir():
                raise ValueError(f"{option} {value}: is a folder; give a file name")
            if not path.parent.is_dir():
                raise ValueError(f"{option} {value}: the folder {path.parent} does not exist")
        elif path.exists() and not path.is_dir():
            raise ValueError(f"{option} {value}: is a file; give a folder")
        from workbench.io import check_writable

        try:       # a read-only or full disk: said now, of the user's path, not after the work
            check_writable(path, folder=kind == "folder")
        except OSError as e:
            raise ValueError(f"{option} {e}") from None


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    print(f"warning: {message}", file=sys.stderr)


def _memory_cap() -> str:
    """The process's address-space cap in words (``ulimit -v``), or that there is none."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return "no address-space cap set" if soft == resource.RLIM_INFINITY else f"cap {soft / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; bad input prints ``error: ...`` on stderr and returns 2 (3: out of memory, also
    when a memory cap refuses the parser's own imports)."""
    try:
        return _main(argv)
    except (MemoryError, ImportError, OSError) as e:   # a memory cap refused an import (numpy's: ImportError)
        if not is_out_of_memory(e):
            raise
        print(f"error: out of memory: this process may not use enough memory to start ({_memory_cap()}); nothing "
              "was written. Raise the cap", file=sys.stderr)
        return 3


def _main(argv: list[str] | None) -> int:
    import warnings

    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning  # one line per warning, no source location
        try:
            check_outputs(args)
            return int(args.handler(args) or 0)
        except BrokenPipeError:   # the reader went away (| head): nothing to say, and no traceback at exit
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except (ValueError, OSError) as e:  # ProfileError, PlanStructureError, bad JSON, unreadable files
            if is_out_of_memory(e):
                return _out_of_memory(args.command)
            print(f"error: {e}", file=sys.stderr)
            return 2
        except (MemoryError, ImportError) as e:   # a memory cap (ulimit -v, a container's) refused an allocation
            if not is_out_of_memory(e):
                raise
            return _out_of_memory(args.command)


def _out_of_memory(command: str) -> int:
    print(f"error: out of memory: {command} needed more memory than this process may use ({_memory_cap()}); "
          "nothing was written. Raise the cap, or plan fewer layers or devices", file=sys.stderr)
    return 3
