"""Predicted against measured: per-device busy time and memory, per-stage times, and calibration.

The prediction of a periodic plan is its period ``T``, each device's load
(the sum of ``F_s + B_s`` over its stages: the busy time per mini-batch) and
its memory (rule 7). A measured trace gives the same three: the steady
spacing of the first stage's forwards, the mean busy time per mini-batch
and the peak memory. Warm-up mini-batches (the first quarter unless told)
are left out of the time averages.

The steady window starts after the warm-up: the first quarter of the
mini-batches, and at least the ``k_0`` forwards the first stage runs back to
back before its next one waits for a backward (k_0: the most mini-batches in
flight on a stage); counting those in made short runs look faster than they
were.

**Calibration** (re-profile, then re-plan): :func:`calibrate` scales every
layer's forward (backward) time by the ratio measured/predicted of its
stage's forward (backward), which keeps the profile's shape inside a stage
and corrects what running in a pipeline changes (other processes on the
same cores, cache effects, the loss on the last stage, dispatch overhead).
The measured time of a stage is its *mean* duration over the steady window:
the period is set by the total time a device spends, and a median would
leave out exactly the operations that time-sharing stretched, so the
calibrated prediction would stay below the measured busy times. Re-scheduling the same allocation on the calibrated
chain gives a new predicted period; :func:`calibration_report` says how much
closer it is, and says so when it is not closer.

**When a measurement is not meaningful** (:func:`measurement_warnings`): more
ranks than cores or a load above the core count (ranks take turns, and the
waits that follow are in no model of one device per rank), a rank that got
less than ``MIN_CORE_SHARE`` of a core, a device busy longer than the
measured period (the window is not steady), too few steady mini-batches (a
periodic plan's: a flushed plan's every flush is its whole schedule), or a
plan the checker rejects on this chain (it was made on another profile).

>>> import pandas as pd
>>> rel_error(1.1, 1.0)
0.1
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.trace import Trace
from workbench.schedules.registry import schedule_of

__all__ = ["rel_error", "occupancy", "stage_times", "compare", "calibrate", "calibration_report", "period_of",
           "steady_warmup", "measurement_warnings", "MIN_CORE_SHARE"]

#: a rank that got less of a core than this (CPU time / wall time of its operations) was time-shared
MIN_CORE_SHARE = 0.8


def rel_error(measured: float, predicted: float) -> float:
    """(measured - predicted) / predicted (signed; nan when predicted is 0)."""
    if predicted == 0:
        return math.nan
    return round((measured - predicted) / predicted, 12)


def steady_warmup(plan: Plan, trace: Trace, warmup: int | None = None) -> int:
    """Mini-batches to leave out as warm-up: ``warmup`` if given, else the first quarter and at
    least ``k_0`` (the forwards the first stage runs before one waits for a backward), leaving two; none for a
    flushed plan, whose every flush is the plan's whole schedule (its period: the flushes' spans).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.plan import make_plan
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(2)))
    >>> plan = make_plan(ch, Target.of(2), 3.0, [0, 1], [0.0, 1.0], [8.0, 2.0])   # k = 4, 1
    >>> from workbench.schedules.simulate import simulate
    >>> steady_warmup(plan, simulate(plan, ch, Target.of(2), batches=12))   # 12 // 4 = 3 < k_0
    4
    """
    ops = trace.ops
    n = int(ops["batch"].max()) + 1 if len(ops) else 0
    if warmup is not None:
        return int(warmup)
    if schedule_of(plan.schedule).flushed:
        return 0
    k0 = max((st.in_flight for st in plan.stages), default=1)
    return max(0, min(max(n // 4, k0), n - 2))


def _steady(ops: pd.DataFrame, warmup: int | None) -> pd.DataFrame:
    n = int(ops["batch"].max()) + 1 if len(ops) else 0
    w = n // 4 if warmup is None else warmup
    return ops[ops["batch"] >= min(w, max(n - 1, 0))]


def period_of(trace: Trace, warmup: int | None = None) -> float:
    """Measured period: the steady spacing of the first stage's forward starts."""
    return trace.steady_period(warmup)


