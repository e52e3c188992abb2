"""Export a plan to ``torch.distributed.pipelining``'s schedule format (action lists, CSV).

``torch.distributed.pipelining`` (torch >= 2.4) runs *flushed* schedules
described as one list of actions per rank: ``"{stage}F{micro-batch}"`` (forward),
``"{stage}B{micro-batch}"`` (full backward), and, after lowering,
``"{stage}SEND_F{mb}"``, ``"{stage}RECV_F{mb}"``, ``"{stage}SEND_B{mb}"``,
``"{stage}RECV_B{mb}"`` (plus ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` it adds
itself). Its runtime schedule class (``_PipelineScheduleRuntime``, the base of
``ScheduleInterleaved1F1B`` and friends) reads them from a CSV file with one
row per rank (``_load_csv(path, format="compute_only" | "compute_comms")``);
the ``compute_only`` form is lowered by its passes (``_add_send_recv`` ...).
torch's multi-stage schedules (``interleaved-1f1b``, ..., ``zbv``) export torch's
own order (:func:`workbench.schedules.program.flush_order`), with ``{stage}I{mb}``
and ``{stage}W{mb}`` for a split backward.

:func:`plan_to_actions` unrolls a periodic plan for ``micro_batches``
micro-batches in the plan's own order (warm-up, steady state, drain), which
*is* a flushed schedule: run by torch, all micro-batches of one ``step()``
use the same weights and the optimizer steps after the flush. Stage ``s`` of
the plan is torch's stage ``s``; the rank is the plan's device, so a device
holding several stages becomes a rank with several (looped) stages.

:func:`load_with_torch` reads a CSV back with the installed torch's own
parser and lowering passes (``_Action.from_str``, ``_validate_schedule``,
``_add_unshard_reshard``, ``_add_reduce_grad``, ``_add_send_recv``) and
dry-runs the result with its ``_simulate_comms_compute``, so a round trip
proves the export is something that engine accepts and can run without
deadlock. (Those helpers are private torch API; they exist in torch 2.13.)
``run`` executes the same actions on that engine
(:mod:`~workbench.runtime.torch_engine`, via :func:`programs_to_actions`) for
every plan it can express; the rest run on the PipeDream fallback
(:mod:`~workbench.runtime.pipedream`).

What that engine cannot express, and the export therefore drops or changes:

* the **periodic steady state without a flush**: a torch ``step()`` always
  drains; PipeDream's asynchronous updates between mini-batches (one
  optimizer step after every backward) and **weight stashing** (several
  weight versions in flight) have no counterpart: every micro-batch of a
  step sees one version, as our runtime does with a learning rate of zero;
* **time**: only the order of each rank's actions survives, not the start
  times, the period, or the idle slots a memory-aware schedule inserts;
* **non-neighbour links**: torch's stage ``s`` only ever sends to ``s+1`` and
  ``s-1``; a stage graph with skip connections across stages (a DAG
  linearised with cut volumes that cross several stages, ``Chain.cut_bytes``)
  must be carried through the intermediate stages, since each stage takes one
  input tensor (the zoo's chains do so already);
* a stage count per rank that differs between ranks works in the action
  lists (validated here) but torch's built-in schedule classes assume the
  same number of stages on every rank; load the CSV into the runtime class;
* memory limits: torch does not check them; the plan's memory is a prediction.

>>> from workbench.model.plan import Plan, Stage
>>> plan = Plan(period=3.0, assignment=(0, 1), devices=2,
...             stages=(Stage(0, 0, 0, 0.0, 4.0, 2), Stage(1, 1, 1, 1.0, 2.0, 1)))
>>> plan_to_actions(plan, 3)
{0: ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2'], 1: ['1F0', '1B0', '1F1', '1B1', '1F2', '1B2']}
>>> plan_to_actions(plan, 1, comms=True)[1]
['1RECV_F0', '1F0', '1B0', '1SEND_B0']
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from workbench.model.plan import Plan
from workbench.schedules.program import programs_for

__all__ = ["plan_to_actions", "programs_to_actions", "actions_to_csv", "write_schedule_csv", "load_with_torch",
           "format_grid",
           "LIMITATIONS"]

LIMITATIONS = (
    "flush after every step (no periodic steady state, no asynchronous updates, no weight stashing)",
    "order only (no start times, no period, no inserted idle slots)",
    "stages talk to neighbours s-1/s+1 only (skip connections must be carried through)",
    "no memory limits",
)


def plan_to_actions(plan: Plan, micro_batches: int, *, comms: bool = False) -> dict[int, list[str]]:
    """Per rank, the plan's operations for ``micro_batches`` micro-batches as torch action strings.

    ``comms=True`` adds the send/receive actions (``compute_comms`` format):
    a send right after the computation that produces the tensor, a receive
    right before the computation that needs it, for stages on different ranks.
    Flushed plans take their schedule's order (:func:`workbench.schedules.program.flushed_programs`).
    """
    return programs_to_actions(programs_for(plan, micro_batches), plan, comms=comms)


def programs_to_actions(progs: list, plan: Plan, *, comms: bool = False) -> dict[int, list[str]]:
    """Per-device programs (:mod:`~workbench.schedules.program`) as torch action strings, in their order."""
    dev = [st.device for st in plan.stages]
    S = len(dev)
    out: dict[int, list[str]] = {}
    for d, prog in enumerate(progs):
        acts: list[str] = []
        for op in prog:
            s, i = op.stage, op.batch
            if op.kind == "F":
                if comms and s > 0 and dev[s - 1] != d:
                    acts.append(f"{s}RECV_F{i}")
                acts.append(f"{s}F{i}")
                if comms and s < S - 1 and dev[s + 1] != d:
                    acts.append(f"{s}SEND_F{i}")
            elif op.kind == "W":            # a weight gradient: no message
                acts.append(f"{s}W{i}")
            else:                           # a full backward, or its input-gradient part I
                if comms and s < S - 1 and dev[s + 1] != d:
                    acts.append(f"{s}RECV_B{i}")
                acts.append(f"{s}{op.kind}{i}")
                if comms and s > 0 and dev[s - 1] != d:
                    acts.append(f"{s}SEND_B{i}")
        out[d] = acts
    return out


def actions_to_csv(actions: dict[int, list[str]]) -> str:
    """The CSV text torch's ``_dump_csv``/``_load_csv`` use: one row per rank, in rank order."""
    buf = io.StringIO()
    w = csv.writer(buf)
    for r in sorted(actions):
        w.writerow(actions[r])
    return buf.getvalue()


