"""Start a layout's ranks and conclude the run: ``torch.multiprocessing`` on one machine, ``torchrun`` across.

:func:`run_layout` starts ``tp x pp x dp`` processes (fork on Linux CPUs, else spawn) that join one gloo
process group (NCCL on GPUs) and run :func:`~workbench.parallel.run.rank.run_layout_rank`; it returns the
ranks' results in rank order. A rank that fails writes what it raised beside its coordinates; every other
rank is then stopped (torch's process context terminates them) and :class:`RankFailure` names the first rank
that failed and why. Under ``torchrun`` (``python -m workbench.runtime.engine`` hands a layout plan to
:func:`torchrun_layout`) the ranks gather their results on rank 0 over the process group, so no shared file
system is needed; torchrun's agent stops the other ranks when one fails, and the failing rank prints its
``error:`` line.

:func:`conclude_layout` checks the gradients against one process (the ``dp`` replicas together ran the
workload's mini-batches ``0 .. k x dp x M - 1`` in the run's k optimizer steps, the gradients summed over
them; DDP and FSDP average over the replicas, so the ranks' gradient
times ``dp`` is the one process's sum) and writes ``summary.json``
(:func:`~workbench.parallel.run.summary.summarise_layout`).

>>> RankFailure(3, (1, 1, 1), "RuntimeError: boom").args[0]
'rank 3 (pp 1, dp 1, tp 1) failed: RuntimeError: boom; every rank was stopped'
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.parallel.run.config import LayoutConfig

__all__ = ["RankFailure", "run_layout", "conclude_layout", "layout_gradient_errors", "torchrun_layout"]


class RankFailure(RuntimeError):
    """A rank of a layout run failed: which (rank and coordinates) and why."""

    def __init__(self, rank: int, coords: tuple[int, int, int], why: str) -> None:
        pp, dp, tp = coords
        super().__init__(f"rank {rank} (pp {pp}, dp {dp}, tp {tp}) failed: {why}; every rank was stopped")
        self.rank, self.coords, self.why = rank, coords, why


def _why(e: BaseException) -> str:
    """What a rank raised, in one line: the innermost cause's type and first line."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def quiet_torch() -> None:
    """In a rank: silence what torch says on every step of a correct run (FSDP2's note that a stage returns a
    view, which the pipeline sends as it is; DTensor's note on gathering a 2-D sharded gradient whole)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _rank_entry(rank: int, cfg: LayoutConfig, outdir: str, addr: str, port: int) -> None:
    """Target of ``start_processes``: join the group, run, save ``rank{r}.pt``; on failure ``rank{r}.error``."""
    from datetime import timedelta

    import torch.distributed as dist

    from workbench.parallel.run.rank import run_layout_rank
    from workbench.parallel.tensor.mesh import forget_dtensor_meshes

    torch.set_num_threads(max(1, cfg.threads))
    quiet_torch()
    forget_dtensor_meshes()          # forked: nothing the parent decided under a fake group is to be reused
    try:
        dist.init_process_group(cfg.backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=cfg.world,
                                timeout=timedelta(seconds=cfg.timeout))
        result = run_layout_rank(rank, cfg)
        tmp = os.path.join(outdir, f".rank{rank}.pt")
        torch.save(result, tmp)
        os.replace(tmp, os.path.join(outdir, f"rank{rank}.pt"))
        dist.barrier()
    except BaseException as e:
        tmp = os.path.join(outdir, f".rank{rank}.error")
        with open(tmp, "w") as f:
            json.dump({"time": time.time(), "why": _why(e), "traceback": traceback.format_exc()}, f)
        os.replace(tmp, os.path.join(outdir, f"rank{rank}.error"))     # whole, or not there
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _first_failure(cfg: LayoutConfig, outdir: str) -> RankFailure | None:
    """The rank that failed first (by the time it wrote its error), as a :class:`RankFailure`."""
    found = []
    for r in range(cfg.world):
        path = Path(outdir) / f"rank{r}.error"
        if path.exists():
            info = json.loads(path.read_text())
            found.append((info["time"], r, info["why"]))
    if not found:
        return None
    _, r, why = min(found)
    return RankFailure(r, cfg.layout.coords(r), why)


def run_layout(cfg: LayoutConfig, start_method: str | None = None) -> list[dict[str, Any]]:
    """Run ``cfg`` in ``cfg.world`` local processes; the ranks' results in rank order (a :class:`RankFailure`
    when one fails, a ``TimeoutError`` past ``cfg.timeout + 60`` seconds; no rank outlives the call)."""
    import torch.multiprocessing as mp

    from workbench.runtime.worker import free_port

    if start_method is None:
        start_method = "fork" if (cfg.device == "cpu" and sys.platform.startswith("linux")) else "spawn"
    with tempfile.TemporaryDirectory(prefix="wb-layout-") as outdir:
        env_threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
        try:
            ctx = mp.start_processes(_rank_entry, args=(cfg, outdir, "127.0.0.1", free_port()), nprocs=cfg.world,
                                     join=False, start_method=start_method)
        finally:
            if env_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_threads
        _join(ctx, cfg, outdir)
        return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(cfg.world)]


def _join(ctx: Any, cfg: LayoutConfig, outdir: str) -> None:
    """Wait for the ranks; on a failure stop them all and raise the first rank's :class:`RankFailure`."""
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    deadline = time.monotonic() + cfg.timeout + 60
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the layout run did not finish within {cfg.timeout + 60:.0f} s")
    except ProcessExitedException as e:        # a rank died without a Python error: a crash, or killed
        r = int(e.error_index)
        if not (Path(outdir) / f"rank{r}.error").exists():
            raise RankFailure(r, cfg.layout.coords(r), f"its process ended with {e.signal_name or e.exit_code} "
                              "and no Python error (a crash inside torch, e.g. a collective whose sizes differ "
                              "between ranks; the other ranks' errors follow from it)") from None
        raise _first_failure(cfg, outdir) or e from None
    except (ProcessRaisedException, TimeoutError) as e:
        raise _first_failure(cfg, outdir) or e from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)