def occupancy(trace: Trace) -> pd.DataFrame:
    """F/B rows with ``occupied``: from the op's start to the device's next F/B start, less recv waits between.

    That is the time the device is kept from other work by the op: its
    computation, the sends it posts, the bookkeeping after it (the last op
    of a device gets its own duration).
    """
    ops = trace.ops
    out = []
    for d, g in ops.groupby("device"):
        g = g.sort_values("start")
        comp = g[g["kind"].isin(COMPUTE)]
        recv = g[g["kind"] == "recv"]
        rs, re_ = recv["start"].to_numpy(), recv["end"].to_numpy()
        starts, ends = comp["start"].to_numpy(), comp["end"].to_numpy()
        occ = np.empty(len(comp))
        for j in range(len(comp)):
            if j + 1 < len(comp):
                nxt = starts[j + 1]
                between = (rs >= ends[j] - 1e-12) & (re_ <= nxt + 1e-12)
                occ[j] = nxt - starts[j] - float((re_[between] - rs[between]).sum())
            else:
                occ[j] = ends[j] - starts[j]
        c = comp.copy()
        c["occupied"] = occ
        out.append(c)
    return pd.concat(out) if out else ops.assign(occupied=[])


#: the compute kinds of a trace: forward, backward, and a backward's input- and weight-gradient parts
COMPUTE = ["F", "B", "I", "W"]


def _backward_per_batch(ops: pd.DataFrame) -> pd.DataFrame:
    """A stage's rows with each micro-batch's ``I`` and ``W`` (a zero-bubble schedule's backward in two parts)
    as one ``B`` row: its start, and its duration and occupancy the parts' sums."""
    split = ops[ops["kind"].isin(["I", "W"])]
    if split.empty:
        return ops
    parts = split.assign(dur=split["end"] - split["start"]).groupby("batch")
    merged = parts.agg(start=("start", "min"), dur=("dur", "sum"), **({"occupied": ("occupied", "sum")}
                                                                       if "occupied" in split else {}))
    rows = merged.reset_index().assign(kind="B", end=lambda d: d["start"] + d["dur"]).drop(columns="dur")
    return pd.concat([ops[~ops["kind"].isin(["I", "W"])], rows], ignore_index=True)


def stage_times(plan: Plan, chain: Chain, trace: Trace, warmup: int | None = None) -> pd.DataFrame:
    """Per stage: predicted forward/backward (s), the median and mean measured ones and the mean
    occupied ones, over the steady window (:func:`steady_warmup`)."""
    ops = _steady(occupancy(trace), steady_warmup(plan, trace, warmup))
    rows = []
    for s, st in enumerate(plan.stages):
        c = chain.stage_costs(st.first, st.last)
        mine = _backward_per_batch(ops[ops["stage"] == s])
        dur = mine["end"] - mine["start"]
        isf, isb = mine["kind"] == "F", mine["kind"] == "B"
        mf = float(dur[isf].median()) if isf.any() else math.nan
        mb = float(dur[isb].median()) if isb.any() else math.nan
        rows.append({"stage": s, "device": st.device, "first": st.first, "last": st.last,
                     "predicted_forward": c.forward, "measured_forward": mf,
                     "predicted_backward": c.backward, "measured_backward": mb,
                     "mean_forward": float(dur[isf].mean()) if isf.any() else math.nan,
                     "mean_backward": float(dur[isb].mean()) if isb.any() else math.nan,
                     "forward_error": rel_error(mf, c.forward), "backward_error": rel_error(mb, c.backward),
                     "occupied_forward": float(mine["occupied"][isf].mean()) if isf.any() else math.nan,
                     "occupied_backward": float(mine["occupied"][isb].mean()) if isb.any() else math.nan})
    return pd.DataFrame(rows)


