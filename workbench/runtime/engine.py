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
import os
import socket
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
from workbench.profiles.workload import Workload, model_loss
from workbench.runtime.config import RunConfig
from workbench.runtime.program import Op, programs_for

__all__ = ["Workload", "RunResult", "run_plan", "reference_gradients", "grad_error", "grad_tolerance",
           "free_port", "default_backend", "join_or_kill", "programs_for", "merge_results", "choose_engine",
           "ENGINES"]

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


def reference_gradients(workload: Workload, steps: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Single-process gradients of the whole model (shared parameters tied, as built) summed over
    mini-batches 0..steps-1 (the weights never change), computed on ``device``, returned on the CPU."""
    model = workload.build().to(device)
    model.train()
    for i in range(steps):
        inputs, y = workload.batch(i)
        inputs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), inputs)
        model_loss(workload, model, inputs, y.to(device) if isinstance(y, torch.Tensor) else y).backward()
    return {n: (p.grad.detach().cpu().clone() if p.grad is not None else torch.zeros_like(p, device="cpu"))
            for n, p in model.named_parameters()}


def grad_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(max absolute difference, that divided by the largest reference magnitude) over all parameters,
    computed in float64 whatever the gradients' dtype."""
    missing = sorted(set(reference) ^ set(grads))
    if missing:
        raise ValueError(f"gradient names differ: {missing[:5]}")
    abs_err = max(float((grads[n].double() - reference[n].double()).abs().max()) for n in reference)
    scale = max(float(reference[n].double().abs().max()) for n in reference)
    return abs_err, abs_err / scale if scale > 0 else abs_err


# float32: what the H100 runs reached in float32 (at most 1.4e-6) with room; bfloat16: 4 units in the last
# place of the largest gradient (8 significant bits: one unit is 2**-7 of it), see grad_tolerance
_GRAD_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2.0**-5, torch.float16: 2.0**-8}


def grad_tolerance(dtype: str | torch.dtype | None = None) -> float:
    """The largest relative :func:`grad_error` of a run against :func:`reference_gradients` that is still
    rounding, for gradients of ``dtype`` (default float32).

    The run and the reference compute the same layers with the same kernels, but
    not always in the same order of summation (a stage's backward alone against
    the whole model's; on a GPU, algorithms chosen per call and atomic adds), and
    each of the ``steps`` accumulations rounds. In float32 the committed H100
    runs differ by at most 1.4e-6; the bound is 1e-5. bfloat16 keeps 8
    significant bits, so one rounding of the largest gradient moves it by up to
    2**-7 (0.8%) of itself and a different order of summation by a few such units:
    the bound is 4 units, 2**-5 (3.1%). What it catches is then coarser than in
    float32: an error must move the largest accumulated gradient by more than
    3.1% of itself. Losing one of ``steps`` mini-batches moves the sum by about
    1/steps of it (6% at 16 steps, caught; 2.5% at 40, not reliably), a wrong
    weight version or a gradient sent to the wrong stage by far more. The H100
    bf16 runs differ by at most 0.85% (gpt-medium on 4 devices).

    >>> grad_tolerance(), grad_tolerance("bfloat16")
    (1e-05, 0.03125)
    """
    from workbench.profiles.zoo import as_dtype

    return _GRAD_TOLERANCE[as_dtype(dtype)]


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
    cpu = pd.DataFrame([r for p in parts for r in p.get("cpu", [])],
                       columns=["device", "stage", "kind", "batch", "cpu"])
    ordered = sorted(parts, key=lambda q: q["rank"])
    info = {
        "cpu": cpu,
        "max_memory_allocated": [p["max_memory_allocated"] for p in ordered],
        "memory_peak": [p["memory_peak"] for p in ordered],
        "memory_breakdown": [p["memory_breakdown"] for p in ordered],
        "engine": ordered[0]["engine"] if ordered else None,
        **meta,
    }
    trace = Trace(ops, mem, plan.devices, period=plan.period, source="measured", meta=info)
    return RunResult(trace, grads, info)


