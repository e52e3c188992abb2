"""A layout run against its prediction: every rank's predicted and measured peak, the gradient check.

``summary.json`` of a layout run holds, besides what ran (model, layout, micro-batches, optimizer, wall time):

* ``memory_predicted`` and ``memory_measured``: one number per rank of the layout (rank order, the mesh's),
  ``memory_error`` (measured / predicted - 1) and ``prediction`` (where the predictions come from,
  :func:`predict_rank_memory`);
* ``ranks``: per rank its (pp, dp, tp) coordinates, the peak's parts (``memory_breakdown``, the tracker's
  categories) and the collectives' buffers it held at the peak (``collectives``);
* ``max_grad_error`` (relative to the largest gradient) and ``max_grad_error_abs`` against one process
  (:func:`~workbench.runtime.gradients.reference_gradients`), ``grad_tolerance``, and for every tied parameter
  whether its copies on several pipeline ranks are equal (``tied_copies_equal``).

>>> fmt_rank = {"rank": 1, "coords": [0, 1, 0], "memory_predicted": 1e6, "memory_measured": 1.01e6,
...             "collectives": {"pipeline_receive": 4096}}
>>> rank_line(fmt_rank)
'  rank 1 (pp 0, dp 1, tp 0): predicted 976.56 KiB -> measured 986.33 KiB (+1.00%); collectives at the peak: \
pipeline_receive 4.00 KiB'
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

__all__ = ["predict_rank_memory", "summarise_layout", "format_layout_summary", "rank_line"]


def predict_rank_memory(plan, chain, platform, layout, rank: int, micro_batches: int) -> tuple[float, str]:
    """(the predicted peak of ``rank``, where it comes from).

    The layout model's per-rank peak where this build has it (``workbench.parallel.data.rank_memory``);
    else the plan's own per-rank peak when it lists one per rank of the layout; else the pipeline plan's
    memory of the rank's pipeline device with what torch's engine preallocates beside it
    (:func:`~workbench.runtime.summary.engine_extra`): the prediction for ``tp = dp = 1``, which ignores what
    tensor and data parallelism change.
    """
    try:
        from workbench.parallel.data import rank_memory
    except ImportError:
        rank_memory = None
    if rank_memory is not None and chain is not None and platform is not None:
        return float(rank_memory(plan, chain, platform, layout, rank)), "rank_memory (the layout model)"
    if len(plan.memory) == layout.devices and layout.devices > layout.pp:
        return float(plan.memory[rank]), "the plan's per-rank memory"
    from workbench.runtime.summary import engine_extra

    pp = layout.coords(rank)[0]
    extra = engine_extra(plan, chain, platform, micro_batches, "torch") if chain is not None else [0.0] * (pp + 1)
    return float(plan.memory[pp]) + float(extra[pp]), ("the pipeline plan's memory of the rank's stage (a tp=1, "
                                                        "dp=1 prediction: this build has no layout memory model)")


def summarise_layout(plan, layout, chain, platform, wl, parts: Sequence[dict[str, Any]], *, micro_batches: int,
                     grad_errors: tuple[float, float], meta: dict[str, Any]) -> dict[str, Any]:
    """The summary's fields (see the module docstring); ``parts`` the ranks' results in rank order."""
    from workbench.runtime.gradients import grad_tolerance

    predicted, sources = zip(*(predict_rank_memory(plan, chain, platform, layout, p["rank"], micro_batches)
                               for p in parts))
    measured = [float(p["memory_peak"]) for p in parts]
    ranks = [{"rank": p["rank"], "coords": list(p["coords"]), "memory_predicted": pr, "memory_measured": m,
              "memory_breakdown": p["memory_breakdown"], "collectives": p["collectives"],
              "step_seconds": p["step_seconds"]} for p, pr, m in zip(parts, predicted, measured)]
    return {
        "model": wl.name, "module": wl.source, "batch_size": wl.batch_size, "dtype": wl.dtype,
        "parallel": layout.to_dict(), "layout": layout.describe(), "devices": layout.devices,
        "micro_batches": micro_batches, "schedule": plan.schedule, "assignment": list(plan.assignment),
        **meta,
        "memory_predicted": list(predicted), "memory_measured": measured,
        "memory_error": [m / p - 1 if p > 0 else math.nan for m, p in zip(measured, predicted)],
        "prediction": sorted(set(sources)),
        "ranks": ranks,
        "max_grad_error": grad_errors[1], "max_grad_error_abs": grad_errors[0],
        "grad_tolerance": grad_tolerance(wl.dtype),
        "tied_copies_equal": tied_copies_equal(parts),
        "cpu_count": os.cpu_count(), "ranks_over_cores": layout.devices > (os.cpu_count() or 1),
    }


def tied_copies_equal(parts: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Per tied parameter held on several ranks: whether every copy's weight and gradient are equal."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        for name, copy in (p.get("tied") or {}).items():
            seen.setdefault(name, []).append(copy)
    return {name: all(c["weight"].equal(copies[0]["weight"]) and c["grad"].equal(copies[0]["grad"])
                      for c in copies) for name, copies in seen.items()}


def rank_line(r: dict[str, Any]) -> str:
    """One rank's line of the table: coordinates, predicted -> measured peak, the collectives' buffers."""
    from workbench.model.units import format_bytes

    pp, dp, tp = r["coords"]
    pred, meas = r["memory_predicted"], r["memory_measured"]
    err = f"{meas / pred - 1:+.2%}" if pred > 0 else "n/a"
    held = ", ".join(f"{k} {format_bytes(v)}" for k, v in r.get("collectives", {}).items() if v) or "none"
    return (f"  rank {r['rank']} (pp {pp}, dp {dp}, tp {tp}): predicted {format_bytes(pred)} -> measured "
            f"{format_bytes(meas)} ({err}); collectives at the peak: {held}")


def _steps_said(summary: dict[str, Any]) -> str:
    """The mini-batches a replica ran, as optimizer steps of its micro-batches."""
    m, k = summary["micro_batches"], summary.get("optimizer_steps", 1)
    return f"{k * m} mini-batches ({k} optimizer step{'s' * (k > 1)} of {m} micro-batches)"


def format_layout_summary(summary: dict[str, Any]) -> str:
    """A human table: the layout, every rank's peak predicted against measured, the gradient check."""
    lines = [f"{summary['model']}: {summary['layout']} on {summary['devices']} processes "
             f"({summary.get('backend', 'gloo')}, {summary.get('device', 'cpu')}, {summary.get('dtype')}), "
             f"{_steps_said(summary)} per replica, {summary['schedule']} schedule, optimizer "
             f"{summary.get('optimizer')}; wall {summary.get('wall_seconds', math.nan):.1f} s"]
    lines += [rank_line(r) for r in summary["ranks"]]
    lines.append(f"  predictions: {'; '.join(summary['prediction'])}")
    err = summary["max_grad_error"]
    if err is None or (isinstance(err, float) and math.isnan(err)):
        lines.append("  gradients: not checked against one process")
    else:
        lines.append(f"  max gradient error (lr 0, vs one process): {err:.3g} (relative; rounding bound "
                     f"{summary['grad_tolerance']:.3g})")
    for name, same in summary.get("tied_copies_equal", {}).items():
        lines.append(f"  tied {name}: copies on the pipeline ranks {'equal' if same else 'DIFFER'}")
    if summary.get("ranks_over_cores"):
        lines.append(f"  note: {summary['devices']} ranks shared {summary['cpu_count']} cores: times mean little")
    return "\n".join(lines)
