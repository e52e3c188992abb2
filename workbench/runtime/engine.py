"""Run a plan on torch.distributed: one process per device, a measured :class:`~workbench.model.trace.Trace`.

:func:`run_plan` starts ``plan.devices`` processes with
``torch.multiprocessing`` (gloo on CPU, NCCL on GPUs). Each builds the model
from the :class:`~workbench.profiles.workload.Workload`, keeps its stages and
runs its program on one of two engines (:func:`choose_engine`):

* ``"torch"``: ``torch.distributed.pipelining``'s ``PipelineStage`` and schedule
  runtime, the plan lowered to its actions (:mod:`~workbench.runtime.torch_engine`):
  flushed plans (GPipe, 1F1B) and periodic plans with one weight version (``single``);
* ``"pipedream"``: the fallback for what torch cannot express, periodic plans
  with weight stashing and an optimizer step after every backward
  (:mod:`~workbench.runtime.pipedream`).

Both record every operation and the allocator-level memory, and return the
gradients accumulated over the ``steps`` mini-batches. With a learning rate of
zero (the default; the ``optimizer`` still runs its step) every mini-batch
sees the same weights, so :func:`grad_error` against :func:`reference_gradients`
(the whole model in one process) is rounding, below :func:`grad_tolerance`.

Under ``torchrun`` (several nodes work the same way) use the module entry::

    torchrun --nproc-per-node 2 -m workbench.runtime.engine PLAN.json --module my_model.py:build \\
        --steps 8 --out build/run
    torchrun --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29500 --nproc-per-node 4 \\
        -m workbench.runtime.engine PLAN.json --model resnet50 --steps 20 --out build/run

>>> choose_engine(Plan(1.0, (0,), (), 1), "stash"), choose_engine(Plan(1.0, (0,), (), 1), "single")
('pipedream', 'torch')
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from workbench.model.plan import Plan
from workbench.model.trace import MEMORY_COLUMNS, OP_COLUMNS, Trace
from workbench.profiles.workload import Workload
from workbench.runtime.config import RunConfig
from workbench.runtime.gradients import grad_error, grad_tolerance, reference_gradients
from workbench.runtime.rank import CPU_COLUMNS
from workbench.runtime.worker import free_port
from workbench.schedules.ops import Op
from workbench.schedules.program import optimizer_steps, programs_for
from workbench.schedules.registry import schedule_of

__all__ = ["Workload", "RunResult", "run_plan", "reference_gradients", "grad_error", "grad_tolerance",
           "free_port", "default_backend", "join_or_kill", "programs_for", "merge_results", "choose_engine",
           "ENGINES", "refuse_split_backward"]

ENGINES = ("auto", "torch", "pipedream")


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """A measured run: the trace (source "measured"), accumulated gradients by parameter name, notes."""

    trace: Trace
    grads: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_period(self) -> float:
        return self.trace.steady_period()

    def peak_memory(self) -> list[float]:
        return [float(m) for m in self.trace.peak_memory()]


def merge_results(parts: Sequence[dict[str, Any]], plan: Plan, **meta: Any) -> RunResult:
    """The ranks' results as one :class:`RunResult`: the trace, the gradients by parameter name, and in
    ``meta``: ``memory_peak`` and ``memory_breakdown`` (per rank, allocator level), ``cpu``, ``engine``."""
    ops = pd.DataFrame([r for p in parts for r in p["ops"]], columns=OP_COLUMNS)
    ops = ops.sort_values(["start", "device"]).reset_index(drop=True)
    mem = pd.DataFrame([r for p in parts for r in p["memory"]], columns=MEMORY_COLUMNS)
    mem = mem.sort_values(["device", "time"]).reset_index(drop=True)
    grads: dict[str, torch.Tensor] = {}
    for p in parts:
        grads.update(p["grads"])
    cpu = pd.DataFrame([r for p in parts for r in p.get("cpu", [])], columns=CPU_COLUMNS)
    ordered = sorted(parts, key=lambda q: q["rank"])
    info = {
        "cpu": cpu,
        "max_memory_allocated": [p["max_memory_allocated"] for p in ordered],
        "memory_peak": [p["memory_peak"] for p in ordered],
        "memory_breakdown": [p["memory_breakdown"] for p in ordered],
        "engine": ordered[0]["engine"] if ordered else None,
        "optimizer_steps": [p.get("optimizer_steps") for p in ordered],   # per rank, the timed steps it took
        **meta,
    }
    if schedule_of(plan.schedule).flushed and info.get("steps"):   # a flush per optimizer step: period = the
        m = int(plan.micro_batches or info["steps"])               # flushes' spans / micro-batches
        info = {**info, "micro_batches": m, "flushes": max(1, math.ceil(int(info["steps"]) / m))}
    trace = Trace(ops, mem, plan.devices, period=plan.period, source="measured", meta=info)
    return RunResult(trace, grads, info)


def choose_engine(plan: Plan, weights: str, engine: str = "auto") -> str:
    """``"torch"`` where torch's engine expresses the plan (flushed schedules; periodic plans with one
    weight version), ``"pipedream"`` for periodic plans with weight stashing; ``engine`` forces one."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    return schedule_of(plan.schedule).engine(weights)


