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

from workbench.model.memory_views import torch_engine_memory
from workbench.schedules.order_memory import engine_extra as torch_extra
from workbench.schedules.program import optimizer_steps
from workbench.schedules.registry import schedule_of

__all__ = ["summarise", "jsonable", "format_comparison", "steady_steps", "engine_extra", "default_steps",
           "steps_per_update"]


def steady_steps(plan, engine: str) -> list[int]:
    """Per device, the mini-batches a run needs before it holds what the plan's memory describes (its steady
    state): on the PipeDream engine with stashing, ``2k - 1`` for a stage with k in flight (the k in flight
    then ran their forwards on k different weight versions); otherwise ``k + 1`` (k in flight after the
    stage's first backward, when its gradients exist). 1 for a device without a stage. A flushed plan holds
    at every flush what its memory describes: one flush (its micro-batches) on every device.

    >>> from workbench.model.plan import Plan, Stage
    >>> p = Plan(1.0, (0, 1), (Stage(0, 0, 0, 0.0, 3.0, 4), Stage(1, 1, 1, 1.0, 2.0, 1)), 2)
    >>> steady_steps(p, "pipedream"), steady_steps(p, "torch")
    ([7, 1], [5, 2])
    >>> steady_steps(p.with_(schedule="1f1b", micro_batches=4), "torch")
    [4, 4]
    """
    if schedule_of(plan.schedule).flushed:
        return [int(plan.micro_batches or 1)] * plan.devices
    need = [1] * plan.devices
    for st in plan.stages:
        k = max(int(st.in_flight), 1)
        need[st.device] = max(need[st.device], 2 * k - 1 if engine == "pipedream" else k + 1)
    return need


def steps_per_update(plan, steps: int, engine: str) -> tuple[int, int]:
    """(optimizer steps, mini-batches per step) of a run of ``steps`` mini-batches: on torch's engine a flushed
    plan's flushes of its micro-batches, a periodic plan's one step of them all; on the PipeDream engine a step
    after every mini-batch (whatever the plan's schedule).

    >>> from workbench.model.plan import Plan
    >>> p = Plan(1.0, (0,), (), 1)
    >>> steps_per_update(p.with_(schedule="1f1b", micro_batches=4), 8, "torch"), steps_per_update(p, 8, "torch")
    ((2, 4), (1, 8))
    >>> steps_per_update(p.with_(schedule="1f1b", micro_batches=4), 8, "pipedream")
    (8, 1)
    """
    if engine == "torch":
        return optimizer_steps(plan, steps)
    return steps, 1


def default_steps(plan, engine: str, least: int = 20) -> int:
    """The mini-batches a run takes when not told: at least ``least`` and the steady state
    (:func:`steady_steps`); for a flushed plan whole optimizer steps of its micro-batches.

    >>> from workbench.model.plan import Plan, Stage
    >>> p = Plan(1.0, (0,), (Stage(0, 0, 0, 0.0, 1.0, 1),), 1)
    >>> default_steps(p, "torch"), default_steps(p.with_(schedule="gpipe", micro_batches=6), "torch")
    (20, 24)
    """
    need = max([least] + steady_steps(plan, engine))
    if schedule_of(plan.schedule).flushed:
        m = int(plan.micro_batches or 1)
        return m * math.ceil(need / m)
    return need


