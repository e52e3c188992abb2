"""``python -m workbench run PLAN.json (--model NAME | --module FILE.py:FUNC) [--steps N] [--replay]``.

Runs a plan and compares it with its prediction. With ``--replay`` every device runs alone
instead (:mod:`~workbench.runtime.replay`), and ``replay.csv`` holds its compute time and
memory against the prediction.

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
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from workbench.runtime.summary import format_comparison, jsonable, summarise

__all__ = ["run_command", "run_and_compare", "format_comparison", "validate_zoo", "measure_series", "profile_dtype",
           "check_plan_against", "cores_available", "dropout_modules"]


def _model_config(chain, plan) -> dict[str, Any]:
    for src in (chain.meta.get("model_config") if chain is not None else None, plan.extra.get("model_config")):
        if src:
            cfg = json.loads(src) if isinstance(src, str) else dict(src)
            return {k: tuple(v) if isinstance(v, list) and k in ("blocks", "sizes") else v for k, v in cfg.items()}
    return {}


def profile_dtype(chain) -> str:
    """The precision a profile was measured in (its ``dtype`` metadata), float32 when it says none.

    >>> from workbench.model.chain import Chain, Layer
    >>> profile_dtype(Chain((Layer("a", 1, 1, 0, 0),), meta={"dtype": "bfloat16"}))
    'bfloat16'
    """
    from workbench.profiles.zoo import dtype_name

    text = (chain.meta.get("dtype") if chain is not None else None) or "float32"
    try:
        return dtype_name(text)
    except ValueError:
        return "float32"


def cores_available() -> int:
    """The CPU cores this process may run on.

    >>> cores_available() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def dropout_modules(model) -> list[str]:
    """Names of the model's dropout modules with p > 0 (they make a gradient check meaningless).

    >>> import torch
    >>> dropout_modules(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1), torch.nn.Dropout(0.0)))
    ['1']
    """
    from torch import nn

    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def check_plan_against(plan, names: Sequence[str], chain=None, what: str = "the model") -> None:
    """Refuse a plan made for another model: the layer count, and the names the plan or the
    profile records (``plan.extra["layer_names"]``, the profile's layers), against ``names``.

    >>> from workbench.model.plan import Plan
    >>> check_plan_against(Plan(1.0, (0, 0, 1), (), 2), ["a", "b"])
    Traceback (most recent call last):
    ...
    ValueError: the plan has 3 layers but the model has 2 (a, b): the plan was made for another model
    """
    names = list(names)
    short = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    if len(plan.assignment) != len(names):
        raise ValueError(f"the plan has {len(plan.assignment)} layers but {what} has {len(names)} ({short}): "
                         "the plan was made for another model")
    for source, other in (("the plan", plan.extra.get("layer_names")),
                          ("the profile", [l.name for l in chain.layers] if chain is not None else None)):
        if other is None:
            continue
        if plan.chain_order is not None and source == "the profile":
            continue
        diff = [(i, a, b) for i, (a, b) in enumerate(zip(other, names)) if a != b]
        if len(other) != len(names) or diff:
            i, a, b = diff[0] if diff else (min(len(other), len(names)), "(none)", "(none)")
            raise ValueError(f"{source} names layer {i} {a!r} but {what} calls it {b!r}: the plan was made "
                             "for another model")


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
    from workbench.runtime.compare import calibration_report, compare, stage_times
    from workbench.runtime.engine import Workload

    say = print if progress else (lambda *a, **k: None)
    chain = chain_for_plan(plan, chain)
    cfg = dict(model_config or {})
    wl = model if isinstance(model, Workload) else Workload.zoo(model, batch_size, dtype=dtype or profile_dtype(chain),
                                                                 **cfg)
    cores = cores_available()
    res = _run_ranks(plan, chain, platform, wl, steps, cores, say, backend=backend, timeout=timeout, **run_kw)
    random_layers = dropout_modules(wl.build())
    abs_err, max_err = _gradient_errors(res, wl, steps, random_layers, check_grads and run_kw.get("lr", 0.0) == 0.0,
                                        say)
    on_cpu = str(res.meta.get("device", "cpu")).startswith("cpu")
    load = os.getloadavg()[0] if (on_cpu and hasattr(os, "getloadavg")) else None
    cmp = compare(plan, chain, platform, res.trace, cores=cores if on_cpu else None, load=load)
    cal = calibration_report(plan, chain, platform, res.trace, replan=replan)
    summary = summarise(plan, chain, platform, wl, res, cmp, cal, model_config=cfg, batch_size=batch_size,
                        steps=steps, grad_errors=(abs_err, max_err), dropout=random_layers, cores=cores)
    if out is not None:
        _write_run(Path(out), plan, chain, platform, steps, res, cmp, summary)
    summary["result"] = res
    summary["comparison"] = cmp
    summary["stages"] = stage_times(plan, chain, res.trace)
    return summary