# ---------------------------------------------------------------------------------------------
# launching
# ---------------------------------------------------------------------------------------------
def default_backend(device: str, world: int) -> str:
    """gloo on CPU; NCCL when every rank has a GPU of its own; else gloo (messages staged through the host).

    >>> default_backend("cpu", 4)
    'gloo'
    """
    if device != "cuda":
        return "gloo"
    return "nccl" if torch.cuda.device_count() >= world else "gloo"


def join_or_kill(ctx: Any, seconds: float, what: str) -> None:
    """Wait for the processes of ``ctx`` (``torch.multiprocessing.start_processes(join=False)``).

    A child's error is re-raised; after ``seconds`` a ``TimeoutError`` names ``what``; no child outlives this.
    """
    deadline = time.monotonic() + seconds
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not finish within {seconds:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)


def run_plan(
    plan: Plan,
    workload: Workload,
    steps: int = 8,
    *,
    lr: float = 0.0,
    weights: str = "stash",
    backend: str | None = None,
    device: str | None = None,
    threads: int = 1,
    timeout: float = 120.0,
    lookahead: int = 1,
    programs: list[list[Op]] | None = None,
    chain=None,
    platform=None,
    start_method: str | None = None,
    engine: str = "auto",
    optimizer: str = "adam",
    zero_grad: str = "none",
) -> RunResult:
    """Execute ``plan`` for ``steps`` mini-batches in ``plan.devices`` processes and measure it.

    ``device`` is "cpu" (default when no GPU) or "cuda" (one GPU per rank, or
    ranks sharing GPUs round-robin); ``backend`` defaults to gloo on CPU and
    NCCL on GPUs, or gloo with host-staged messages when there are fewer GPUs
    than ranks (NCCL refuses two ranks on one GPU; see :func:`default_backend`). ``timeout`` bounds every
    collective and the whole run: a hung run raises ``TimeoutError`` instead of hanging. ``start_method``
    "fork" starts faster (no re-import of torch) and is the default on CPU
    under Linux; "spawn" (the default otherwise) is the safe choice with CUDA.
    ``engine`` is ``"auto"`` (:func:`choose_engine`), ``"torch"`` or ``"pipedream"``;
    ``optimizer`` one of :data:`~workbench.runtime.rank.OPTIMIZERS`, stepping with ``lr``; ``zero_grad`` the
    training loop (``none``: torch's default, gradients set to None between steps; ``zeros``: in place).
    """
    _check_run_arguments(plan, weights, optimizer, steps)
    if zero_grad not in ("none", "zeros"):
        raise ValueError(f"zero_grad must be 'none' or 'zeros', got {zero_grad!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = backend or default_backend(device, plan.devices)
    progs = programs if programs is not None else programs_for(plan, steps)
    cfg = RunConfig(plan, progs, workload, steps, lr, weights, backend, device, threads, timeout, lookahead,
                    engine=_engine_for(plan, weights, engine, device, backend), optimizer=optimizer,
                    zero_grad=zero_grad)
    if start_method is None:
        start_method = "fork" if (device == "cpu" and sys.platform.startswith("linux")) else "spawn"
    t_start = time.monotonic()
    parts = _start_ranks(cfg, start_method)
    return merge_results(parts, plan, steps=steps, lr=lr, weights=weights, backend=backend, device=device,
                         world=plan.devices, threads=threads, optimizer=optimizer, zero_grad=zero_grad,
                         wall_seconds=time.monotonic() - t_start)


def _check_run_arguments(plan: Plan, weights: str, optimizer: str, steps: int | None = None) -> None:
    """Refuse an unknown optimizer, an infeasible plan or unknown weights, naming what is wrong.

    >>> _check_run_arguments(Plan(1.0, (0,), (), 1), "stash", "adam")   # no stages
    Traceback (most recent call last):
    ...
    ValueError: cannot run an infeasible plan
    """
    from workbench.runtime.rank import OPTIMIZERS

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if not plan.feasible or not plan.stages:
        raise ValueError("cannot run an infeasible plan")
    if weights not in ("stash", "single"):
        raise ValueError(f"weights must be 'stash' or 'single', got {weights!r}")
    if steps is not None:
        optimizer_steps(plan, steps)       # a flushed plan runs whole steps of its micro-batches


def refuse_split_backward(plan: Plan, what: str) -> None:
    """A ``ValueError`` for a plan whose schedule splits each backward (``I`` and ``W``: interleaved-zb, zbv,
    dualpipev), which the PipeDream engine (and so a replay) does not run.

    >>> refuse_split_backward(Plan(1.0, (0,), (), 1, schedule="zbv"), "a replay")
    Traceback (most recent call last):
    ...
    ValueError: a replay runs each backward whole; a zbv plan splits it into I and W (run it on torch's engine)
    """
    if schedule_of(plan.schedule).split_backward:
        raise ValueError(f"{what} runs each backward whole; a {plan.schedule} plan splits it into I and W (run it "
                         "on torch's engine)")


def _engine_for(plan: Plan, weights: str, engine: str, device: str, backend: str) -> str:
    """:func:`choose_engine`, except that torch's engine on GPUs needs NCCL: without it the fallback
    (which stages messages through the host) runs, or, when ``engine="torch"`` was asked for, an error.

    >>> _engine_for(Plan(1.0, (0,), (), 1), "single", "auto", "cuda", "gloo")
    'pipedream'
    """
    chosen = choose_engine(plan, weights, engine)
    if chosen == "pipedream":
        refuse_split_backward(plan, "the PipeDream engine")
    if chosen == "torch" and device == "cuda" and backend != "nccl":
        if engine == "torch":
            raise ValueError("torch's pipeline engine sends CUDA tensors and needs NCCL (a GPU per rank); "
                             f"with {backend} on GPUs use the PipeDream engine, which stages messages through the host")
        chosen = "pipedream"      # gloo cannot move CUDA tensors: the fallback stages them through the host
    return chosen


def _start_ranks(cfg: RunConfig, start_method: str) -> list[dict[str, Any]]:
    """One process per device (``OMP_NUM_THREADS`` set to ``cfg.threads`` while they start), joined
    within ``cfg.timeout + 60`` seconds; each rank's saved result, in rank order."""
    import torch.multiprocessing as mp

    from workbench.runtime.worker import spawn_entry

    world = cfg.plan.devices
    with tempfile.TemporaryDirectory(prefix="wb-run-") as outdir:
        port = free_port()
        env_threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
        try:
            ctx = mp.start_processes(spawn_entry, args=(world, cfg, outdir, "127.0.0.1", port), nprocs=world,
                                     join=False, start_method=start_method)
        finally:
            if env_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_threads
        join_or_kill(ctx, cfg.timeout + 60, "the run")
        return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(world)]