def engine_extra(plan, chain, platform, steps: int, engine: str) -> list[float]:
    """Per device, what the engine holds beyond the plan's memory: on torch's engine, a periodic plan's peak as
    torch runs it, one step of ``steps`` micro-batches (:func:`~workbench.model.memory_views.torch_engine_memory`),
    less the plan's memory; for a flushed plan what torch preallocates and holds
    (:func:`workbench.schedules.order_memory.engine_extra`); nothing on the PipeDream engine, which runs
    the plan's own loop."""
    if engine != "torch":
        return [0.0] * plan.devices
    if not schedule_of(plan.schedule).flushed and platform is not None and platform.setup.memory_model == "full":
        from workbench.model.activations import apply_policies

        peak = torch_engine_memory(apply_policies(chain, plan.activations or None), platform, plan.stages, steps)
        return [p - float(m) for p, m in zip(peak, plan.memory)]
    return torch_extra(plan, chain, platform, optimizer_steps(plan, steps)[1])    # one step's micro-batches


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
        "steps": steps, **dict(zip(("optimizer_steps", "mini_batches_per_step"),
                                   steps_per_update(plan, steps, res.meta["engine"]))), "dtype": wl.dtype,
        "devices": plan.devices, "assignment": list(plan.assignment), "allocation": plan.allocation,
        "weights": platform.setup.weights, "backend": res.meta["backend"], "device": res.meta["device"],
        "engine": res.meta["engine"], "optimizer": res.meta["optimizer"],
        "zero_grad": res.meta.get("zero_grad", getattr(platform, "zero_grad", None)),
        "precision": (plan.setup or {}).get("precision"),
    }


def _period_and_memory_fields(plan, chain, platform, res, cmp, steps: int) -> dict[str, Any]:
    """The period and the per-device memory, predicted (plan, plus what torch's engine holds beyond it:
    :func:`engine_extra`) against measured, and whether each rank ran long enough to reach the steady state
    the prediction describes (:func:`steady_steps`)."""
    extra = engine_extra(plan, chain, platform, steps, res.meta["engine"])
    predicted = [float(m) + e for m, e in zip(plan.memory, extra)]
    measured = [float(m) for m in cmp["measured_memory"]]
    need = steady_steps(plan, res.meta["engine"])
    return {
        "predicted_period": plan.period, "measured_period": cmp.attrs["measured_period"],
        "period_error": cmp.attrs["period_error"],
        "memory_plan": [float(m) for m in plan.memory],
        "memory_engine_extra": extra,
        "memory_predicted": predicted,
        "memory_measured": measured,
        "memory_error": [m / p - 1 if p > 0 else math.nan for m, p in zip(measured, predicted)],
        "memory_breakdown": res.meta.get("memory_breakdown"),
        "steady_state_steps": need,
        "steady_state": [steps >= n for n in need],
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


def _updates(summary: dict[str, Any]) -> str:
    """How the run's mini-batches made optimizer steps, for the table's first line.

    >>> _updates({"optimizer_steps": 2, "mini_batches_per_step": 4}), _updates({"optimizer_steps": 1,
    ...                                                                         "mini_batches_per_step": 4})
    (' (2 optimizer steps of 4)', ' (one optimizer step)')
    """
    k, m = summary.get("optimizer_steps"), summary.get("mini_batches_per_step")
    if not k:
        return ""
    if k == 1:
        return " (one optimizer step)"
    return f" ({k} optimizer steps of {m})" if m > 1 else " (an optimizer step after each)"


def format_comparison(summary: dict[str, Any]) -> str:
    """A human table: period and per-device memory and busy time, predicted against measured."""
    from workbench.model.units import format_bytes

    lines = [
        f"{summary['model']}: {summary['steps']} mini-batches of {summary['batch_size']}{_updates(summary)} on "
        f"{summary['devices']} "
        f"processes ({summary['backend']}, {summary['device']}, {summary.get('dtype', 'float32')}), "
        f"weights {summary['weights']}, {summary.get('engine', '?')} engine, optimizer "
        f"{summary.get('optimizer', '?')}, zero_grad {summary.get('zero_grad', '?')}",
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
        if summary.get("steady_state") and not summary["steady_state"][d]:
            lines.append(f"    device {d} did NOT reach the steady state the prediction describes: it needs "
                         f"{summary['steady_state_steps'][d]} mini-batches, the run had {summary['steps']} "
                         "(its measured peak is below what a longer run holds)")
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
