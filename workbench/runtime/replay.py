"""Replay each device of a plan alone: its compute time and real memory, without the other devices.

:func:`replay_devices` runs every device's program (the same order, the
same in-flight mini-batches and weight versions as :func:`~workbench.runtime.engine.run_plan`)
in a process of its own, one device after the other, with no process
group: a message the device would receive is a fresh random tensor of the
right shape, ready at once, and a message it would send is dropped. What
is measured is then the device by itself: the time of its forwards and
backwards when nothing else shares the processor (on one GPU, the only way
to time a plan's devices one by one) and its memory at allocator level
(:class:`~workbench.runtime.rank.MemoryProbe`: ``MemTracker`` on CPU,
``torch.cuda.max_memory_allocated`` on a GPU), which holds what rule 7 leaves
out too: receive buffers, gradient buffers, optimizer state, the outputs kept
for the backward, temporaries. The replay runs the PipeDream engine
(:mod:`~workbench.runtime.pipedream`) whatever engine a shared run would use.

:func:`replay_report` puts the three beside the plan's prediction, one row
per device.

>>> from workbench.model.target import Target
>>> from workbench.profiles.profiler import profile_zoo
>>> from workbench.schedules.builder import best_schedule
>>> chain = profile_zoo("mlp", 4, repeats=1, warmup=0)
>>> plan = best_schedule(chain, Target.of(2, memory_model="paper"), [0, 0, 0, 1, 1])
>>> res = replay_devices(plan, Workload.zoo("mlp", 4), steps=4, device="cpu")
>>> sorted(set(res.trace.ops["kind"])), list(replay_report(plan, chain, res)["device"])
(['B', 'F', 'step'], [0, 1])
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from workbench.model.plan import Plan
from workbench.runtime.config import RunConfig
from workbench.runtime.engine import RunResult, Workload, join_or_kill, merge_results, refuse_split_backward
from workbench.runtime.rank import CPU_COLUMNS
from workbench.schedules.ops import Op
from workbench.schedules.program import programs_for

__all__ = ["replay_devices", "replay_report", "replay_to", "load_replays", "run_summary"]


def replay_devices(plan: Plan, workload: Workload, steps: int = 8, *, weights: str = "stash",
                   device: str | None = None, threads: int = 1, timeout: float = 300.0,
                   programs: list[list[Op]] | None = None, chain=None, platform=None,
                   devices: list[int] | None = None, optimizer: str = "adam", zero_grad: str = "none") -> RunResult:
    """Run each device's program alone (one process per device, in turn); a measured :class:`RunResult`.

    ``devices`` restricts the replay to some devices. Every device's clock
    starts at its own first operation; ``meta["isolated"]`` is True and
    ``meta["max_memory_allocated"]`` holds the allocator's peak per device
    (None on CPU). Gradients are not meaningful (the inputs are random).
    """
    if not plan.feasible or not plan.stages:
        raise ValueError("cannot replay an infeasible plan")
    refuse_split_backward(plan, "a replay (the PipeDream engine, each device alone)")
    if weights not in ("stash", "single"):
        raise ValueError(f"weights must be 'stash' or 'single', got {weights!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    which = list(range(plan.devices)) if devices is None else list(devices)
    bad = [d for d in which if not 0 <= d < plan.devices]
    if bad:
        raise ValueError(f"devices {bad} are not devices of the plan (0..{plan.devices - 1})")
    progs = programs if programs is not None else programs_for(plan, steps)
    cfg = RunConfig(plan, progs, workload, steps, 0.0, weights, "none", device, threads, timeout, isolated=True,
                    optimizer=optimizer, zero_grad=zero_grad)
    start_method = "spawn" if device == "cuda" else "fork"
    import torch.multiprocessing as mp

    from workbench.runtime.worker import isolated_entry

    t_start = time.monotonic()
    parts = []
    with tempfile.TemporaryDirectory(prefix="wb-replay-") as outdir:
        for d in which:
            ctx = mp.start_processes(isolated_entry, args=(d, cfg, outdir), nprocs=1, join=False,
                                     start_method=start_method)
            join_or_kill(ctx, timeout, f"the replay of device {d}")
            parts.append(torch.load(Path(outdir) / f"rank{d}.pt", weights_only=False))
    res = merge_results(parts, plan, steps=steps, weights=weights, backend="none", device=device,
                        world=plan.devices, threads=threads, isolated=True, replayed=which,
                        wall_seconds=time.monotonic() - t_start)
    # merge_results lists the allocator peaks of the replayed devices only: index them by device
    for key in ("max_memory_allocated", "memory_peak", "memory_breakdown"):
        by_device = {p["rank"]: p[key] for p in parts}
        res.meta[key] = res.trace.meta[key] = [by_device.get(d) for d in range(plan.devices)]
    return res


def replay_report(plan: Plan, chain, result: RunResult, warmup: int | None = None) -> pd.DataFrame:
    """Per replayed device: predicted and measured compute per mini-batch, rule-7 and allocator memory.

    Columns: ``device``, ``stages``, ``predicted_busy`` (the sum of the
    profile's F + B over the device's stages), ``measured_busy`` (mean over
    the steady mini-batches, the first quarter left out), ``busy_error``,
    ``predicted_memory`` (the plan's rule-7 memory), ``measured_memory``
    (the runtime's allocator-level peak), ``memory_error``, ``allocator_peak``
    (bytes, nan on CPU) and ``allocator_over_predicted`` (peak / predicted); and the forwards alone:
    ``predicted_forward``, ``measured_forward`` (wall) and ``forward_cpu`` (CPU time of the
    calling thread, ``time.thread_time``, per mini-batch). A forward runs on that thread entirely,
    so ``forward_cpu`` close to ``measured_forward`` means the GPU waited for the Python thread to
    launch its kernels (the forward is launch-bound); a backward runs in autograd's own threads,
    so its CPU time is not comparable and not reported.
    """
    from workbench.runtime.compare import _steady, rel_error

    ops = _steady(result.trace.ops, warmup)
    ops = ops[ops["kind"].isin(["F", "B"])]
    cpu = result.meta.get("cpu")
    if cpu is None or not len(cpu):
        cpu = pd.DataFrame(columns=CPU_COLUMNS)
    cpu = cpu[(cpu["kind"] == "F") & cpu["batch"].isin(set(ops["batch"]))]
    peak = [m if m is not None else math.nan for m in result.meta.get("memory_peak") or result.trace.peak_memory()]
    alloc = result.meta.get("max_memory_allocated") or [None] * plan.devices
    rows = []
    for d in result.meta.get("replayed", range(plan.devices)):
        mine = ops[ops["device"] == d]
        nb = mine["batch"].nunique()
        pred = sum(chain.stage_costs(st.first, st.last).compute for st in plan.stages if st.device == d)
        meas = float((mine["end"] - mine["start"]).sum() / nb) if nb else math.nan
        fwd = mine[mine["kind"] == "F"]
        pred_f = sum(chain.stage_costs(st.first, st.last).forward for st in plan.stages if st.device == d)
        meas_f = float((fwd["end"] - fwd["start"]).sum() / nb) if nb else math.nan
        cpu_f = float(cpu[cpu["device"] == d]["cpu"].sum() / nb) if nb and len(cpu) else math.nan
        pm, mm = float(plan.memory[d]), float(peak[d])
        a = float(alloc[d]) if alloc[d] is not None else math.nan
        rows.append({"device": d,
                     "stages": ",".join(str(s) for s, st in enumerate(plan.stages) if st.device == d),
                     "predicted_busy": pred, "measured_busy": meas, "busy_error": rel_error(meas, pred),
                     "predicted_memory": pm, "measured_memory": mm, "memory_error": rel_error(mm, pm),
                     "allocator_peak": a, "allocator_over_predicted": a / pm if pm > 0 else math.nan,
                     "predicted_forward": pred_f, "measured_forward": meas_f, "forward_cpu": cpu_f})
    return pd.DataFrame(rows)


def replay_to(out: str | Path, plan: Plan, chain, workload: Workload, steps: int = 8,
              **replay_kw) -> tuple[RunResult, pd.DataFrame]:
    """:func:`replay_devices` then :func:`replay_report`, written to ``out/replay.csv`` and
    ``out/replay_trace.csv`` (+ ``.memory.csv``); returns both."""
    from workbench.io import write_frame_atomic

    res = replay_devices(plan, workload, steps, chain=chain, **replay_kw)
    rep = replay_report(plan, chain, res)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_frame_atomic(out / "replay.csv", rep)
    res.trace.save(out / "replay_trace.csv")
    return res, rep


def load_replays(root: str | Path) -> pd.DataFrame:
    """Every ``root/runs/<run>/replay.csv`` (as ``scripts/gpu_validation.py`` writes them) in one frame.

    Adds ``run`` and ``memory_limit`` (from the run's ``plan.json``; inf
    without a limit) and ``allocator_over_limit`` (the allocator's peak over
    the limit, nan without one: above 1, the plan would not have fitted a GPU of that size).
    """
    import json

    frames = []
    for f in sorted(Path(root).glob("runs/*/replay.csv")):
        df = pd.read_csv(f)
        plan = json.loads((f.parent / "plan.json").read_text())
        limit = plan.get("memory_limit")
        limit = math.inf if limit is None else float(limit)
        frames.append(df.assign(run=f.parent.name, memory_limit=limit,
                                allocator_over_limit=df["allocator_peak"] / limit if math.isfinite(limit)
                                else math.nan))
    if not frames:
        raise FileNotFoundError(f"no runs/*/replay.csv under {root}")
    out = pd.concat(frames, ignore_index=True)
    return out[["run"] + [c for c in out.columns if c != "run"]]


def run_summary(root: str | Path) -> pd.DataFrame:
    """One row per run of a ``scripts/gpu_validation.py`` folder: the replays' worst cases beside the
    shared run's gradient check (indexed by ``run``; devices without a stage left out).

    Columns: ``dtype``, ``devices``, ``stages``, ``method``, ``memory_limit``,
    ``predicted_period``, ``busy_error_min`` / ``busy_error_max`` (signed, over devices),
    ``memory_error_max`` (the largest ``|runtime count / rule 7 - 1|``), ``memory_exact``
    (every device with one stage counted to the byte), ``allocator_over_predicted_min`` /
    ``_max``, ``allocator_over_limit_max`` (nan without a limit), ``fits`` (every device's
    allocator peak within the limit; True without one), ``grad_error`` and ``grad_tolerance``
    (nan for one device: there is no shared run).
    """
    from workbench.runtime.gradients import grad_tolerance

    root = Path(root)
    reps = load_replays(root)
    reps = reps[reps["predicted_busy"] > 0]
    val = pd.read_csv(root / "validation.csv").set_index("run")
    rows = []
    for run, g in reps.groupby("run", sort=False):
        v = val.loc[run]
        one = g["stages"].astype(str).str.count(",") == 0
        over = g["allocator_over_limit"]
        dtype = v.get("dtype", "float32")      # runs made before the dtype option were float32
        rows.append({"run": run, "dtype": dtype, "devices": int(v["devices"]),
                     "stages": int(v["stages"]), "method": v["method"], "memory_limit": float(v["memory_limit"]),
                     "predicted_period": float(v["predicted_period"]),
                     "busy_error_min": float(g["busy_error"].min()), "busy_error_max": float(g["busy_error"].max()),
                     "memory_error_max": float(g["memory_error"].abs().max()),
                     "memory_exact": bool((g.loc[one, "memory_error"].abs() < 1e-9).all()),
                     "allocator_over_predicted_min": float(g["allocator_over_predicted"].min()),
                     "allocator_over_predicted_max": float(g["allocator_over_predicted"].max()),
                     "allocator_over_limit_max": float(over.max()),
                     "fits": bool(over.isna().all() or (over <= 1).all()),
                     "grad_error": float(v.get("shared_max_grad_error", math.nan)),
                     "grad_tolerance": grad_tolerance(dtype) if int(v["devices"]) > 1 else math.nan})
    order = {r: i for i, r in enumerate(val.index)}
    out = pd.DataFrame(rows).set_index("run")
    return out.loc[sorted(out.index, key=order.get)]
