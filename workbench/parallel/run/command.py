"""``python -m workbench run PLAN.json`` for a plan whose layout has tensor or data parallelism.

``run`` hands a plan whose ``"parallel"`` object has ``tp`` or ``dp`` above 1 here
(:func:`run_layout_command`); a pure pipeline (``tp = dp = 1``) runs as before. Everything the run could
refuse is refused before any rank starts (:mod:`~workbench.parallel.run.checks`: one ``error:`` line, exit
2): the layout against the plan's pipeline, more ranks than ``--max-ranks``, sizes ``tp`` does not divide,
the plan against the model, a vocabulary-parallel loss (``lp=1``) that is not a plain cross-entropy of the head's
logits, a ``--steps`` (mini-batches per replica, as for every method: whole
optimizer steps of the plan's micro-batches; default one step) that leaves a partial step. The model is
``--module`` / ``--model``, the one ``--profile`` records, or the
one the plan records (``extra.module`` / ``extra.model``). Without ``--profile`` the model is profiled here
first (the prediction of the pipeline's memory needs its chain).

Then the ranks run (:mod:`~workbench.parallel.run.launch`), one process per rank of the layout; a rank that
fails stops every rank and the command says which rank failed and why (``error:``, exit 1). The summary
(:mod:`~workbench.parallel.run.summary`) is printed and written to ``--out/summary.json``.

Across machines, ``torchrun --nnodes N --node-rank I --master-addr HOST --nproc-per-node K -m
workbench.runtime.engine PLAN.json (--model NAME | --module F.py:FUNC) --steps M --out DIR [--check-grads]``
runs the same layout (:func:`torchrun_layout_command`): N x K must be the layout's ranks.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from workbench.model.layout import Layout

__all__ = ["run_layout_command", "torchrun_layout_command", "prepare_layout_run"]


def _model_args(args: argparse.Namespace, plan) -> argparse.Namespace:
    """``args`` with ``--module`` / ``--model`` taken from the plan where neither is given, nor a profile."""
    if getattr(args, "module", None) or getattr(args, "model", None) or getattr(args, "profile", None):
        return args
    extra = plan.extra or {}
    if extra.get("module"):
        return argparse.Namespace(**{**vars(args), "module": str(extra["module"])})
    if extra.get("model"):
        return argparse.Namespace(**{**vars(args), "model": str(extra["model"])})
    return args


def prepare_layout_run(args: argparse.Namespace, plan, layout: Layout, *, started: int | None = None,
                       profile: bool = True, say=print) -> tuple[Any, Any, Any]:
    """The checks of the module docstring, then (config, chain, platform) of the run; ``started``: the ranks
    torchrun started (None: this machine starts them, at most ``--max-ranks``); ``profile``: profile the
    model without ``--profile`` (under torchrun rank 0 only: the chain serves the prediction)."""
    from workbench.model.training_setup import TrainingSetup
    from workbench.parallel.run.checks import (
        DEFAULT_MAX_RANKS,
        check_layout_model,
        check_layout_plan,
        check_loss_parallel,
        check_ranks,
        layout_micro_batches,
    )
    from workbench.parallel.run.config import LayoutConfig
    from workbench.parallel.run.pipeline import needs_programs
    from workbench.profiles.usermodel import user_code
    from workbench.runtime.session import check_plan_against, platform_for_run, workload_for
    from workbench.schedules.program import programs_for

    where = str(args.plan_file)
    check_layout_plan(plan, layout, where)
    check_ranks(layout, max_ranks=None if started else (getattr(args, "max_ranks", None) or DEFAULT_MAX_RANKS),
                started=started)
    micro_batches, steps = layout_micro_batches(plan, layout, getattr(args, "steps", None))
    setup = TrainingSetup.resolve(args, plan)   # an option that contradicts the plan's set-up: refused first
    chain = _load_profile(getattr(args, "profile", None))
    if chain is not None:
        from workbench.parallel.profiles import check_rank_chain

        check_rank_chain(chain, layout, f"--profile {args.profile}")
    args = _model_args(args, plan)
    wl = workload_for(args, chain, plan, _batch_size(args, chain))
    with user_code(wl.source):
        names = wl.layers().names
        check_plan_against(plan, names, chain, what=wl.name)
        model = wl.build()
        check_layout_model(layout, model, wl.batch_size)
        check_loss_parallel(layout, wl, model)
    if chain is None and profile:
        chain = _rank_chain(wl, layout, plan, say)
    platform = platform_for_run(plan, setup=setup)   # every option the plan left open reaches it (--precision)
    programs = programs_for(plan, micro_batches) if needs_programs(plan) else None
    cfg = LayoutConfig(plan, layout, wl, micro_batches, programs, lr=getattr(args, "lr", 0.0) or 0.0,
                       optimizer=platform.setup.optimizer, zero_grad=platform.setup.zero_grad,
                       timeout=float(getattr(args, "timeout", None) or 300.0), optimizer_steps=steps)
    return cfg, chain, platform


def _rank_chain(wl, layout: Layout, plan, say):
    """The chain of one rank, for the prediction (no ``--profile``): ``tp = 1``, the model profiled on this
    machine; ``tp > 1``, rank 0's tensor-parallel profile under fake tensors (its memory columns are the gloo
    ranks': docs/model.md, "Layouts at run time"), for the plan's GPU (times are not compared)."""
    if layout.tp == 1:
        from workbench.profiles.profiler import profile_workload

        say(f"profiling {wl.name} on this machine (no --profile) ...", flush=True)
        return profile_workload(wl, progress=False)
    from functools import partial

    from workbench.parallel.run.workloads import workload_example
    from workbench.parallel.tensor.profile import tensor_parallel_profile
    from workbench.profiles.usermodel import user_code

    gpu = (plan.setup or {}).get("gpu") or "h100-sxm"
    say(f"profiling a rank of {wl.name} under tp={layout.tp} (fake tensors; no --profile) ...", flush=True)
    build = wl.source if wl.source and ".py:" in wl.source else partial(workload_example, wl)  # FILE.py:FUNC
    with user_code(wl.source):
        return tensor_parallel_profile(build, gpu, layout.tp, sequence_parallel=layout.sequence_parallel,
                                       loss_parallel=layout.loss_parallel, cache=False)


def _batch_size(args: argparse.Namespace, chain) -> int:
    """A zoo model's batch size: the profile's where it records one, else ``--batch-size`` (default 8)."""
    profiled = str((chain.meta if chain is not None else {}).get("batch_size") or "").split()
    if profiled and not getattr(args, "module", None) and not chain.meta.get("module"):
        return int(profiled[0])
    return int(getattr(args, "batch_size", None) or 8)


def _load_profile(path: str | None):
    if not path:
        return None
    from workbench.profiles import load_profile

    return load_profile(path)


def run_layout_command(args: argparse.Namespace, plan, layout: Layout) -> int:
    """Handler of ``run`` for a layout plan (see the module docstring)."""
    import sys

    from workbench.parallel.run.launch import RankFailure, conclude_layout, run_layout
    from workbench.parallel.run.summary import format_layout_summary

    cfg, chain, platform = prepare_layout_run(args, plan, layout)
    k = cfg.optimizer_steps
    print(f"running {layout.describe()}: {layout.devices} ranks, {k * cfg.micro_batches} mini-batches per replica "
          f"({k} optimizer step{'s' * (k > 1)} of {cfg.micro_batches}) of {cfg.workload.name}, optimizer "
          f"{cfg.optimizer} ...", flush=True)
    t0 = time.perf_counter()
    try:
        parts = run_layout(cfg)
    except RankFailure as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    print(f"  ranks done in {wall:.1f} s", flush=True)
    summary = conclude_layout(cfg, parts, chain, platform, out=args.out, wall_seconds=wall)
    print(format_layout_summary(summary))
    print(f"wrote {Path(args.out) / 'summary.json'}")
    return 0


def _quiet(*args: Any, **kwargs: Any) -> None:
    """Says nothing (ranks other than 0 under torchrun)."""


def torchrun_layout_command(args: argparse.Namespace, plan, layout: Layout) -> int:
    """``torchrun ... -m workbench.runtime.engine PLAN.json`` for a layout plan: every rank checks what ``run``
    checks (against the ranks torchrun started), then runs its share; rank 0 concludes
    (:func:`~workbench.parallel.run.launch.torchrun_layout`)."""
    import os

    from workbench.parallel.run.launch import torchrun_layout

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cfg, chain, platform = prepare_layout_run(args, plan, layout, started=world, profile=rank == 0,
                                              say=print if rank == 0 else _quiet)
    return torchrun_layout(cfg, chain, platform, args.out, check_grads=getattr(args, "check_grads", False))