def compare(plan: Plan, chain: Chain, platform: Target, trace: Trace, warmup: int | None = None,
            cpu: pd.DataFrame | None = None, *, cores: int | None = None, load: float | None = None) -> pd.DataFrame:
    """Per device: predicted/measured busy time per mini-batch, memory, and their relative errors.

    Measured time per mini-batch is split into ``measured_busy`` (F and B),
    ``measured_send`` (posting sends: gloo copies on the caller's thread),
    ``measured_recv_wait`` (waiting for data) and ``measured_other`` (the rest
    of the period: bookkeeping, scheduling by the OS). With ``cpu`` (the
    runtime's per-op CPU times, ``RunResult.meta["cpu"]``, default
    ``trace.meta["cpu"]``): ``measured_cpu_busy`` and ``core_share`` =
    CPU / wall time of the F/B ops (below 1 when ranks share cores).
    ``measured_memory`` is the runtime's peak (``trace.meta["memory_peak"]``, allocator level:
    docs/model.md "Runtime"), else the peak of the trace's memory rows.

    ``df.attrs`` holds ``predicted_period``, ``measured_period``, ``period_error`` and
    ``warnings`` (:func:`measurement_warnings`; ``cores`` and ``load`` describe the machine of a
    CPU run, when known).
    """
    warmup = steady_warmup(plan, trace, warmup)
    allops = _steady(trace.ops, warmup)
    ops = allops[allops["kind"].isin(COMPUTE)]
    nb = ops["batch"].nunique() if len(ops) else 0
    peak = trace.meta.get("memory_peak") or trace.peak_memory()   # the runtime's allocator-level peak per rank
    mp = period_of(trace, warmup)
    rows = []
    for d in range(plan.devices):
        pred_busy = sum(chain.stage_costs(st.first, st.last).compute for st in plan.stages if st.device == d)
        mine = ops[ops["device"] == d]
        meas_busy = float((mine["end"] - mine["start"]).sum() / nb) if nb else math.nan
        pm = plan.memory[d] if d < len(plan.memory) else math.nan
        mm = float(peak[d]) if d < len(peak) else math.nan
        comm = allops[allops["device"] == d]
        per_mb = lambda k: float((comm[comm["kind"] == k]["end"] - comm[comm["kind"] == k]["start"]).sum() / nb) \
            if nb else math.nan  # noqa: E731
        send, recv = per_mb("send"), per_mb("recv")
        rows.append({"device": d, "stages": ",".join(str(s) for s, st in enumerate(plan.stages) if st.device == d),
                     "predicted_busy": pred_busy, "measured_busy": meas_busy,
                     "busy_error": rel_error(meas_busy, pred_busy),
                     "measured_send": send, "measured_recv_wait": recv,
                     "measured_other": mp - meas_busy - send - recv,
                     "predicted_memory": pm, "measured_memory": mm, "memory_error": rel_error(mm, pm)})
    df = pd.DataFrame(rows)
    cpu = cpu if cpu is not None else trace.meta.get("cpu")
    if cpu is not None and len(cpu):
        if "kind" in cpu.columns:      # a step's CPU time is inside its B's
            cpu = cpu[cpu["kind"].isin(COMPUTE)]
        c = _steady(cpu, warmup)
        per_dev = c.groupby("device")["cpu"].sum() / max(nb, 1)
        df["measured_cpu_busy"] = [float(per_dev.get(d, math.nan)) for d in df["device"]]
        df["cpu_busy_error"] = [rel_error(m, p) for m, p in zip(df["measured_cpu_busy"], df["predicted_busy"])]
        df["core_share"] = df["measured_cpu_busy"] / df["measured_busy"]
    df.attrs.update(predicted_period=plan.period, measured_period=mp, period_error=rel_error(mp, plan.period))
    df.attrs["warnings"] = measurement_warnings(plan, chain, platform, trace, df, warmup=warmup, cores=cores,
                                                load=load)
    return df


def measurement_warnings(plan: Plan, chain: Chain, platform: Target, trace: Trace, per_device: pd.DataFrame,
                         *, warmup: int, cores: int | None = None, load: float | None = None) -> list[str]:
    """Why the measured times cannot test the prediction (empty: nothing found); see the module doc.
    ``per_device``: :func:`compare`'s rows."""
    out: list[str] = []
    ranks = plan.devices
    if cores is not None and ranks > cores:
        out.append(f"{ranks} ranks share {cores} cores: they take turns, and the waits that follow are in no "
                   f"model of one device per rank")
    if cores is not None and load is not None and load > cores:
        out.append(f"load average {load:.1f} on {cores} cores: other work competed with the ranks")
    if "core_share" in per_device:
        low = [(int(d), float(x)) for d, x in zip(per_device["device"], per_device["core_share"])
               if np.isfinite(x) and x < MIN_CORE_SHARE]
        if low:
            out.append("time-shared ranks (CPU time / wall time of their operations): "
                       + ", ".join(f"device {d} {x:.0%}" for d, x in low))
    mp = per_device.attrs.get("measured_period", math.nan) if hasattr(per_device, "attrs") else math.nan
    over = [(int(d), float(b)) for d, b in zip(per_device["device"], per_device["measured_busy"])
            if np.isfinite(b) and np.isfinite(mp) and b > mp * 1.02]
    if over:
        out.append(f"busier than the measured period ({mp * 1e3:.3f} ms): "
                   + ", ".join(f"device {d} {b * 1e3:.3f} ms" for d, b in over)
                   + "; the window is not steady (run more mini-batches)")
    n = int(trace.ops["batch"].max()) + 1 if len(trace.ops) else 0
    k0 = max((st.in_flight for st in plan.stages), default=1)
    if n - warmup < max(4, 2 * k0) and not schedule_of(plan.schedule).flushed:
        out.append(f"only {n - warmup} steady mini-batches after {warmup} of warm-up (k_0 = {k0}); "
                   f"run at least {warmup + max(4, 2 * k0)}")
    from workbench.verify.check import check

    bad = check(plan, chain, platform)
    if bad:
        out.append(f"the plan is not valid on this profile ({bad[0]}): it was made on another one, so its "
                   f"period is not this chain's prediction")
    return out


