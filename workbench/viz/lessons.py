"""The numbers the teaching notebooks state, computed from plans and traces, so that their text can print them
and assert them (a run where a lesson stops being true fails instead of teaching something false).

* :func:`in_flight`: the most mini-batches a device holds at once in a trace;
* :func:`flush_wait`: where a flushed schedule's device waits, and the round trip that makes it wait;
* :func:`memory_steps`: one plan per memory limit: its period, stages, in-flight counts, the GPUs it uses
  and how busy the busiest is (whether compute or memory sets the period);
* :func:`stash_cost`: the period with and without weight stashing, per memory limit;
* :func:`replay_error_ranges`: per run of replays, the lowest and highest relative compute error of a device;
* :func:`same_order`: whether two traces run the same forwards and backwards in the same order on each device.

>>> from workbench.model.target import Target
>>> from workbench.viz.notebook import teaching_chain, three_schedules
>>> traces = three_schedules(teaching_chain(), Target.of(4, bandwidth="10GB/s", memory_model="paper"), micro_batches=8)
>>> [in_flight(t, 0) for t in traces.values()]
[8, 4, 5]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.trace import Trace

__all__ = ["in_flight", "FlushWait", "flush_wait", "memory_steps", "stash_cost", "stage_names",
           "replay_error_ranges", "same_order"]


def in_flight(trace: Trace, device: int) -> int:
    """The most mini-batches ``device`` holds at once: started its first forward there, not yet ended its last
    backward there.

    >>> import pandas as pd
    >>> from workbench.model.trace import MEMORY_COLUMNS
    >>> ops = pd.DataFrame({"device": [0] * 4, "stage": [0] * 4, "first": [0] * 4, "last": [0] * 4,
    ...     "kind": ["F", "F", "B", "B"], "batch": [0, 1, 0, 1], "start": [0.0, 1, 2, 3], "end": [1.0, 2, 3, 4]})
    >>> in_flight(Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), 1), 0)
    2
    """
    ops = trace.ops[(trace.ops["device"] == device) & trace.ops["kind"].isin(["F", "B"])]
    if not len(ops):
        return 0
    g = ops.groupby("batch")
    start = g.apply(lambda o: o.loc[o["kind"] == "F", "start"].min(), include_groups=False).dropna()
    end = g.apply(lambda o: o.loc[o["kind"] == "B", "end"].max(), include_groups=False).reindex(start.index)
    end = end.fillna(np.inf)
    # an end that meets a start frees its slot first: ends sort first at equal times, and "equal" allows for the
    # rounding of times summed over a run (a window of exactly k periods holds k, not k + 1)
    slack = 1e-9 * max(float(ops["end"].max() - ops["start"].min()), 1e-30)
    events = sorted([(float(t), 1) for t in start] + [(float(t) - slack, -1) for t in end if math.isfinite(t)])
    held = most = 0
    for _, step in events:
        held += step
        most = max(most, held)
    return most


@dataclass(frozen=True)
class FlushWait:
    """One device of a flushed schedule: the most micro-batches it holds (``held``), its compute per micro-batch
    (``work``), the round trip of micro-batch 0 (from its forward's start to its backward's end on the device),
    the device's idle time between its first and last operation (``idle``) and the whole run (``makespan``);
    seconds."""

    held: int
    work: float
    round_trip: float
    idle: float
    makespan: float

    @property
    def waits_for_round_trip(self) -> bool:
        """True when a micro-batch's round trip outlasts the work of all the micro-batches the device may hold:
        the device must wait before it may start another one."""
        return self.round_trip > self.held * self.work * (1 + 1e-9)


def flush_wait(trace: Trace, device: int = 0) -> FlushWait:
    """What keeps ``device`` of a flushed schedule waiting (see :class:`FlushWait`)."""
    ops = trace.ops[(trace.ops["device"] == device) & trace.ops["kind"].isin(["F", "B"])]
    batches = ops["batch"].nunique()
    busy = float((ops["end"] - ops["start"]).sum())
    first = ops[ops["batch"] == ops["batch"].min()]
    trip = float(first.loc[first["kind"] == "B", "end"].max() - first.loc[first["kind"] == "F", "start"].min())
    span = float(ops["end"].max() - ops["start"].min())
    return FlushWait(held=in_flight(trace, device), work=busy / max(batches, 1), round_trip=trip,
                     idle=span - busy, makespan=trace.makespan)


def stage_names(plan: Plan, chain: Chain) -> str:
    """The plan's stages by layer name, one ``first–last`` per stage: ``"conv1–conv2 | conv3 | fc6–fc8"``."""
    names = [l.name for l in chain.layers]
    return " | ".join(names[s.first] if s.first == s.last else f"{names[s.first]}–{names[s.last]}"
                      for s in plan.stages)