def choose_engine(plan: Plan, weights: str, engine: str = "auto") -> str:
    """``"torch"`` where torch's engine expresses the plan (flushed schedules; periodic plans with one
    weight version), ``"pipedream"`` for periodic plans with weight stashing; ``engine`` forces one."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    return "pipedream" if plan.schedule == "periodic" and weights == "stash" else "torch"


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    _check_run_arguments(plan, weights, optimizer)
    if zero_grad not in ("none", "zeros"):
        raise ValueError(f"zero_grad must be 'none' or 'zeros', got {zero_grad!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = backend or default_backend(device, plan.devices)
    progs = programs if programs is not None else programs_for(plan, steps, chain, platform)
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


def _check_run_arguments(plan: Plan, weights: str, optimizer: str) -> None:
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


def _engine_for(plan: Plan, weights: str, engine: str, device: str, backend: str) -> str:
    """:func:`choose_engine`, except that torch's engine on GPUs needs NCCL: without it the fallback
    (which stages messages through the host) runs, or, when ``engine="torch"`` was asked for, an error.

    >>> _engine_for(Plan(1.0, (0,), (), 1), "single", "auto", "cuda", "gloo")
    'pipedream'
    """
    chosen = choose_engine(plan, weights, engine)
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

    Every rank runs its share; the results are gathered over the process group (no shared file
    system needed across nodes) and rank 0 writes ``measured.csv`` (+ ``measured.memory.csv``) and
    ``grads.pt`` to ``--out`` and prints the period and the memory.
    """
    from datetime import timedelta

    import torch.distributed as dist

    from workbench.io import write_text_atomic
    from workbench.runtime.worker import _execute, _setup

    args = _parser().parse_args(argv)
    plan = Plan.from_json(Path(args.plan_file))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != plan.devices:
        raise SystemExit(f"the plan has {plan.devices} devices, torchrun started {world} ranks")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or default_backend(device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    wl = (Workload.module(args.module) if args.module else
          Workload.zoo(args.model, args.batch_size, dtype=args.dtype, **dict(plan.extra.get("model_config", {}))))
    for note in wl.notes if rank == 0 else ():
        print(f"note: {note}", flush=True)
    setup = plan.setup or {}
    weights = args.weights or setup.get("weights", "stash")
    cfg = RunConfig(plan, programs_for(plan, args.steps), wl, args.steps, args.lr, weights, backend, device,
                    timeout=args.timeout, engine=choose_engine(plan, weights, args.engine),
                    optimizer=args.optimizer or setup.get("optimizer", "adam"),
                    zero_grad=args.zero_grad or setup.get("zero_grad", "zeros" if setup else "none"))
    _setup(rank, cfg)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
    try:
        part = _execute(rank, world, cfg)
        parts: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(part, parts, dst=0)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        res = merge_results(parts, plan, steps=args.steps, engine=cfg.engine)  # type: ignore[arg-type]
        res.trace.save(out / "measured.csv")
        torch.save(res.grads, out / "grads.pt")
        write_text_atomic(out / "engine.txt", cfg.engine + "\n")
        print(f"{cfg.engine} engine: measured period {res.measured_period:.6g} s (plan {plan.period:.6g} s); "
              "peak memory " + ", ".join(f"{m:.4g}" for m in res.meta["memory_peak"]))
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    ap = argparse.ArgumentParser(prog="workbench.runtime.engine")
    ap.add_argument("plan_file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="zoo model name")
    src.add_argument("--module", help="FILE.py:FUNC returning (model, example_inputs, example_targets, loss_fn)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--weights", default=None, choices=["stash", "single"], help="default: the plan's")
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--optimizer", default=None, help="default: the plan's")
    ap.add_argument("--zero-grad", default=None, choices=["none", "zeros"], dest="zero_grad",
                    help="the training loop (default: the plan's)")
    ap.add_argument("--engine", default="auto", choices=list(ENGINES))
    ap.add_argument("--backend", default=None)
    ap.add_argument("--dtype", default="float32", help="zoo models: float32 or bfloat16 (the profile's)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", default="build/run")
    return ap


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
