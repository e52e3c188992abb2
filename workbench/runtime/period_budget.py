"""Where a measured period goes: each device's time in the steady window, split into parts that are measured.

The prediction of a periodic plan is its period ``T``, built from the profile's per-layer times. A run
measures its period as the mean spacing of the first stage's forwards after the warm-up
(:func:`~workbench.runtime.compare.steady_warmup`): the window from the first stage's forward of
mini-batch ``w`` to that of the last mini-batch, ``m`` periods long. :func:`period_budget` splits
every device's time in that window (each operation clipped to it), divided by ``m``, into these parts
(seconds per period; a device's parts add up to the measured period exactly). The first seven are CPU time
of the rank's thread (``time.thread_time``, which the runtime records for every operation): what the rank
would take on a core of its own.

* ``profile``: the forwards and backwards as the profile times them (the stage's summed layer times; a
  zero-bubble schedule's backward in two parts, ``I`` and ``W``, as the profile splits it:
  :mod:`workbench.model.split`);
* ``layers now``: the same layers timed alone again (``alone``, a profile taken with the CPU clock,
  ``profile --clock cpu``) minus the profile (0 without ``alone``; negative when the profile's times
  were longer);
* ``as one stage``: each stage's layers run one after another as one module, alone
  (``stages_alone``, :func:`workbench.profiles.stages.time_stages`), minus the same layers timed each
  alone: what running them together changes, before any engine (0 without ``stages_alone``);
* ``engine``: the forwards' and backwards' CPU time beyond that and beyond the optimizer step: the
  engine's code around the stage (torch's ``PipelineStage``, ``functional_call`` on a weight version,
  accumulating into gradient buffers, the gradient check's sums);
* ``optimizer step``: the PipeDream engine's weight update inside each backward (the stash's copy of
  the live weights and the optimizer's step: the trace's ``step`` rows);
* ``sending``: the send rows' CPU time (the PipeDream engine: copying and posting a message; torch's
  engine: preparing it, its posting falls between operations);
* ``between operations``: the thread's CPU time between operations (the engine's scheduling);
* ``waiting for a core``: wall time beyond CPU time in all of the above (the thread was ready but other
  processes had the core);
* ``waiting for messages``: the receives' waits.

``profile`` is what the model predicts for these operations; every other part is time it does not have.

>>> import pandas as pd
>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.plan import make_plan
>>> from workbench.model.trace import Trace, MEMORY_COLUMNS, OP_COLUMNS
>>> from workbench.runtime.rank import CPU_COLUMNS
>>> ch = Chain((Layer("a", 1.0, 2.0, 0, 0),))
>>> plan = make_plan(ch, Target.of(1), 3.0, [0], [0.0], [1.0])
>>> # (mini-batch, kind, start, end, CPU seconds, CPU clock at the start)
>>> rows = [(i, "F", 4.0 * i, 4.0 * i + 1.25, 1.1, 3.375 * i) for i in range(4)] + \\
...        [(i, "B", 4.0 * i + 1.5, 4.0 * i + 3.75, 2.0, 3.375 * i + 1.225) for i in range(4)]
>>> ops = pd.DataFrame([(0, 0, 0, 0, k, i, a, b) for i, k, a, b, _, _ in rows], columns=OP_COLUMNS)
>>> cpu = pd.DataFrame([(0, 0, k, i, c, c0) for i, k, _, _, c, c0 in rows], columns=CPU_COLUMNS)
>>> budget = period_budget(plan, ch, Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), 1), cpu, warmup=1)
>>> {k: round(v, 3) for k, v in budget.loc[0].items() if v}
{'profile': 3.0, 'engine': 0.1, 'between operations': 0.275, 'waiting for a core': 0.625}
>>> period_budget(plan, ch, Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), 1), cpu, warmup=1,
...               stages_alone=[(1.0, 2.05)]).loc[0, ["as one stage", "engine"]].round(3).tolist()
[0.05, 0.05]
>>> budget.attrs["measured_period"], budget.attrs["periods"]
(4.0, 2)
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.trace import Trace

__all__ = ["PARTS", "CPU_PARTS", "period_budget", "per_operation"]

#: the parts of a measured period, in the order they stack
PARTS = ("profile", "layers now", "as one stage", "engine", "optimizer step", "sending", "between operations",
         "waiting for a core", "waiting for messages")
#: the parts that are CPU time of the rank's thread (the rest is waiting)
CPU_PARTS = PARTS[:7]
#: compute operations: forward, backward, and a zero-bubble schedule's backward in two parts (input, weight gradient)
_COMPUTE = ("F", "B", "I", "W")
_TOP = _COMPUTE + ("send", "recv")     # a rank's operations one after another (a step lies inside its backward)


def _window(trace: Trace, warmup: int) -> tuple[float, float, int]:
    """(t0, t1, periods): from the first stage's forward of mini-batch ``warmup`` to that of the last one."""
    f = trace.ops[(trace.ops["kind"] == "F") & (trace.ops["stage"] == 0)].sort_values("batch")
    starts = f["start"].to_numpy(dtype=float)
    if len(starts) - warmup < 2:
        raise ValueError(f"{len(starts)} mini-batches leave no steady window after {warmup} of warm-up")
    return float(starts[warmup]), float(starts[-1]), len(starts) - 1 - warmup