def _what_sets_the_period(plan: Plan, chain: Chain) -> tuple[str, str]:
    """``("compute", "GPU 1's compute")`` when a GPU computes for the whole period; else ``("memory", "GPU 0's
    memory (room for k=4)")``, the first GPU whose k in-flight mini-batches take exactly k periods to come back
    (their round trip fills them: one more in flight would shorten the period, and it has no room for one)."""
    T = plan.period
    for s in plan.stages:
        if chain.stage_costs(s.first, s.last).compute >= T * (1 - 1e-6):
            return "compute", f"GPU {s.device}'s compute"
    for s in plan.stages:
        window = s.bwd_start + chain.stage_costs(s.first, s.last).backward - s.fwd_start
        if window >= s.in_flight * T * (1 - 1e-6):
            return "memory", f"GPU {s.device}'s memory (room for k={s.in_flight})"
    return "transfers", "the transfers"


def memory_steps(chain: Chain, platform: Target, limits: Sequence[float | str | None], *,
                 method: str = "dp") -> pd.DataFrame:
    """One plan per memory limit (``None``: no limit), one row each: ``limit`` (bytes), ``period`` (s),
    ``stages`` (:func:`stage_names`), ``in_flight`` per stage, ``gpus`` used, ``busiest`` (the largest share of
    the period a GPU computes: 1 when compute sets the period, below 1 when memory does: the GPUs wait for
    mini-batches they have no room to hold), ``limited_by`` (``"compute"`` or ``"memory"``) and ``bound_by``
    (which GPU's, in words), ``peak`` (bytes),
    ``changed`` (the plan differs from the row before) and ``plan``. An infeasible limit gives a row with an
    infinite period.

    >>> from workbench.viz.notebook import teaching_chain
    >>> df = memory_steps(teaching_chain(), Target.of(4, bandwidth="10GB/s", memory_model="paper"), [None, "0.4GiB"])
    >>> [round(p * 1e3, 2) for p in df["period"]], df["gpus"].tolist(), df["bound_by"].tolist()
    ([15.0, 23.71], [4, 4], ["GPU 0's compute", "GPU 1's memory (room for k=2)"])
    """
    from workbench.planners import plan as make_plan

    rows, previous = [], None
    for limit in limits:
        plat = platform.with_(memory=math.inf if limit is None else limit)
        p = make_plan(chain, plat, method)
        ok = p.feasible and p.fits
        loads = [chain.stage_costs(s.first, s.last).compute for s in p.stages] if ok else []
        per_gpu = pd.Series(loads, index=[s.device for s in p.stages] if ok else []).groupby(level=0).sum()
        key = (p.assignment, tuple(s.in_flight for s in p.stages)) if ok else None
        limited_by, bound_by = _what_sets_the_period(p, chain) if ok else ("", "")
        rows.append({"limit": plat.memory_limit, "period": p.period if ok else math.inf,
                     "stages": stage_names(p, chain) if ok else "no plan fits",
                     "in_flight": [s.in_flight for s in p.stages] if ok else [],
                     "gpus": len(per_gpu), "busiest": float(per_gpu.max() / p.period) if ok else math.nan,
                     "limited_by": limited_by, "bound_by": bound_by,
                     "peak": p.peak_memory if ok else math.nan,
                     "changed": previous is not None and key != previous, "plan": p})
        previous = key
    return pd.DataFrame(rows)


