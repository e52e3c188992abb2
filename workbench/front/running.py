"""``python -m workbench run PLAN.json (--model NAME | --module FILE.py:FUNC) [--steps N] [--replay]``.

Runs a plan and compares it with its prediction. With ``--replay`` every device runs alone
instead (:mod:`~workbench.runtime.replay`), and ``replay.csv`` holds its compute time and
memory against the prediction.

``--steps`` counts mini-batches for every method; a flushed plan of m micro-batches runs them as whole
optimizer steps of m (a count that is not a multiple of m is refused in one line:
:func:`~workbench.schedules.program.optimizer_steps`); the default is enough for the steady state, at
least 20 (:func:`~workbench.runtime.summary.default_steps`).

Before anything long (a profile, the ranks), the plan is checked against the
model (:func:`check_plan_against`): the layer count, and the layer names where
the plan or the profile records them; a plan made for another model is refused
naming the mismatch. The run then says what it does as it goes, and warns when
there are more ranks than cores (the ranks take turns: times mean little,
memory and gradients are still exact).

The model is a zoo model (``--model``), any module (``--module FILE.py:FUNC``,
``FUNC()`` returning ``(model, example_inputs, example_targets, loss_fn)``:
:mod:`~workbench.profiles.usermodel`), or the one ``--profile`` was made of
(its ``model`` or ``module`` metadata). The chain the plan was made on is
``--profile`` (a profile file written by ``python -m workbench profile``) or,
without it, a fresh profile made here. The run is in the profile's precision.
It uses a learning rate of zero with a real optimizer step (``--optimizer``,
default adam), so its accumulated gradients are checked against a single
process (``max_grad_error``, relative to the largest gradient, against
``grad_tolerance`` of the dtype). The engine is torch's pipeline engine where
it expresses the plan, the PipeDream fallback otherwise
(:func:`~workbench.runtime.engine.choose_engine`, ``--engine``).

Writes to ``--out``: ``measured.csv`` (+ ``measured.memory.csv``, the
trace in the simulator's format), ``predicted.csv`` (the simulated trace),
``comparison.csv`` (per device) and ``summary.json`` (atomically) with keys
``predicted_period``, ``measured_period``, ``memory_predicted`` (the plan's
memory, ``memory_plan``, plus on torch's engine what it preallocates,
``memory_engine_extra``: :func:`workbench.model.memory_views.torch_engine_extra`),
``memory_measured`` (the allocator-level peak per device), ``memory_breakdown``,
``max_grad_error``, ``engine``, ``optimizer`` and more (errors, per-device busy
times, calibration, cores).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from workbench.model.training_setup import DEFAULT_BANDWIDTH
from workbench.runtime.session import (
    check_plan_against,
    check_plan_valid,
    conclude_run,
    cores_available,
    dropout_modules,
    model_config_of,
    platform_for_run,
    profile_dtype,
    workload_for,
)
from workbench.runtime.summary import format_comparison
from workbench.schedules.program import optimizer_steps

__all__ = ["run_command", "run_and_compare", "format_comparison", "validate_zoo", "measure_series", "profile_dtype",
           "check_plan_against", "cores_available", "dropout_modules"]


def run_and_compare(plan, chain, platform, model, batch_size: int, steps: int = 20, *,
                    model_config: dict[str, Any] | None = None, backend: str | None = None,
                    out: str | Path | None = None, timeout: float = 300.0, check_grads: bool = True,
                    replan: bool = True, dtype: str | None = None, progress: bool = False,
                    **run_kw: Any) -> dict[str, Any]:
    """Run ``plan`` on ``model`` (a zoo name or a :class:`Workload`), compare with the prediction;
    return (and write) the summary.

    ``dtype`` is a zoo model's precision (default: the profile's, :func:`profile_dtype`).
    ``run_kw`` goes to :func:`~workbench.runtime.engine.run_plan` (``engine``, ``optimizer``,
    ``device``, ``lr``, ...). The summary also holds ``"result"`` (the :class:`RunResult`),
    ``"comparison"`` (per-device DataFrame), ``"stages"`` and ``"calibration"``; only the
    JSON-able part goes to ``summary.json``. ``replan=False`` skips re-planning on the
    calibrated chain (see :func:`~workbench.runtime.compare.calibration_report`).
    """
    from workbench.model.plan import chain_for_plan
    from workbench.runtime.engine import Workload

    say = print if progress else (lambda *a, **k: None)
    chain = chain_for_plan(plan, chain)
    cfg = dict(model_config or {})
    wl = model if isinstance(model, Workload) else Workload.zoo(model, batch_size, dtype=dtype or profile_dtype(chain),
                                                                 **cfg)
    cores = cores_available()
    res = _run_ranks(plan, chain, platform, wl, steps, cores, say, backend=backend, timeout=timeout, **run_kw)
    return conclude_run(plan, chain, platform, wl, res, steps=steps, batch_size=batch_size, model_config=cfg,
                        cores=cores, check_grads=check_grads and run_kw.get("lr", 0.0) == 0.0, replan=replan,
                        out=out, say=say)


def _run_ranks(plan, chain, platform, wl, steps: int, cores: int, say, **run_kw: Any):
    """Say what runs where (and warn of more ranks than cores), run the plan, say how long it took."""
    import time

    from workbench.runtime.engine import choose_engine, run_plan

    engine = choose_engine(plan, platform.setup.weights, run_kw.get("engine", "auto"))
    if platform.setup.memory_model == "full":     # the optimizer and the loop the plan's memory counts are the ones run
        run_kw.setdefault("optimizer", platform.setup.optimizer)
        run_kw.setdefault("zero_grad", platform.setup.zero_grad)
    if plan.devices > cores:
        say(f"warning: {plan.devices} ranks on {cores} cores: the ranks take turns on the cores, so the measured "
            "times mean little (memory and gradients are still exact)", file=sys.stderr)
    say(f"running {plan.devices} ranks on {engine} engine: {steps} mini-batches of {wl.name}, optimizer "
        f"{run_kw.get('optimizer', 'adam')}, zero_grad {run_kw.get('zero_grad', 'none')} ...", flush=True)
    t0 = time.perf_counter()
    res = run_plan(plan, wl, steps, weights=platform.setup.weights, chain=chain, platform=platform, **run_kw)
    say(f"  ranks done in {time.perf_counter() - t0:.1f} s", flush=True)
    return res


def validate_zoo(model: str, devices: int, batch_size: int, steps: int = 20, *, out: str | Path | None = None,
                 method: str = "dp", memory: float | str = math.inf, bandwidth: float | str = DEFAULT_BANDWIDTH,
                 weights: str = "stash", repeats: int = 10, chain=None, dtype: str | None = None,
                 **config: Any) -> dict[str, Any]:
    """Profile zoo ``model`` here (in ``dtype``, default float32), plan it on ``devices`` with ``method``,
    run the plan and compare.

    Writes ``profile.csv`` and everything :func:`run_and_compare` writes to ``out``.
    Pass ``chain`` to reuse a profile (e.g. the same one for 2 and 4 devices); the run is in its dtype.
    """
    from workbench.model.target import Target
    from workbench.planners import plan as run_planner
    from workbench.profiles import write_profile
    from workbench.profiles.profiler import profile_zoo

    if chain is None:
        chain = profile_zoo(model, batch_size, repeats=repeats, dtype=dtype, **config)
    platform = Target.of(devices, memory=memory, bandwidth=bandwidth, weights=weights)  # type: ignore[arg-type]
    plan = run_planner(chain, platform, method)
    if not plan.feasible:
        raise ValueError(f"{method} found no plan: {'; '.join(plan.notes)}")
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_profile(chain, Path(out) / "profile.csv")
    return run_and_compare(plan, chain, platform, model, batch_size, steps, model_config=config, out=out)


def measure_series(model: str, devices=(2, 4), attempts: int = 3, batch_size: int = 8, steps: int = 24, *,
                   root: str | Path = "data/runs", repeats: int = 10, verbose: bool = True, **config: Any):
    """Several attempts of :func:`validate_zoo` per device count, each with a fresh profile taken just before.

    Writes ``root/{model}-P{P}/attempt{k}/`` and merges one row per attempt
    into ``root/index.csv`` (rows of the same model and device count are
    replaced). Returns the rows as a DataFrame. Repeating exposes how much
    a shared machine moves the times; memory does not move.
    """
    import pandas as pd

    from workbench.io import write_frame_atomic

    root = Path(root)
    rows = []
    for P in devices:
        for k in range(attempts):
            s = validate_zoo(model, P, batch_size, steps, out=root / f"{model}-P{P}" / f"attempt{k}",
                             repeats=repeats, **config)
            if verbose:
                print(format_comparison(s), flush=True)
            cal = s["calibration"]
            rows.append({
                "model": model, "devices": P, "attempt": k, "batch_size": batch_size, "steps": steps,
                "config": json.dumps(config, separators=(",", ":")), "assignment": " ".join(map(str, s["assignment"])),
                "predicted_period": s["predicted_period"], "measured_period": s["measured_period"],
                "period_error": s["period_error"],
                "calibrated_period": cal["calibrated_period"], "error_after": cal["error_after"],
                "calibrated_occupied_period": cal["calibrated_occupied_period"],
                "error_after_occupied": cal["error_after_occupied"],
                "max_memory_error": max(abs(e) for e in s["memory_error"]),
                "max_busy_error": max(abs(e) for e in s["busy_error"]),
                "max_cpu_busy_error": max(abs(rel) for rel in [(c - p) / p for c, p in
                                                                zip(s["cpu_busy_measured"], s["busy_predicted"])]),
                "min_core_share": min(s["core_share"]),
                "max_grad_error": s["max_grad_error"],
                "load_average_1min": (s.get("load_average") or [math.nan])[0], "cpu_count": s.get("cpu_count"),
            })
    df = pd.DataFrame(rows)
    index = root / "index.csv"
    if index.exists():
        old = pd.read_csv(index)
        keep = ~(old["model"].eq(model) & old["devices"].isin(list(devices)))
        df = pd.concat([old[keep], df], ignore_index=True)
    write_frame_atomic(index, df)
    return df


def _replay(plan, chain, platform, wl, steps: int, out: Path, optimizer: str) -> int:
    """``run --replay``: every device alone (:mod:`~workbench.runtime.replay`); prints and writes ``replay.csv``."""
    import pandas as pd

    from workbench.model.plan import chain_for_plan
    from workbench.model.units import format_bytes
    from workbench.runtime.replay import replay_to

    chain = chain_for_plan(plan, chain)
    print(f"replaying each of {plan.devices} devices alone ...", flush=True)
    res, rep = replay_to(out, plan, chain, wl, steps, weights=platform.setup.weights, platform=platform,
                         optimizer=optimizer, zero_grad=platform.setup.zero_grad)
    print(f"{wl.name}: each of {plan.devices} devices replayed alone ({res.meta['device']}, {wl.dtype}), "
          f"{steps} mini-batches")
    for r in rep.itertuples():
        peak = "" if pd.isna(r.allocator_peak) else (f"; allocator peak {format_bytes(r.allocator_peak)} "
                                                      f"({r.allocator_over_predicted:.2f}x rule 7)")
        print(f"  device {r.device}: compute {r.predicted_busy * 1e3:8.3f} -> {r.measured_busy * 1e3:8.3f} ms "
              f"({r.busy_error:+.1%}); memory {format_bytes(r.predicted_memory)} -> "
              f"{format_bytes(r.measured_memory)}{peak}")
    print(f"wrote {out / 'replay.csv'} and {out / 'replay_trace.csv'}")
    return 0


def _refuse_what_check_rejects(args: argparse.Namespace, plan, chain) -> None:
    """``check PLAN --profile ...`` with run's platform options (memory, links) must accept the plan before any
    rank starts. How to run it (``--weights``, ``--optimizer``, ``--precision``) is run's choice: the plan is
    checked with the set-up it was made for (run's options agree with it: :meth:`TrainingSetup.resolve`)."""
    from workbench.front.planning import platform_from_args
    from workbench.model.training_setup import TrainingSetup

    checked = argparse.Namespace(**{**vars(args), "devices": args.devices or plan.devices})
    made_with = TrainingSetup.from_memory_setup(plan.setup)
    check_plan_valid(plan, chain, platform_from_args(checked, plan, made_with), where=str(args.plan_file))


def _run_profile(args: argparse.Namespace) -> tuple[Any, int]:
    """``run``'s profile (``--profile``; None without one) and the batch size to run: the profile's where it
    records one for a zoo model, else ``--batch-size``."""
    batch_size = args.batch_size
    chain = None
    profile = getattr(args, "profile", None)
    if profile:
        from workbench.profiles import load_profile
        from workbench.profiles.zoo import dtype_name

        chain = load_profile(profile)
        if getattr(args, "dtype", None) and profile_dtype(chain) != dtype_name(args.dtype):
            raise ValueError(f"--dtype {args.dtype} but the profile {profile} was measured in {profile_dtype(chain)}: "
                             "a run is in its profile's precision")
        from workbench.profiles.csvio import batch_size_of

        profiled = batch_size_of(chain.meta, str(profile))      # None where unknown (PipeDream's graphs)
        if profiled and profiled != batch_size and \
                not getattr(args, "module", None) and not chain.meta.get("module"):
            print(f"note: using the profile's batch size {chain.meta['batch_size']} (not {batch_size})")
            batch_size = profiled
        if chain.meta.get("times") == "estimated":
            print(f"note: {profile} is a fake profile: its times are estimates for {chain.meta.get('gpu', 'a GPU')}, "
                  "this run measures this machine (memory and gradients compare; times do not)")
    return chain, batch_size


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``python -m workbench run`` (see the module docstring)."""
    from workbench.model.memory import validate_setup
    from workbench.model.plan import Plan
    from workbench.model.training_setup import TrainingSetup

    plan = Plan.from_json(Path(args.plan_file))
    if not plan.feasible:
        raise ValueError(f"{args.plan_file}: the plan is infeasible; nothing to run")
    from workbench.parallel.run.checks import is_layout_run, layout_of_plan

    layout = layout_of_plan(args.plan_file)
    if is_layout_run(layout):           # tensor or data parallelism: the layout runtime (workbench.parallel.run)
        from workbench.parallel.run.command import run_layout_command

        return run_layout_command(args, plan, layout)
    from workbench.parallel.run.command import _model_args

    args = _model_args(args, plan)      # a plan from `plan --module ... --parallel` names its model
    setup = TrainingSetup.resolve(args, plan)   # an option that contradicts the plan's set-up: refused first
    if args.steps is not None:          # as is a count of mini-batches that leaves a partial optimizer step
        optimizer_steps(plan, args.steps)
    if args.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--backend nccl needs a CUDA GPU per rank and there is none here; use gloo")
    chain, batch_size = _run_profile(args)
    if chain is None and layout is not None and (plan.extra or {}).get("module"):
        from workbench.parallel.profiles import plan_rank_chain

        chain = plan_rank_chain(plan, layout)       # the chain the plan was made on (fake: its GPU's times)
        if chain.meta.get("times") == "estimated":
            print(f"note: {args.plan_file} was planned on a fake profile: its times are estimates for "
                  f"{chain.meta.get('gpu', 'a GPU')}, this run measures this machine (memory and gradients compare; "
                  "times do not)")
    wl = workload_for(args, chain, plan, batch_size)
    for note in wl.notes:
        print(f"note: {note}", flush=True)
    print(f"checking the plan against {wl.name} ...", flush=True)
    from workbench.profiles.usermodel import user_code

    with user_code(wl.source):
        names = wl.layers().names
    check_plan_against(plan, names, chain, what=f"{wl.name}")
    print(f"  {len(names)} layers, as the plan{' and the profile' if chain is not None else ''} says", flush=True)
    if chain is None:
        from workbench.profiles.profiler import profile_workload

        print(f"profiling {wl.name} on this machine (no --profile) ...", flush=True)
        chain = profile_workload(wl, progress=True)
    _refuse_what_check_rejects(args, plan, chain)
    platform = platform_for_run(plan, setup=setup, bandwidth=getattr(args, "bandwidth", None),
                                latency=getattr(args, "latency", 0.0))
    validate_setup(platform, chain)
    optimizer = platform.setup.optimizer
    from workbench.runtime.engine import choose_engine
    from workbench.runtime.summary import default_steps

    engine = choose_engine(plan, platform.setup.weights, getattr(args, "engine", None) or "auto")
    # --steps counts mini-batches (a flushed plan: whole optimizer steps of its micro-batches, else one line);
    # by default enough of them for the steady state the plan describes
    steps = args.steps if args.steps is not None else default_steps(plan, engine)
    if getattr(args, "replay", False):
        return _replay(plan, chain, platform, wl, steps, Path(args.out), optimizer)
    summary = run_and_compare(plan, chain, platform, wl, batch_size, steps,
                              model_config=model_config_of(chain, plan),
                              backend=args.backend, out=args.out, progress=True, optimizer=optimizer,
                              engine=getattr(args, "engine", None) or "auto")
    print(format_comparison(summary))
    print(f"wrote {Path(args.out) / 'summary.json'} and the traces beside it")
    return 0