# ---------------------------------------------------------------------------------------------
# torchrun entry
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node P -m workbench.runtime.engine PLAN.json (--model NAME | --module F.py:FUNC)``.

    Every rank checks the plan against the model, then runs its share; the results are gathered over the
    process group (no shared file system needed across nodes) and rank 0 prints and writes what ``run``
    does (:func:`~workbench.runtime.session.conclude_run`: the prediction against the measurement, the
    memory of every rank, the gradient check with ``--check-grads``) to ``--out``, with ``grads.pt``.
    Bad input: one ``error:`` line, exit status 2, before any rank starts its work.
    """
    args = _parser().parse_args(argv)
    try:
        return _torchrun(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _torchrun(args: argparse.Namespace) -> int:
    """:func:`main` once its command line is read."""
    from datetime import timedelta

    import torch.distributed as dist

    from workbench.model.training_setup import TrainingSetup
    from workbench.runtime.session import check_plan_against, check_plan_valid, platform_for_run
    from workbench.runtime.worker import _execute, _setup

    plan = Plan.from_json(Path(args.plan_file))
    from workbench.parallel.run.checks import is_layout_run, layout_of_plan

    layout = layout_of_plan(args.plan_file)
    if is_layout_run(layout):          # tensor or data parallelism: the layout runtime (workbench.parallel.run)
        from workbench.parallel.run.command import torchrun_layout_command

        return torchrun_layout_command(args, plan, layout)
    if args.steps is not None:
        optimizer_steps(plan, args.steps)   # a count that leaves a partial optimizer step: one line, first
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world != plan.devices:
        raise ValueError(f"{args.plan_file}: the plan has {plan.devices} devices, torchrun started {world} ranks "
                         f"(--nproc-per-node {plan.devices} on one node)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or default_backend(device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    from workbench.profiles import load_profile

    split = load_profile(args.profile).meta.get("split_at") if args.module and args.profile else None  # --split-at
    wl = (Workload.module(args.module, split_at=split) if args.module else
          Workload.zoo(args.model, args.batch_size, dtype=args.dtype, **dict(plan.extra.get("model_config", {}))))
    for note in wl.notes if rank == 0 else ():
        print(f"note: {note}", flush=True)
    chain = _load_or_profile(args, wl, rank)
    check_plan_against(plan, wl.layers().names, chain, what=wl.name)
    made_with = TrainingSetup.from_memory_setup(plan.setup)
    setup = TrainingSetup.resolve(args, plan)   # the plan's set-up; an option that contradicts it is refused
    platform = platform_for_run(plan, setup=setup)
    if chain is not None:      # as `check PLAN --profile ...` would: the plan's set-up and links, no memory limit
        links = platform_for_run(plan, setup=made_with)     # the links check takes: the plan's, else the default
        check_plan_valid(plan, chain, links.with_(memory=math.inf), where=args.plan_file)
    engine = choose_engine(plan, platform.setup.weights, args.engine)
    if args.steps is None:
        from workbench.runtime.summary import default_steps

        args.steps = default_steps(plan, engine)
    cfg = RunConfig(plan, programs_for(plan, args.steps), wl, args.steps, args.lr, platform.setup.weights, backend,
                    device,
                    timeout=args.timeout, engine=engine,
                    optimizer=platform.setup.optimizer, zero_grad=platform.setup.zero_grad)
    _setup(rank, cfg)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
    t0 = time.monotonic()
    try:
        part = _execute(rank, world, cfg)
        parts: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(part, parts, dst=0)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        res = merge_results(parts, plan, steps=args.steps, lr=args.lr, weights=cfg.weights,  # type: ignore[arg-type]
                            backend=backend, device=device, world=world, threads=cfg.threads,
                            optimizer=cfg.optimizer, zero_grad=cfg.zero_grad, engine=cfg.engine,
                            wall_seconds=time.monotonic() - t0)
        _conclude_on_rank0(args, plan, chain, platform, wl, res)
    return 0


def _load_or_profile(args: argparse.Namespace, wl: Workload, rank: int):
    """The chain the prediction is made on: ``--profile``, else (rank 0 only, as ``run`` does) a profile made here."""
    if args.profile:
        from workbench.profiles import load_profile

        return load_profile(args.profile)
    if rank != 0:
        return None
    from workbench.profiles.profiler import profile_workload

    print(f"profiling {wl.name} on rank 0 (no --profile) ...", flush=True)
    return profile_workload(wl, progress=False)


def _conclude_on_rank0(args: argparse.Namespace, plan: Plan, chain, platform, wl: Workload, res: "RunResult") -> None:
    """Rank 0 after the run: the summary of ``run`` (printed, and written to ``--out`` with ``grads.pt``)."""
    from workbench.model.plan import chain_for_plan
    from workbench.runtime.session import conclude_run, cores_available
    from workbench.runtime.summary import format_comparison

    out = Path(args.out)
    summary = conclude_run(plan, chain_for_plan(plan, chain), platform, wl, res, steps=args.steps,
                           batch_size=wl.batch_size or args.batch_size, model_config=dict(wl.config),
                           cores=cores_available(), check_grads=args.check_grads and args.lr == 0.0, out=out)
    torch.save(res.grads, out / "grads.pt")
    print(format_comparison(summary))
    print(f"wrote {out / 'summary.json'} and the traces beside it")


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    ap = argparse.ArgumentParser(prog="workbench.runtime.engine")
    ap.add_argument("plan_file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="zoo model name")
    src.add_argument("--module", help="FILE.py:FUNC returning (model, example_inputs, example_targets, loss_fn)")
    ap.add_argument("--steps", type=int, default=None,
                    help="mini-batches to run (a flushed plan: whole optimizer steps of its micro-batches); "
                         "default: enough for the steady state, at least 20")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--weights", default=None, choices=["stash", "single"], help="default: the plan's (else stash)")
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--optimizer", default=None, help="none, sgd, momentum, adam or adamw (default: the plan's, "
                                                      "else adam), stepped with --lr")
    ap.add_argument("--zero-grad", default=None, choices=["none", "zeros"], dest="zero_grad",
                    help="the training loop (default: the plan's)")
    ap.add_argument("--engine", default="auto", choices=list(ENGINES))
    ap.add_argument("--backend", default=None, choices=["gloo", "nccl"], help="default: nccl on GPUs, else gloo")
    ap.add_argument("--dtype", default="float32", help="zoo models: float32 or bfloat16 (the profile's)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", default="build/run", help="folder for the summary and the traces (rank 0)")
    ap.add_argument("--profile", default=None,
                    help="the profile the plan was made on (default: rank 0 profiles the model first, as run does)")
    ap.add_argument("--check-grads", action="store_true",
                    help="rank 0 also runs the whole model in one process and checks the gradients against it")
    return ap


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