def _run_ranks(plan, chain, platform, wl, steps: int, cores: int, say, **run_kw: Any):
    """Say what runs where (and warn of more ranks than cores), run the plan, say how long it took."""
    import time

    from workbench.runtime.engine import choose_engine, run_plan

    engine = choose_engine(plan, platform.weights, run_kw.get("engine", "auto"))
    if platform.memory_model == "full":     # the optimizer and the loop the plan's memory counts are the ones run
        run_kw.setdefault("optimizer", platform.optimizer)
        run_kw.setdefault("zero_grad", platform.zero_grad)
    if plan.devices > cores:
        say(f"warning: {plan.devices} ranks on {cores} cores: the ranks take turns on the cores, so the measured "
            "times mean little (memory and gradients are still exact)", file=sys.stderr)
    say(f"running {plan.devices} ranks on {engine} engine: {steps} mini-batches of {wl.name}, optimizer "
        f"{run_kw.get('optimizer', 'adam')}, zero_grad {run_kw.get('zero_grad', 'none')} ...", flush=True)
    t0 = time.perf_counter()
    res = run_plan(plan, wl, steps, weights=platform.weights, chain=chain, platform=platform, **run_kw)
    say(f"  ranks done in {time.perf_counter() - t0:.1f} s", flush=True)
    return res


def _gradient_errors(res, wl, steps: int, random_layers: list[str], check: bool, say) -> tuple[float, float]:
    """(absolute, relative) error of the run's gradients against one process; NaN when not checked."""
    import torch

    from workbench.runtime.engine import grad_error, reference_gradients

    if random_layers:
        say(f"note: dropout in {', '.join(random_layers[:3])}{' ...' if len(random_layers) > 3 else ''}: the "
            "ranks and one process draw other masks, so the gradients differ by more than rounding; build the "
            "model with dropout 0 to check them", file=sys.stderr)
    if not check:
        return math.nan, math.nan
    say("reference gradients in one process ...", flush=True)
    torch.set_num_threads(1)
    # the reference runs where the run ran (same kernels: on GPUs, TF32 convolutions and all)
    return grad_error(res.grads, reference_gradients(wl, steps, device=res.meta["device"]))


def _write_run(out: Path, plan, chain, platform, steps: int, res, cmp, summary: dict[str, Any]) -> None:
    """``measured.csv``, ``predicted.csv``, ``comparison.csv``, ``measured.cpu.csv``, ``plan.json`` and
    ``summary.json`` (the JSON-able part) to ``out``, each written atomically."""
    from workbench.io import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    res.trace.save(out / "measured.csv")
    try:
        from workbench.verify.simulate import simulate

        simulate(plan, chain, platform, steps).save(out / "predicted.csv")
    except Exception as e:  # pragma: no cover - the simulator is another module's business
        summary["simulate_error"] = repr(e)
    write_text_atomic(out / "comparison.csv", cmp.to_csv(index=False))
    write_text_atomic(out / "measured.cpu.csv", res.meta["cpu"].to_csv(index=False))
    write_text_atomic(out / "plan.json", plan.to_json() + "\n")
    write_text_atomic(out / "summary.json", json.dumps(jsonable(summary), indent=2) + "\n")


def validate_zoo(model: str, devices: int, batch_size: int, steps: int = 20, *, out: str | Path | None = None,
                 method: str = "dp", memory: float | str = math.inf, bandwidth: float | str = "12GB/s",
                 weights: str = "stash", repeats: int = 10, chain=None, dtype: str | None = None,
                 **config: Any) -> dict[str, Any]:
    """Profile zoo ``model`` here (in ``dtype``, default float32), plan it on ``devices`` with ``method``,
    run the plan and compare.

    Writes ``profile.csv`` and everything :func:`run_and_compare` writes to ``out``.
    Pass ``chain`` to reuse a profile (e.g. the same one for 2 and 4 devices); the run is in its dtype.
    """
    from workbench.model.chain import Platform
    from workbench.planners import plan as run_planner
    from workbench.profiles import write_profile
    from workbench.profiles.profiler import profile_zoo

    if chain is None:
        chain = profile_zoo(model, batch_size, repeats=repeats, dtype=dtype, **config)
    platform = Platform(devices, memory=memory, bandwidth=bandwidth, weights=weights)  # type: ignore[arg-type]
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
    res, rep = replay_to(out, plan, chain, wl, steps, weights=platform.weights, platform=platform,
                         optimizer=optimizer, zero_grad=platform.zero_grad)
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


