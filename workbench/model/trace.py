"""Traces: what happened (or is predicted to happen) when a schedule runs.

A :class:`Trace` is the common currency of the simulator, the runtime and the
charts. ``ops`` has one row per operation with columns

    device, stage, first, last, kind, batch, start, end

(``kind`` is ``"F"``, ``"B"``, ``"send"`` or ``"recv"``, and with activation
policies ``"R"`` (a recomputation inside a backward), ``"offload"`` or
``"prefetch"`` (host-link transfers); ``first``/``last`` the
inclusive layer range; times in seconds). ``memory`` has one row per change
of memory on a device, columns

    device, time, activations, weights, total

(bytes held from ``time`` until the device's next row; ``weights`` is
everything held whatever the mini-batches in flight: parameters, gradients,
optimizer state, stashed versions, the runtime constant). A simulated trace
has a ``transient`` column too (the excess of the operation running then,
:mod:`workbench.model.memory`), which ``total`` includes. ``period`` is the
plan's (predicted) period, ``source`` says where the trace came from
(``"simulated"`` or ``"measured"``).

>>> import pandas as pd
>>> t = Trace.empty(devices=2)
>>> list(t.ops.columns)
['device', 'stage', 'first', 'last', 'kind', 'batch', 'start', 'end']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.io import frame_bytes, write_files_atomic

__all__ = ["Trace", "OP_COLUMNS", "MEMORY_COLUMNS"]

OP_COLUMNS = ["device", "stage", "first", "last", "kind", "batch", "start", "end"]
MEMORY_COLUMNS = ["device", "time", "activations", "weights", "total"]


@dataclass(frozen=True)
class Trace:
    ops: pd.DataFrame
    memory: pd.DataFrame
    devices: int
    period: float = float("nan")
    source: str = "simulated"
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        missing = [c for c in OP_COLUMNS if c not in self.ops.columns]
        if missing:
            raise ValueError(f"trace ops lack columns {missing}")
        missing = [c for c in MEMORY_COLUMNS if c not in self.memory.columns]
        if missing:
            raise ValueError(f"trace memory lacks columns {missing}")

    @classmethod
    def empty(cls, devices: int, **kw: Any) -> "Trace":
        return cls(pd.DataFrame(columns=OP_COLUMNS), pd.DataFrame(columns=MEMORY_COLUMNS), devices, **kw)

    @property
    def makespan(self) -> float:
        return float(self.ops["end"].max() - self.ops["start"].min()) if len(self.ops) else 0.0

    def peak_memory(self) -> np.ndarray:
        """Peak total bytes per device (0 for a device with no memory rows)."""
        out = np.zeros(self.devices)
        if len(self.memory):
            g = self.memory.groupby("device")["total"].max()
            for d, v in g.items():
                out[int(d)] = v
        return out

    def steady_period(self, warmup: int | None = None) -> float:
        """The period the trace shows: for a flushed run (``meta`` records ``micro_batches`` and
        ``flushes``), the time its flushes took (each from its first operation's start to its last one's end:
        the optimizer steps between them are not the plan's period) over the micro-batches it ran; otherwise
        the mean spacing of the first stage's forward starts after ``warmup`` mini-batches.

        A flushed run's first stage starts its forwards back to back and then waits for the drain, so the
        spacing of its forwards says nothing of the period:

        >>> ops = pd.DataFrame({"device": [0, 0, 0, 0], "stage": [0] * 4, "first": [0] * 4, "last": [0] * 4,
        ...                     "kind": ["F", "F", "B", "B"], "batch": [0, 1, 0, 1], "start": [0.0, 1.0, 2.0, 4.0],
        ...                     "end": [1.0, 2.0, 4.0, 6.0]})
        >>> t = Trace(ops, pd.DataFrame(columns=MEMORY_COLUMNS), 1, meta={"micro_batches": 2, "flushes": 1})
        >>> t.steady_period(), Trace(ops, t.memory, 1).steady_period()
        (3.0, 1.0)

        Two flushes with a gap (an optimizer step) between them: the gap is not the period's.

        >>> two = pd.concat([ops, ops.assign(batch=ops["batch"] + 2, start=ops["start"] + 10, end=ops["end"] + 10)])
        >>> Trace(two, t.memory, 1, meta={"micro_batches": 2, "flushes": 2}).steady_period()
        3.0
        """
        m, flushes = self.meta.get("micro_batches"), self.meta.get("flushes")
        if m and flushes and len(self.ops):
            spans = self.ops.groupby(self.ops["batch"].astype(int) // int(m)).agg(start=("start", "min"),
                                                                                   end=("end", "max"))
            return float((spans["end"] - spans["start"]).sum()) / (int(m) * int(flushes))
        f = self.ops[(self.ops["kind"] == "F") & (self.ops["stage"] == 0)].sort_values("batch")
        if len(f) < 2:
            return float("nan")
        starts = f["start"].to_numpy()
        w = len(starts) // 4 if warmup is None else warmup
        s = starts[w:] if len(starts) - w >= 2 else starts
        return float((s[-1] - s[0]) / (len(s) - 1))

    def save(self, path: str | Path) -> None:
        """Write ops to ``path`` (CSV or Parquet) and memory beside it (``*.memory.csv``), as a pair: both
        written in full before either replaces an older file (:func:`~workbench.io.write_files_atomic`)."""
        path = Path(path)
        write_files_atomic({path: frame_bytes(path, self.ops),
                            path.with_name(path.stem + ".memory" + path.suffix): frame_bytes(path, self.memory)})

    @classmethod
    def load(cls, path: str | Path, devices: int | None = None, **kw: Any) -> "Trace":
        path = Path(path)
        read = pd.read_parquet if path.suffix == ".parquet" else pd.read_csv
        ops = read(path)
        mem = read(path.with_name(path.stem + ".memory" + path.suffix))
        if devices is None:
            devices = int(max(ops["device"].max() if len(ops) else -1, mem["device"].max() if len(mem) else -1)) + 1
        return cls(ops, mem, devices, **kw)