def calibrate(chain: Chain, plan: Plan, trace: Trace, warmup: int | None = None, basis: str = "compute") -> Chain:
    """The chain with each layer's times scaled by measured/predicted of its stage (forward and backward apart).

    ``basis="compute"``: the mean measured F/B durations over the steady window (re-profiling
    in place; the mean, since the period is set by a device's total time); ``basis="occupied"``:
    the mean time each op keeps its device busy, sends and bookkeeping included (see
    :func:`occupancy`).
    """
    if basis not in ("compute", "occupied"):
        raise ValueError(f"basis must be 'compute' or 'occupied', got {basis!r}")
    st = stage_times(plan, chain, trace, warmup)
    layers = list(chain.layers)
    for r in st.itertuples():
        mf, mb = (r.mean_forward, r.mean_backward) if basis == "compute" else (r.occupied_forward,
                                                                                 r.occupied_backward)
        kf = mf / r.predicted_forward if r.predicted_forward > 0 and np.isfinite(mf) else 1.0
        kb = mb / r.predicted_backward if r.predicted_backward > 0 and np.isfinite(mb) else 1.0
        for l in range(r.first, r.last + 1):
            w = layers[l].backward_weight
            layers[l] = replace(layers[l], forward=layers[l].forward * kf, backward=layers[l].backward * kb,
                                backward_weight=None if w is None else w * kb)
    return replace(chain, layers=tuple(layers), meta={**chain.meta, "calibrated_from": trace.source})


def calibration_report(plan: Plan, chain: Chain, platform: Target, trace: Trace,
                       warmup: int | None = None, replan: bool = True,
                       replan_time_limit: float = 30.0) -> dict[str, float]:
    """Predicted period before and after calibration (same allocation, re-scheduled) against the measurement.

    With ``replan`` it also re-plans from scratch on the calibrated chain
    with the plan's method (``replanned_period``, ``replanned_assignment``;
    the ILP within ``replan_time_limit`` seconds): that plan is a
    prediction to be run and measured again (the loop of the notebook).
    ``calibration_helps`` is False when the calibrated prediction is further from the measurement
    than the plan's own (then compute times are not what set the measured period: links, waits,
    time-sharing), and ``note`` says so.
    """
    from workbench.schedules.builder import best_schedule

    warmup = steady_warmup(plan, trace, warmup)
    measured = period_of(trace, warmup)
    cal = calibrate(chain, plan, trace, warmup)
    cal_plan = best_schedule(cal, platform, plan.assignment)
    occ_plan = best_schedule(calibrate(chain, plan, trace, warmup, basis="occupied"), platform, plan.assignment)
    out: dict[str, float] = {
        "measured_period": measured,
        "predicted_period": plan.period,
        "error_before": rel_error(measured, plan.period),
        "calibrated_period": cal_plan.period,
        "error_after": rel_error(measured, cal_plan.period),
        "calibrated_occupied_period": occ_plan.period,
        "error_after_occupied": rel_error(measured, occ_plan.period),
    }
    helps = abs(out["error_after"]) <= abs(out["error_before"]) or not np.isfinite(out["error_before"])
    out["calibration_helps"] = bool(helps)  # type: ignore[assignment]
    if not helps:
        out["note"] = ("the calibrated prediction is further from the measurement than the plan's: compute "  # type: ignore[assignment]
                       "times are not what set the measured period (links, waits or time-sharing do)")
    if not replan:
        return out
    try:
        from workbench.planners import plan as run_planner

        method = plan.method or "dp"
        limit = {"time_limit": replan_time_limit} if method == "ilp" else {}
        re = run_planner(cal, platform, method, allocation=plan.allocation, **limit)
        if re.feasible:
            out["replanned_period"] = re.period
            out["replanned_assignment"] = list(re.assignment)  # type: ignore[assignment]
    except Exception as e:  # a planner missing or failing must not hide the calibration itself
        out["replan_error"] = repr(e)  # type: ignore[assignment]
    return out
