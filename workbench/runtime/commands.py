"""``python -m workbench run PLAN.json --model NAME [--steps N] [--replay]``: run a plan, compare with its prediction.

With ``--replay`` every device runs alone instead (:mod:`~workbench.runtime.replay`),
and ``replay.csv`` holds its compute time and memory against the prediction.

The chain the plan was made on is ``--profile`` (a profile file written by
``python -m workbench profile``, whose metadata carries the model's
configuration and batch size) or, without it, a fresh profile of the zoo
model made here with :func:`workbench.profiles.profiler.profile_zoo`. The
run is in the profile's precision (its ``dtype``, e.g. a bfloat16 profile
runs the model in pure bf16; ``--dtype`` for a fresh profile). The
run uses a learning rate of zero, so its accumulated gradients are checked
against a single process (``max_grad_error``, relative to the largest
gradient, against ``grad_tolerance`` of the dtype).

Writes to ``--out``: ``measured.csv`` (+ ``measured.memory.csv``, the
trace in the simulator's format), ``predicted.csv`` (the simulated trace),
``comparison.csv`` (per device) and ``summary.json`` (atomically) with keys
``predicted_period``, ``measured_period``, ``memory_predicted``,
``memory_measured``, ``max_grad_error`` and more (errors, per-device busy
times, calibration).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["run_command", "run_and_compare", "format_comparison", "validate_zoo", "measure_series", "profile_dtype"]


def _model_config(chain, plan) -> dict[str, Any]:
    for src in (chain.meta.get("model_config") if chain is not None else None, plan.extra.get("model_config")):
        if src:
            cfg = json.loads(src) if isinstance(src, str) else dict(src)
            return {k: tuple(v) if isinstance(v, list) and k in ("blocks", "sizes") else v for k, v in cfg.items()}
    return {}


def profile_dtype(chain) -> str:
    """The precision a profile was measured in (its ``dtype`` metadata), float32 when it says none.

    >>> from workbench.chain import Chain, Layer
    >>> profile_dtype(Chain((Layer("a", 1, 1, 0, 0),), meta={"dtype": "bfloat16"}))
    'bfloat16'
    """
    from ..profiles.zoo import dtype_name

    text = (chain.meta.get("dtype") if chain is not None else None) or "float32"
    try:
        return dtype_name(text)
    except ValueError:
        return "float32"


def run_and_compare(plan, chain, platform, model: str, batch_size: int, steps: int = 20, *,
                    model_config: dict[str, Any] | None = None, backend: str | None = None,
                    out: str | Path | None = None, timeout: float = 300.0, check_grads: bool = True,
                    replan: bool = True, dtype: str | None = None, **run_kw: Any) -> dict[str, Any]:
    """Run ``plan`` on zoo ``model``, compare with the prediction; return (and write) the summary.

    ``dtype`` is the run's precision (default: the profile's, :func:`profile_dtype`).
    The summary also holds ``"result"`` (the :class:`RunResult`), ``"comparison"``
    (per-device DataFrame), ``"stages"`` and ``"calibration"``; only the JSON-able
    part goes to ``summary.json``. ``replan=False`` skips re-planning on the
    calibrated chain (see :func:`~workbench.runtime.compare.calibration_report`).
    """
    import torch

    from ..io import write_text_atomic
    from ..plan import chain_for_plan
    from .compare import calibration_report, compare, stage_times
    from .engine import Workload, grad_error, grad_tolerance, reference_gradients, run_plan

    dtype = dtype or profile_dtype(chain)
    chain = chain_for_plan(plan, chain)
    cfg = dict(model_config or {})
    wl = Workload.zoo(model, batch_size, dtype=dtype, **cfg)
    res = run_plan(plan, wl, steps, backend=backend, timeout=timeout, weights=platform.weights,
                   chain=chain, platform=platform, **run_kw)
    max_err = abs_err = math.nan
    if check_grads and run_kw.get("lr", 0.0) == 0.0:
        torch.set_num_threads(1)
        # the reference runs where the run ran (same kernels: on GPUs, TF32 convolutions and all)
        abs_err, max_err = grad_error(res.grads, reference_gradients(wl, steps, device=res.meta["device"]))
    on_cpu = str(res.meta.get("device", "cpu")).startswith("cpu")
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) if on_cpu else None
    load = os.getloadavg()[0] if (on_cpu and hasattr(os, "getloadavg")) else None
    cmp = compare(plan, chain, platform, res.trace, cores=cores, load=load)
    cal = calibration_report(plan, chain, platform, res.trace, replan=replan)
    summary: dict[str, Any] = {
        "model": model, "model_config": cfg, "batch_size": batch_size, "steps": steps, "dtype": wl.dtype,
        "devices": plan.devices, "assignment": list(plan.assignment), "allocation": plan.allocation,
        "weights": platform.weights, "backend": res.meta["backend"], "device": res.meta["device"],
        "predicted_period": plan.period, "measured_period": cmp.attrs["measured_period"],
        "period_error": cmp.attrs["period_error"],
        "memory_predicted": [float(m) for m in plan.memory],
        "memory_measured": [float(m) for m in cmp["measured_memory"]],
        "memory_error": [float(e) for e in cmp["memory_error"]],
        "busy_predicted": [float(b) for b in cmp["predicted_busy"]],
        "busy_measured": [float(b) for b in cmp["measured_busy"]],
        "busy_error": [float(e) for e in cmp["busy_error"]],
        "cpu_busy_measured": [float(b) for b in cmp["measured_cpu_busy"]] if "measured_cpu_busy" in cmp else None,
        "core_share": [float(b) for b in cmp["core_share"]] if "core_share" in cmp else None,
        "max_grad_error": max_err, "max_grad_error_abs": abs_err, "grad_tolerance": grad_tolerance(wl.dtype),
        "calibration": cal,
        "warnings": list(cmp.attrs.get("warnings", [])),
        "meaningful": not cmp.attrs.get("warnings"),
        "max_memory_allocated": res.meta.get("max_memory_allocated"),
        "wall_seconds": res.meta.get("wall_seconds"),
        "profile_device": chain.meta.get("device", ""),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_count": os.cpu_count(),
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        res.trace.save(out / "measured.csv")
        try:
            from ..simulate import simulate

            simulate(plan, chain, platform, steps).save(out / "predicted.csv")
        except Exception as e:  # pragma: no cover - the simulator is another module's business
            summary["simulate_error"] = repr(e)
        write_text_atomic(out / "comparison.csv", cmp.to_csv(index=False))
        write_text_atomic(out / "measured.cpu.csv", res.meta["cpu"].to_csv(index=False))
        write_text_atomic(out / "plan.json", plan.to_json() + "\n")
        write_text_atomic(out / "summary.json", json.dumps(_jsonable(summary), indent=2) + "\n")
    summary["result"] = res
    summary["comparison"] = cmp
    summary["stages"] = stage_times(plan, chain, res.trace)
    return summary


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    return x


def format_comparison(summary: dict[str, Any]) -> str:
    """A human table: period and per-device memory and busy time, predicted against measured."""
    from ..units import format_bytes

    lines = [
        f"{summary['model']}: {summary['steps']} mini-batches of {summary['batch_size']} on {summary['devices']} "
        f"processes ({summary['backend']}, {summary['device']}, {summary.get('dtype', 'float32')}), "
        f"weights {summary['weights']}",
        f"  period     predicted {summary['predicted_period'] * 1e3:9.3f} ms   measured "
        f"{summary['measured_period'] * 1e3:9.3f} ms   error {summary['period_error']:+.1%}",
    ]
    for d in range(summary["devices"]):
        lines.append(
            f"  device {d}: memory {format_bytes(summary['memory_predicted'][d]):>10} -> "
            f"{format_bytes(summary['memory_measured'][d]):>10} ({summary['memory_error'][d]:+.2%}); busy "
            f"{summary['busy_predicted'][d] * 1e3:8.3f} -> {summary['busy_measured'][d] * 1e3:8.3f} ms "
            f"({summary['busy_error'][d]:+.1%})"
            + (f"; CPU {summary['cpu_busy_measured'][d] * 1e3:8.3f} ms, core share {summary['core_share'][d]:.0%}"
               if summary.get("core_share") else ""))
    cal = summary.get("calibration", {})
    if cal:
        lines.append(f"  calibrated prediction (same allocation): {cal['calibrated_period'] * 1e3:.3f} ms, "
                     f"error {cal['error_before']:+.1%} -> {cal['error_after']:+.1%}")
        if cal.get("note"):
            lines.append(f"  calibration: {cal['note']}")
    for w in summary.get("warnings") or []:
        lines.append(f"  NOT MEANINGFUL as a test of the times: {w}")
    lines.append(f"  max gradient error (lr 0, vs one process): {summary['max_grad_error']:.3g} (relative; rounding "
                 f"bound {summary.get('grad_tolerance', math.nan):.3g})")
    return "\n".join(lines)


def validate_zoo(model: str, devices: int, batch_size: int, steps: int = 20, *, out: str | Path | None = None,
                 method: str = "dp", memory: float | str = math.inf, bandwidth: float | str = "12GB/s",
                 weights: str = "stash", repeats: int = 10, chain=None, dtype: str | None = None,
                 **config: Any) -> dict[str, Any]:
    """Profile zoo ``model`` here (in ``dtype``, default float32), plan it on ``devices`` with ``method``,
    run the plan and compare.

    Writes ``profile.csv`` and everything :func:`run_and_compare` writes to ``out``.
    Pass ``chain`` to reuse a profile (e.g. the same one for 2 and 4 devices); the run is in its dtype.
    """
    from ..chain import Platform
    from ..planners import plan as run_planner
    from ..profiles import write_profile
    from ..profiles.profiler import profile_zoo

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

    from ..io import write_frame_atomic

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


def _replay(plan, chain, platform, model: str, batch_size: int, steps: int, cfg: dict[str, Any], out: Path) -> int:
    """``run --replay``: every device alone (:mod:`~workbench.runtime.replay`); prints and writes ``replay.csv``."""
    import pandas as pd

    from ..plan import chain_for_plan
    from ..units import format_bytes
    from .engine import Workload
    from .replay import replay_to

    wl = Workload.zoo(model, batch_size, dtype=profile_dtype(chain), **cfg)
    chain = chain_for_plan(plan, chain)
    res, rep = replay_to(out, plan, chain, wl, steps, weights=platform.weights, platform=platform)
    print(f"{model}: each of {plan.devices} devices replayed alone ({res.meta['device']}, {wl.dtype}), "
          f"{steps} mini-batches")
    for r in rep.itertuples():
        peak = "" if pd.isna(r.allocator_peak) else (f"; allocator peak {format_bytes(r.allocator_peak)} "
                                                      f"({r.allocator_over_predicted:.2f}x rule 7)")
        print(f"  device {r.device}: compute {r.predicted_busy * 1e3:8.3f} -> {r.measured_busy * 1e3:8.3f} ms "
              f"({r.busy_error:+.1%}); memory {format_bytes(r.predicted_memory)} -> "
              f"{format_bytes(r.measured_memory)}{peak}")
    print(f"wrote {out / 'replay.csv'} and {out / 'replay_trace.csv'}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``python -m workbench run`` (see the module docstring)."""
    from ..chain import Platform
    from ..plan import Plan

    plan = Plan.from_json(Path(args.plan_file))
    if not plan.feasible:
        raise ValueError(f"{args.plan_file}: the plan is infeasible; nothing to run")
    batch_size = args.batch_size
    profile = getattr(args, "profile", None)
    if profile:
        from ..profiles import load_profile
        from ..profiles.zoo import dtype_name

        chain = load_profile(profile)
        if getattr(args, "dtype", None) and profile_dtype(chain) != dtype_name(args.dtype):
            raise ValueError(f"--dtype {args.dtype} but the profile {profile} was measured in {profile_dtype(chain)}: "
                             "a run is in its profile's precision")
        if chain.meta.get("batch_size") and int(chain.meta["batch_size"]) != batch_size:
            print(f"note: using the profile's batch size {chain.meta['batch_size']} (not {batch_size})")
            batch_size = int(chain.meta["batch_size"])
    else:
        from ..profiles.profiler import profile_zoo

        cfg = _model_config(None, plan)
        dtype = getattr(args, "dtype", None) or "float32"
        print(f"profiling {args.model} (batch {batch_size}, {dtype}) on this machine ...")
        chain = profile_zoo(args.model, batch_size, dtype=dtype, **cfg)
    cfg = _model_config(chain, plan)
    platform = Platform(plan.devices, memory=plan.memory_limit,
                        bandwidth=getattr(args, "bandwidth", None) or math.inf,
                        latency=getattr(args, "latency", 0.0) or 0.0,
                        weight_factor=getattr(args, "weight_factor", 1.0) or 1.0,
                        weights=getattr(args, "weights", None) or "stash")
    if getattr(args, "replay", False):
        return _replay(plan, chain, platform, args.model, batch_size, args.steps, cfg, Path(args.out))
    summary = run_and_compare(plan, chain, platform, args.model, batch_size, args.steps, model_config=cfg,
                              backend=args.backend, out=args.out)
    print(format_comparison(summary))
    print(f"wrote {Path(args.out) / 'summary.json'} and the traces beside it")
    return 0