def _workload(args: argparse.Namespace, chain, plan, batch_size: int):
    """The workload of ``--module``, ``--model`` or the profile's metadata (``module`` / ``model``)."""
    from workbench.profiles.usermodel import resolve_spec, user_code
    from workbench.runtime.engine import Workload

    module = getattr(args, "module", None)
    if not module and chain is not None and chain.meta.get("module") and not getattr(args, "model", None):
        module = resolve_spec(chain.meta["module"], Path(str(chain.meta.get("source_file", "."))).parent)
    if module:
        with user_code(module):
            return Workload.module(module)
    model = getattr(args, "model", None) or (chain.meta.get("model") if chain is not None else None)
    if not model:
        raise ValueError("say which model to run: --model NAME (zoo), --module FILE.py:FUNC, or a --profile "
                         "that records one")
    cfg = _model_config(chain, plan)
    dtype = profile_dtype(chain) if chain is not None else (getattr(args, "dtype", None) or "float32")
    return Workload.zoo(model, batch_size, dtype=dtype, **cfg)


def _run_platform(args: argparse.Namespace, plan, chain):
    """The platform a run compares against: the plan's devices, memory limit and training set-up (weights,
    optimizer, precision, loop: an option that contradicts the plan is refused,
    :func:`~workbench.front.planning.resolve_setup`), checked against the profile's dtype."""
    from workbench.front.planning import resolve_setup
    from workbench.model.chain import Platform
    from workbench.model.memory import validate_setup

    setup = resolve_setup(args, plan)
    paper = setup["memory_model"] == "paper"
    recorded = plan.setup or {}
    platform = Platform(plan.devices, memory=plan.memory_limit,
                        bandwidth=getattr(args, "bandwidth", None) or recorded.get("bandwidth", math.inf),
                        latency=getattr(args, "latency", 0.0) or 0.0, weights=setup["weights"],
                        memory_model=setup["memory_model"],
                        host_bandwidth=getattr(args, "host_bandwidth", None) or recorded.get("host_bandwidth",
                                                                                           "31.5GB/s"),
                        **({"weight_factor": setup["weight_factor"]} if paper else
                           {"optimizer": setup["optimizer"], "precision": setup["precision"],
                            "zero_grad": setup["zero_grad"]}))
    validate_setup(platform, chain)
    return platform


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``python -m workbench run`` (see the module docstring)."""
    from workbench.front.planning import resolve_setup
    from workbench.model.plan import Plan

    plan = Plan.from_json(Path(args.plan_file))
    if not plan.feasible:
        raise ValueError(f"{args.plan_file}: the plan is infeasible; nothing to run")
    resolve_setup(args, plan)           # an option that contradicts the plan's set-up: refused before anything
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
        profiled = int(str(chain.meta["batch_size"]).split()[0]) if chain.meta.get("batch_size") else None
        if profiled and profiled != batch_size and \
                not getattr(args, "module", None) and not chain.meta.get("module"):
            print(f"note: using the profile's batch size {chain.meta['batch_size']} (not {batch_size})")
            batch_size = profiled
        if chain.meta.get("times") == "estimated":
            print(f"note: {profile} is a fake profile: its times are estimates for {chain.meta.get('gpu', 'a GPU')}, "
                  "this run measures this machine (memory and gradients compare; times do not)")
    wl = _workload(args, chain, plan, batch_size)
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
    platform = _run_platform(args, plan, chain)
    optimizer = platform.optimizer
    if getattr(args, "steps", None) is None:      # enough mini-batches for the steady state the plan describes
        from workbench.runtime.engine import choose_engine
        from workbench.runtime.summary import steady_steps

        args.steps = max([20] + steady_steps(plan, choose_engine(plan, platform.weights,
                                                                 getattr(args, "engine", None) or "auto")))
    if getattr(args, "replay", False):
        return _replay(plan, chain, platform, wl, args.steps, Path(args.out), optimizer)
    summary = run_and_compare(plan, chain, platform, wl, batch_size, args.steps,
                              model_config=_model_config(chain, plan),
                              backend=args.backend, out=args.out, progress=True, optimizer=optimizer,
                              engine=getattr(args, "engine", None) or "auto")
    print(format_comparison(summary))
    print(f"wrote {Path(args.out) / 'summary.json'} and the traces beside it")
    return 0