def _with_cpu(ops: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """``ops`` with each operation's ``cpu`` and ``cpu_start``: the n-th operation of a (device, kind, stage,
    mini-batch) in time is that key's n-th CPU row in CPU clock (a stage receives its input and its gradient
    under one key)."""
    keys = ["device", "kind", "stage", "batch"]
    if "cpu_start" not in cpu.columns:
        raise ValueError("the run's CPU times lack cpu_start (a run made before they were recorded)")
    o = ops.sort_values(["device", "start"]).copy()
    c = cpu.sort_values(["device", "cpu_start"]).copy()
    o["nth"], c["nth"] = o.groupby(keys).cumcount(), c.groupby(keys).cumcount()
    out = o.merge(c[keys + ["nth", "cpu", "cpu_start"]], on=keys + ["nth"], how="left")
    if out.loc[out["kind"].isin(list(_TOP) + ["step"]), "cpu"].isna().any():
        raise ValueError("the run's CPU times lack some operations")
    return out


def _clip(o: pd.DataFrame, t0: float, t1: float) -> pd.Series:
    """The part of each operation's duration inside [t0, t1] (seconds)."""
    return (o["end"].clip(upper=t1) - o["start"].clip(lower=t0)).clip(lower=0.0)


def _gaps_cpu(top: pd.DataFrame, t0: float, t1: float) -> float:
    """The thread's CPU time between consecutive operations of one rank, each gap's share inside [t0, t1]."""
    top = top.sort_values("start")
    end, start = top["end"].to_numpy(float)[:-1], top["start"].to_numpy(float)[1:]
    cpu = top["cpu_start"].to_numpy(float)[1:] - (top["cpu_start"] + top["cpu"]).to_numpy(float)[:-1]
    inside = np.clip(np.minimum(start, t1) - np.maximum(end, t0), 0.0, None)
    length = start - end
    return float(np.sum(np.where(length > 0, np.clip(cpu, 0.0, None) * inside / np.where(length > 0, length, 1), 0)))


def _stage_time(ch: Chain, plan: Plan, stages: pd.Series, kinds: pd.Series) -> np.ndarray:
    """The time of each (stage, kind) in chain ``ch``: its forward, backward, or the backward's input- or
    weight-gradient part (:func:`~workbench.model.split.stage_split`)."""
    from workbench.model.split import stage_split

    def one(s: int, kind: str) -> float:
        st = plan.stages[s]
        if kind in ("I", "W"):
            return stage_split(ch, st.first, st.last, first_stage=s == 0)[0 if kind == "I" else 1]
        costs = ch.stage_costs(st.first, st.last)
        return costs.forward if kind == "F" else costs.backward

    return np.array([one(int(s), k) for s, k in zip(stages, kinds)])


def _stage_alone(stages_alone: Sequence[tuple[float, float]], now: np.ndarray, ch: Chain, plan: Plan,
                 stages: pd.Series, kinds: pd.Series) -> np.ndarray:
    """Each operation's time with its stage run alone as one module: the forward or backward timed so, an input-
    or weight-gradient part as its share of that backward in ``ch`` (``now``: the operations' times in ``ch``)."""
    backward = _stage_time(ch, plan, stages, pd.Series(["B"] * len(stages), index=stages.index))
    out = []
    for s, k, t, b in zip(stages, kinds, now, backward):
        f_alone, b_alone = stages_alone[int(s)]
        out.append(f_alone if k == "F" else b_alone if k == "B" else (b_alone * t / b if b > 0 else 0.0))
    return np.array(out)


def _device_parts(o: pd.DataFrame, plan: Plan, chain: Chain, alone: Chain | None,
                  stages_alone: Sequence[tuple[float, float]] | None, t0: float, t1: float) -> dict[str, float]:
    """One device's parts over the window (seconds, not yet per period); ``o`` its operations with CPU times."""
    o = o.assign(inside=_clip(o, t0, t1))
    o["share"] = np.where(o["end"] > o["start"], o["inside"] / (o["end"] - o["start"]).where(o["end"] > o["start"], 1),
                          0.0)
    comp = o[o["kind"].isin(_COMPUTE)]
    step = o[o["kind"] == "step"].groupby(["stage", "batch"])["cpu"].sum()
    step_cpu = np.array([step.get((s, b), 0.0) if k == "B" else 0.0
                         for s, b, k in zip(comp["stage"], comp["batch"], comp["kind"])])
    profile = _stage_time(chain, plan, comp["stage"], comp["kind"])
    now = _stage_time(alone, plan, comp["stage"], comp["kind"]) if alone is not None else profile
    whole = (_stage_alone(stages_alone, now, alone if alone is not None else chain, plan, comp["stage"], comp["kind"])
             if stages_alone is not None else now)
    f = comp["share"].to_numpy(float)
    sends, recvs = o[o["kind"] == "send"], o[o["kind"] == "recv"]
    top = o[o["kind"].isin(_TOP)]
    gaps_wall = (t1 - t0) - float(top["inside"].sum())
    part = {"profile": float((profile * f).sum()), "layers now": float(((now - profile) * f).sum()),
            "as one stage": float(((whole - now) * f).sum()),
            "engine": float(((comp["cpu"].to_numpy(float) - step_cpu - whole) * f).sum()),
            "optimizer step": float((step_cpu * f).sum()),
            "sending": float((sends["cpu"] * sends["share"]).sum()),
            "between operations": min(_gaps_cpu(top, t0, t1), max(gaps_wall, 0.0))}
    part["waiting for messages"] = float(recvs["inside"].sum())
    part["waiting for a core"] = (t1 - t0) - sum(part.values())
    return part


def period_budget(plan: Plan, chain: Chain, trace: Trace, cpu: pd.DataFrame | None = None, *,
                  alone: Chain | None = None, stages_alone: Sequence[tuple[float, float]] | None = None,
                  warmup: int | None = None) -> pd.DataFrame:
    """Per device, seconds per measured period spent in each of :data:`PARTS` (see the module docstring).

    ``chain`` is the profile the plan was made on, ``trace`` the run's (its CPU times are ``meta["cpu"]``
    unless ``cpu`` is given), ``alone`` the same layers profiled again with the CPU clock, ``stages_alone`` the
    (forward, backward) seconds of each stage of the plan run alone as one module (CPU clock). ``attrs``:
    ``measured_period``, ``predicted_period``, ``periods`` (the window's), ``window`` (t0, t1) and
    ``operations`` (forwards and backwards per period, per device).
    """
    from workbench.runtime.compare import steady_warmup

    cpu = cpu if cpu is not None else trace.meta.get("cpu")
    if cpu is None or not len(cpu):
        raise ValueError("the run has no CPU times per operation")
    if alone is not None and len(alone) != len(chain):
        raise ValueError(f"the profile timed alone has {len(alone)} layers, the plan's {len(chain)}")
    if stages_alone is not None and len(stages_alone) != len(plan.stages):
        raise ValueError(f"{len(stages_alone)} stage times for the plan's {len(plan.stages)} stages")
    t0, t1, periods = _window(trace, steady_warmup(plan, trace, warmup))
    ops = _with_cpu(trace.ops, cpu)
    rows, count = [], {}
    for d in range(plan.devices):
        o = ops[ops["device"] == d]
        rows.append({k: v / periods for k, v in _device_parts(o, plan, chain, alone, stages_alone, t0, t1).items()})
        comp = o[o["kind"].isin(_COMPUTE)]
        count[d] = float((_clip(comp, t0, t1) / (comp["end"] - comp["start"])).sum()) / periods
    out = pd.DataFrame(rows, index=pd.Index(range(plan.devices), name="device"))[list(PARTS)]
    out.attrs.update(measured_period=(t1 - t0) / periods, predicted_period=plan.period, periods=periods,
                     window=(t0, t1), operations=count)
    return out


def per_operation(budget: pd.DataFrame) -> pd.DataFrame:
    """Per device, the parts of :func:`period_budget` that come with each forward or backward (layers now,
    as one stage, engine, optimizer step) divided by the forwards and backwards per period: seconds per operation.

    >>> b = pd.DataFrame({"engine": [0.004], "optimizer step": [0.0], "layers now": [0.0], "as one stage": [0.0]},
    ...                  index=pd.Index([0], name="device"))
    >>> b.attrs["operations"] = {0: 4.0}
    >>> float(per_operation(b).loc[0, "engine"])
    0.001
    """
    cols = ["layers now", "as one stage", "engine", "optimizer step"]
    ops = pd.Series(budget.attrs["operations"]).reindex(budget.index)
    out = budget[cols].div(ops.replace(0, math.nan), axis=0)
    out.insert(0, "operations per period", ops)
    return out
