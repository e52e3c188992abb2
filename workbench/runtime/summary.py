"""The summary of a run against its prediction: its fields (what ``summary.json`` holds) and a human table.

:func:`summarise` gathers, per section, what ran (model, sizes, plan,
engine), the period and the per-device memory predicted against measured
(the plan's memory plus, on torch's engine, what it preallocates:
:func:`workbench.model.memory_views.torch_engine_extra`), the busy times, the gradient
check, notes (calibration, warnings) and the machine (load, cores);
:func:`jsonable` makes it JSON; :func:`format_comparison` prints it. The keys
are listed in :mod:`~workbench.front.running`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from workbench.model.order_memory import engine_extra as torch_extra

__all__ = ["summarise", "jsonable", "format_comparison"]


def summarise(plan, chain, platform, wl, res, cmp, cal: dict[str, Any], *, model_config: dict[str, Any],
              batch_size: int, steps: int, grad_errors: tuple[float, float], dropout: list[str],
              cores: int) -> dict[str, Any]:
    """The summary's fields, in ``summary.json``'s order: ``grad_errors`` is (absolute, relative) against
    one process (NaN when not checked), ``dropout`` the model's random layers, ``cores`` those the run had."""
    from workbench.runtime.gradients import grad_tolerance

    return {
        **_run_fields(plan, platform, wl, res, model_config, batch_size, steps),
        **_period_and_memory_fields(plan, chain, platform, res, cmp, steps),
        **_busy_fields(cmp),
        "max_grad_error": grad_errors[1], "max_grad_error_abs": grad_errors[0],
        "grad_tolerance": grad_tolerance(wl.dtype),
        "dropout": dropout,
        **_notes_fields(chain, res, cmp, cal),
        **_machine_fields(plan, cores),
    }


def _run_fields(plan, platform, wl, res, cfg: dict[str, Any], batch_size: int, steps: int) -> dict[str, Any]:
    """The summary's keys saying what ran: model, sizes, plan, weights, backend, engine, optimizer."""
    return {
        "model": wl.name, "module": wl.source, "model_config": cfg, "batch_size": wl.batch_size or batch_size,
        "steps": steps, "dtype": wl.dtype,
        "devices": plan.devices, "assignment": list(plan.assignment), "allocation": plan.allocation,
        "weights": platform.weights, "backend": res.meta["backend"], "device": res.meta["device"],
        "engine": res.meta["engine"], "optimizer": res.meta["optimizer"],
    }


def _period_and_memory_fields(plan, chain, platform, res, cmp, steps: int) -> dict[str, Any]:
    """The period and the per-device memory, predicted (plan, plus what torch's engine preallocates:
    a receive buffer per micro-batch and the step's whole input) against measured."""
    engine_extra = (torch_extra(plan, chain, platform, steps) if res.meta["engine"] == "torch"
                    else [0.0] * plan.devices)
    predicted = [float(m) + e for m, e in zip(plan.memory, engine_extra)]
    measured = [float(m) for m in cmp["measured_memory"]]
    return {
        "predicted_period": plan.period, "measured_period": cmp.attrs["measured_period"],
        "period_error": cmp.attrs["period_error"],
        "memory_plan": [float(m) for m in plan.memory],
        "memory_engine_extra": engine_extra,
        "memory_predicted": predicted,
        "memory_measured": measured,
        "memory_error": [m / p - 1 if p > 0 else math.nan for m, p in zip(measured, predicted)],
        "memory_breakdown": res.meta.get("memory_breakdown"),
    }


def _busy_fields(cmp) -> dict[str, Any]:
    """Per-device busy time, predicted against measured (and the CPU time and core share on CPUs)."""
    return {
        "busy_predicted": [float(b) for b in cmp["predicted_busy"]],
        "busy_measured": [float(b) for b in cmp["measured_busy"]],
        "busy_error": [float(e) for e in cmp["busy_error"]],
        "cpu_busy_measured": [float(b) for b in cmp["measured_cpu_busy"]] if "measured_cpu_busy" in cmp else None,
        "core_share": [float(b) for b in cmp["core_share"]] if "core_share" in cmp else None,
    }


def _notes_fields(chain, res, cmp, cal: dict[str, Any]) -> dict[str, Any]:
    """Calibration, warnings, the allocator's own peak, wall time, the profile's device, tied parameters."""
    return {
        "calibration": cal,
        "warnings": list(cmp.attrs.get("warnings", [])),
        "meaningful": not cmp.attrs.get("warnings"),
        "max_memory_allocated": res.meta.get("max_memory_allocated"),
        "wall_seconds": res.meta.get("wall_seconds"),
        "profile_device": chain.meta.get("device", ""),
        "tied": json.loads(chain.meta["tied"]) if chain.meta.get("tied") else [],
    }


def _machine_fields(plan, cores: int) -> dict[str, Any]:
    """The load, CPU count and cores the run had, and whether its ranks outnumbered the cores."""
    return {
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_count": os.cpu_count(), "cores": cores, "ranks_over_cores": plan.devices > cores,
    }


def jsonable(x: Any) -> Any:
    """``x`` with tuples as lists, keys as strings, non-finite floats as None and tensors or numpy scalars
    as Python numbers: what ``json.dumps`` takes.

    >>> jsonable({1: (float("nan"), 2.5)})
    {'1': [None, 2.5]}
    """
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    return x


def format_comparison(summary: dict[str, Any]) -> str:
    """A human table: period and per-device memory and busy time, predicted against measured."""
    from workbench.model.units import format_bytes

    lines = [
        f"{summary['model']}: {summary['steps']} mini-batches of {summary['batch_size']} on {summary['devices']} "
        f"processes ({summary['backend']}, {summary['device']}, {summary.get('dtype', 'float32')}), "
        f"weights {summary['weights']}, {summary.get('engine', '?')} engine, optimizer {summary.get('optimizer', '?')}",
        f"  period     predicted {summary['predicted_period'] * 1e3:9.3f} ms   measured "
        f"{summary['measured_period'] * 1e3:9.3f} ms   error {summary['period_error']:+.1%}",
    ]
    for d in range(summary["devices"]):
        lines.append(
            f"  device {d}: memory (model -> allocator peak) {format_bytes(summary['memory_predicted'][d]):>10} -> "
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
    err = summary["max_grad_error"]
    if err is None or (isinstance(err, float) and math.isnan(err)):
        lines.append("  gradients: not checked against one process (run checks them with a learning rate of 0; "
                     "under torchrun, --check-grads)")
    else:
        lines.append(f"  max gradient error (lr 0, vs one process): {err:.3g} (relative; rounding "
                     f"bound {summary.get('grad_tolerance', math.nan):.3g})"
                     + ("; not a check: the model has dropout" if summary.get("dropout") else ""))
    if summary.get("ranks_over_cores"):
        lines.append(f"  note: {summary['devices']} ranks shared {summary['cores']} cores: the times above mean little")
    return "\n".join(lines)