def layout_gradient_errors(parts: list[dict[str, Any]], wl, layout, micro_batches: int,
                           say: Callable[..., None] = print, optimizer_steps: int = 1) -> tuple[float, float]:
    """(absolute, relative) error of the ranks' gradients (summed over the run's optimizer steps, times ``dp``)
    against one process's sum over the ``optimizer_steps x dp x micro_batches`` mini-batches the replicas ran."""
    from workbench.runtime.gradients import grad_error, reference_gradients

    grads: dict[str, torch.Tensor] = {}
    for p in parts:
        grads.update(p["grads"])
    n = optimizer_steps * layout.dp * micro_batches
    say(f"reference gradients in one process ({n} mini-batches) ...", flush=True)
    ref = reference_gradients(wl, n)
    return grad_error({n: g * layout.dp for n, g in grads.items()}, ref)


def conclude_layout(cfg: LayoutConfig, parts: list[dict[str, Any]], chain, platform, *, out: str | Path | None,
                    wall_seconds: float, check_grads: bool = True, say: Callable[..., None] = print) -> dict[str, Any]:
    """The summary of a finished layout run (see the module docstring), written to ``out/summary.json``."""
    from workbench.parallel.run.summary import summarise_layout
    from workbench.runtime.session import dropout_modules
    from workbench.runtime.summary import jsonable

    wl = cfg.workload
    dropout = dropout_modules(wl.build())
    if dropout:
        say(f"note: dropout in {', '.join(dropout[:3])}: the gradients differ from one process by more than "
            "rounding; build the model with dropout 0 to check them", file=sys.stderr)
    errors = (layout_gradient_errors(parts, wl, cfg.layout, cfg.micro_batches, say, cfg.optimizer_steps)
              if check_grads and cfg.lr == 0
              else (math.nan, math.nan))
    meta = {"backend": cfg.backend, "device": cfg.device, "optimizer": cfg.optimizer, "zero_grad": cfg.zero_grad,
            "lr": cfg.lr, "wall_seconds": wall_seconds, "dropout": dropout,
            "steps": cfg.optimizer_steps * cfg.micro_batches, "optimizer_steps": cfg.optimizer_steps}
    summary = summarise_layout(cfg.plan, cfg.layout, chain, platform, wl, parts, micro_batches=cfg.micro_batches,
                               grad_errors=errors, meta=meta)
    if out is not None:
        from workbench.io import write_text_atomic

        Path(out).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(out) / "plan.json", cfg.plan.to_json() + "\n")
        write_text_atomic(Path(out) / "summary.json", json.dumps(jsonable(summary), indent=2) + "\n")
    return summary


def torchrun_layout(cfg: LayoutConfig, chain, platform, out: str | Path, check_grads: bool) -> int:
    """One rank under ``torchrun`` (``RANK``, ``WORLD_SIZE`` set; the checks done): run, gather on rank 0,
    which concludes and prints the summary. A failure prints ``error: rank R (...) failed: why`` here."""
    from datetime import timedelta

    import torch.distributed as dist

    from workbench.parallel.run.rank import run_layout_rank
    from workbench.parallel.run.summary import format_layout_summary

    rank = int(os.environ.get("RANK", 0))
    torch.set_num_threads(max(1, cfg.threads))
    quiet_torch()
    dist.init_process_group(cfg.backend, rank=rank, world_size=cfg.world, timeout=timedelta(seconds=cfg.timeout))
    t0 = time.monotonic()
    try:
        part = run_layout_rank(rank, cfg)
        parts: list[Any] | None = [None] * cfg.world if rank == 0 else None
        dist.gather_object(part, parts, dst=0)
    except Exception as e:
        print(f"error: {RankFailure(rank, cfg.layout.coords(rank), _why(e)).args[0]}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()
    if rank == 0:
        summary = conclude_layout(cfg, parts, chain, platform, out=out, wall_seconds=time.monotonic() - t0,  # type: ignore[arg-type]
                                  check_grads=check_grads)
        print(format_layout_summary(summary))
        print(f"wrote {Path(out) / 'summary.json'}")
    return 0
