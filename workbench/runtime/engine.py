"""Run a plan on torch.distributed: one process per device, a measured :class:`~workbench.trace.Trace`.

:func:`run_plan` starts ``plan.devices`` processes with
``torch.multiprocessing`` (gloo on CPU, NCCL on GPUs), each executing its
device's program (:mod:`~workbench.runtime.program`, :mod:`~workbench.runtime.worker`),
and gathers the operations, the memory and the accumulated gradients into a
:class:`RunResult`. :func:`reference_gradients` computes the same gradients
in a single process, so that with a learning rate of zero (every mini-batch
sees the same weights) ``max_grad_error(result.grads, reference)`` is
floating-point noise, below :func:`grad_tolerance` of the run's dtype.

A workload has a precision (``Workload.zoo(..., dtype="bfloat16")``: the
model's parameters and floating inputs in bf16, as the profiler's ``dtype``);
every rank, the replay and the reference run in it, so what is measured is
what a profile of that dtype predicts.

Under ``torchrun`` (several nodes work the same way) use the module entry::

    torchrun --nproc-per-node 4 -m workbench.runtime.engine PLAN.json --model resnet50 --steps 20 --out build/run

>>> wl = Workload.zoo("mlp", batch_size=4)
>>> tuple(wl.batch(0)[0].shape)
(4, 32)
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from torch import nn

from ..plan import Plan
from ..trace import MEMORY_COLUMNS, OP_COLUMNS, Trace
from .program import Op, programs_for
from .worker import RunConfig

__all__ = ["Workload", "RunResult", "run_plan", "reference_gradients", "grad_error", "grad_tolerance",
           "free_port", "default_backend", "join_or_kill", "programs_for", "merge_results"]


# ---------------------------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------------------------
def _zoo_build(name: str, seed: int, config: dict, dtype: str = "float32") -> nn.Sequential:
    from ..profiles.zoo import build_model

    return build_model(name, seed=seed, dtype=dtype, **config)


def _zoo_batch(name: str, batch_size: int, seed: int, config: dict, i: int, dtype: str = "float32"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    from ..profiles.zoo import sample_batch

    return sample_batch(name, batch_size, seed=seed * 100003 + i + 1, dtype=dtype, **config)


def _zoo_loss(name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    from ..profiles.zoo import loss_fn

    return loss_fn(name)(out, target)


@dataclass
class Workload:
    """What to train: ``build() -> nn.Sequential`` (children = chain layers), ``batch(i) -> (input, target)``
    for mini-batch ``i``, ``loss(output, target) -> scalar``. All three must be picklable (module-level
    functions or ``functools.partial`` of them) since they cross process boundaries. ``dtype`` names the
    precision ``build`` and ``batch`` produce (a record: it is theirs to honour)."""

    build: Callable[[], nn.Sequential]
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    name: str = "model"
    batch_size: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"

    @classmethod
    def zoo(cls, name: str, batch_size: int, seed: int = 0, dtype: str | torch.dtype | None = None,
            **config: Any) -> "Workload":
        """A zoo model (:mod:`workbench.profiles.zoo`) with its sample batches and loss, in ``dtype``
        (default float32; ``"bfloat16"``: parameters, buffers and floating inputs in bf16).

        >>> wl = Workload.zoo("mlp", 4, dtype="bf16")
        >>> wl.dtype, wl.batch(0)[0].dtype, next(wl.build().parameters()).dtype
        ('bfloat16', torch.bfloat16, torch.bfloat16)
        """
        from ..profiles.zoo import dtype_name

        dt = dtype_name(dtype)
        return cls(partial(_zoo_build, name, seed, config, dt), partial(_zoo_batch, name, batch_size, seed, config,
                                                                         dtype=dt),
                   partial(_zoo_loss, name), name=name, batch_size=batch_size, config=dict(config), dtype=dt)


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
    """Single-process gradients summed over mini-batches 0..steps-1 (the weights never change), computed on
    ``device`` and returned on the CPU."""
    model = workload.build().to(device)
    model.train()
    for i in range(steps):
        x, y = workload.batch(i)
        workload.loss(model(x.to(device)), y.to(device)).backward()
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
    from ..profiles.zoo import as_dtype

    return _GRAD_TOLERANCE[as_dtype(dtype)]


def merge_results(parts: Sequence[dict[str, Any]], plan: Plan, **meta: Any) -> RunResult:
    ops = pd.DataFrame([r for p in parts for r in p["ops"]], columns=OP_COLUMNS)
    ops = ops.sort_values(["start", "device"]).reset_index(drop=True)
    mem = pd.DataFrame([r for p in parts for r in p["memory"]], columns=MEMORY_COLUMNS)
    mem = mem.sort_values(["device", "time"]).reset_index(drop=True)
    grads: dict[str, torch.Tensor] = {}
    for p in parts:
        grads.update(p["grads"])
    cpu = pd.DataFrame([r for p in parts for r in p.get("cpu", [])],
                       columns=["device", "stage", "kind", "batch", "cpu"])
    info = {
        "cpu": cpu,
        "max_memory_allocated": [p["max_memory_allocated"] for p in sorted(parts, key=lambda q: q["rank"])],
        "saved_per_stage": {int(s): v for p in parts for s, v in p["saved_per_stage"].items()},
        **meta,
    }
    trace = Trace(ops, mem, plan.devices, period=plan.period, source="measured", meta=info)
    return RunResult(trace, grads, info)


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
    lookahead: int = 2,
    programs: list[list[Op]] | None = None,
    chain=None,
    platform=None,
    start_method: str | None = None,
) -> RunResult:
    """Execute ``plan`` for ``steps`` mini-batches in ``plan.devices`` processes and measure it.

    ``device`` is "cpu" (default when no GPU) or "cuda" (one GPU per rank, or
    ranks sharing GPUs round-robin); ``backend`` defaults to gloo on CPU and
    NCCL on GPUs, or gloo with host-staged messages when there are fewer GPUs
    than ranks (NCCL refuses two ranks on one GPU; see :func:`default_backend`). ``timeout`` bounds every collective and the whole run: a
    hung run raises ``TimeoutError`` instead of hanging. ``start_method``
    "fork" starts faster (no re-import of torch) and is the default on CPU
    under Linux; "spawn" (the default otherwise) is the safe choice with CUDA.
    """
    if not plan.feasible or not plan.stages:
        raise ValueError("cannot run an infeasible plan")
    if weights not in ("stash", "single"):
        raise ValueError(f"weights must be 'stash' or 'single', got {weights!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = backend or default_backend(device, plan.devices)
    progs = programs if programs is not None else programs_for(plan, steps, chain, platform)
    cfg = RunConfig(plan, progs, workload, steps, lr, weights, backend, device, threads, timeout, lookahead)
    world = plan.devices
    if start_method is None:
        start_method = "fork" if (device == "cpu" and sys.platform.startswith("linux")) else "spawn"
    import torch.multiprocessing as mp

    from .worker import spawn_entry

    with tempfile.TemporaryDirectory(prefix="wb-run-") as outdir:
        port = free_port()
        env_threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(threads)
        t_start = time.monotonic()
        try:
            ctx = mp.start_processes(spawn_entry, args=(world, cfg, outdir, "127.0.0.1", port), nprocs=world,
                                     join=False, start_method=start_method)
        finally:
            if env_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_threads
        join_or_kill(ctx, timeout + 60, "the run")
        parts = [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return merge_results(parts, plan, steps=steps, lr=lr, weights=weights, backend=backend, device=device,
                         world=world, threads=threads, wall_seconds=time.monotonic() - t_start)


# ---------------------------------------------------------------------------------------------
# torchrun entry
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node P -m workbench.runtime.engine PLAN.json --model NAME ...``.

    Every rank writes ``rank{r}.pt`` to ``--out``; rank 0 merges them into
    ``measured.csv`` (+ ``measured.memory.csv``) after a barrier.
    """
    from .worker import run_rank

    ap = argparse.ArgumentParser(prog="workbench.runtime.engine")
    ap.add_argument("plan_file")
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--weights", default="stash")
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 (the profile's)")
    ap.add_argument("--out", default="build/run")
    args = ap.parse_args(argv)
    plan = Plan.from_json(Path(args.plan_file))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != plan.devices:
        raise SystemExit(f"the plan has {plan.devices} devices, torchrun started {world} ranks")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or default_backend(device, world)
    wl = Workload.zoo(args.model, args.batch_size, dtype=args.dtype, **dict(plan.extra.get("model_config", {})))
    cfg = RunConfig(plan, programs_for(plan, args.steps), wl, args.steps, args.lr, args.weights, backend, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_rank(rank, world, cfg, str(out))
    if rank == 0:
        parts = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
        res = merge_results(parts, plan, steps=args.steps)
        res.trace.save(out / "measured.csv")
        print(f"measured period {res.measured_period:.6g} s (plan {plan.period:.6g} s); peak memory "
              + ", ".join(f"{m:.4g}" for m in res.peak_memory()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