def write_schedule_csv(plan: Plan, path: str | Path, micro_batches: int, *, comms: bool = False) -> Path:
    """Write :func:`plan_to_actions` as CSV (atomically); returns the path."""
    from workbench.io import write_text_atomic

    path = Path(path)
    write_text_atomic(path, actions_to_csv(plan_to_actions(plan, micro_batches, comms=comms)))
    return path


def load_with_torch(path: str | Path, num_stages: int, micro_batches: int,
                    format: str = "compute_only") -> tuple[dict[int, list[Any]], dict[int, int], dict[int, list[Any]]]:
    """Read a schedule CSV with the installed torch's parser and lowering passes, then dry-run it.

    Returns (actions as read, stage -> rank mapping torch infers, the lowered
    schedule with communication). Raises what torch raises on an invalid or
    deadlocking schedule.
    """
    from torch.distributed.pipelining import schedules as ts

    actions: dict[int, list[Any]] = {}
    with open(path, newline="") as f:      # what _PipelineScheduleRuntime._load_csv does
        for rank, row in enumerate(csv.reader(f)):
            actions[rank] = [ts._Action.from_str(s) for s in row]
    ranks = len(actions)
    compute = {r: [a for a in acts if a is not None and a.is_compute_op] for r, acts in actions.items()}
    stage_to_rank = ts._validate_schedule(compute, ranks, num_stages, micro_batches)
    if format == "compute_only":
        if any(not a.is_compute_op for acts in actions.values() for a in acts if a is not None):
            raise ValueError("compute_only schedule holds communication actions")
        lowered = {r: ts._add_reduce_grad(ts._add_unshard_reshard(actions[r]), micro_batches) for r in actions}
        lowered = ts._add_send_recv(lowered, stage_to_rank=lambda s: stage_to_rank[s], num_stages=num_stages)
    elif format == "compute_comms":
        lowered = {r: list(a) for r, a in actions.items()}
    else:
        raise ValueError(f"format must be 'compute_only' or 'compute_comms', got {format!r}")
    sim_input = {r: [a for a in acts if a is not None and a.computation_type not in
                     (ts.UNSHARD, ts.RESHARD, ts.REDUCE_GRAD)] for r, acts in lowered.items()}
    ts._simulate_comms_compute(sim_input, lambda s: stage_to_rank[s], num_stages)
    return actions, stage_to_rank, lowered


def format_grid(actions: dict[int, list[Any]]) -> str:
    """torch's own step-by-rank grid of a schedule (``_format_pipeline_order``)."""
    from torch.distributed.pipelining import schedules as ts

    parsed = {r: [a if not isinstance(a, str) else ts._Action.from_str(a) for a in acts] for r, acts in actions.items()}
    return ts._format_pipeline_order(parsed)