def stash_cost(chain: Chain, platform: Target, limits: Sequence[float | str | None], *,
               method: str = "dp") -> pd.DataFrame:
    """Per memory limit (``None``: none): the period (s) with weight stashing and with one weight version
    (``inf``: no plan fits), their ratio, and the stash's bytes on the first GPU of the stashing plan.

    >>> from workbench.viz.notebook import teaching_chain
    >>> df = stash_cost(teaching_chain(), Target.of(4, bandwidth="10GB/s", memory_model="paper"), [None])
    >>> [round(float(df[w].iloc[0]) * 1e3, 1) for w in ("stash", "single")]
    [15.0, 15.0]
    """
    from workbench.planners import plan as make_plan
    from workbench.viz.memory import memory_split

    rows = []
    for limit in limits:
        row: dict[str, object] = {"limit": math.inf if limit is None else platform.with_(memory=limit).memory_limit}
        for weights in ("stash", "single"):
            plat = platform.with_(memory=row["limit"], weights=weights)
            p = make_plan(chain, plat, method)
            ok = p.feasible and p.fits
            row[weights] = p.period if ok else math.inf
            if weights == "stash":
                row["stashed_gpu0"] = float(memory_split(p, chain, plat)["stashed"].iloc[0]) if ok else math.nan
        row["ratio"] = row["stash"] / row["single"] if math.isfinite(row["single"]) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)



def replay_error_ranges(replays: pd.DataFrame, by: str = "run") -> pd.DataFrame:
    """Per ``by`` (a column of :func:`workbench.runtime.replay.load_replays`' frame, or ``"network"``: the run's
    name up to ``-P<devices>``), the lowest and highest ``measured_busy / predicted_busy - 1`` of a device that
    ran something, and the same for ``allocator_over_predicted`` (``peak_min``, ``peak_max``).

    >>> df = pd.DataFrame({"run": ["a-P2", "a-P2", "b-P1"], "predicted_busy": [1.0, 2.0, 0.0],
    ...                    "measured_busy": [1.1, 1.8, 0.0], "allocator_over_predicted": [1.0, 2.0, 3.0]})
    >>> replay_error_ranges(df, "network").round(3).to_dict("index")
    {'a': {'busy_min': -0.1, 'busy_max': 0.1, 'peak_min': 1.0, 'peak_max': 2.0}}
    """
    ran = replays[replays["predicted_busy"] > 0].copy()
    ran["busy"] = ran["measured_busy"] / ran["predicted_busy"] - 1
    ran["network"] = ran["run"].str.replace(r"-P\d.*$", "", regex=True)
    g = ran.groupby(by)
    out = pd.DataFrame({"busy_min": g["busy"].min(), "busy_max": g["busy"].max(),
                        "peak_min": g["allocator_over_predicted"].min(),
                        "peak_max": g["allocator_over_predicted"].max()})
    out.index.name = by
    return out


def same_order(predicted: Trace, measured: Trace) -> list[bool]:
    """Per device: the forwards and backwards (kind, mini-batch) in the same order in both traces, over the
    operations both ran.

    >>> from workbench.model.trace import MEMORY_COLUMNS
    >>> ops = pd.DataFrame({"device": [0, 0], "stage": [0, 0], "first": [0, 0], "last": [0, 0], "kind": ["F", "B"],
    ...                     "batch": [0, 0], "start": [0.0, 1.0], "end": [1.0, 2.0]})
    >>> a = Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), 1)
    >>> same_order(a, Trace(ops.assign(start=[0.0, 3.0], end=[2.0, 5.0]), a.memory, 1))
    [True]
    >>> same_order(a, Trace(ops.assign(start=[3.0, 0.0], end=[5.0, 2.0]), a.memory, 1))
    [False]
    """
    def order(trace: Trace, device: int) -> list[tuple[str, int]]:
        ops = trace.ops[(trace.ops["device"] == device) & trace.ops["kind"].isin(["F", "B"])]
        ops = ops.sort_values("start", kind="stable")
        return list(zip(ops["kind"], ops["batch"].astype(int)))

    out = []
    for d in range(predicted.devices):
        a, b = order(predicted, d), order(measured, d)
        n = min(len(a), len(b))
        out.append(a[:n] == b[:n])
    return out
