"""reproduce on Dask: the measured speed-up here, and what a cluster of N machines would take.

1. Runs ``reproduce --quick`` (into temporary folders, PNGs off) serially and with
   ``--executor dask --workers W`` (a local cluster), and prints both wall times, their ratio,
   and the sum of the units' own seconds (each unit's sidecar records the seconds it took on its
   worker): the most a perfect executor could save.
2. From a results folder (default ``data/results``, the full settings) it prints what N machines
   would take: the units' seconds laid longest first onto the machine free first
   (:func:`workbench.experiments.executors.makespan`), never below the longest unit. A unit's
   seconds are its sidecar's (``compute.seconds``) or, for units made before sidecars recorded
   them, the sum of its CSV's ``seconds`` column (its solves; a lower bound).

    .venv/bin/python benchmarks/cluster.py                     # both (about 3 minutes on 2 free cores)
    .venv/bin/python benchmarks/cluster.py --skip-run          # the estimate only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.experiments.executors import makespan  # noqa: E402


def unit_seconds(folder: Path) -> dict[str, float]:
    """Each unit's seconds in ``folder/units``: its sidecar's, else the sum of its CSV's ``seconds`` column."""
    import pandas as pd

    out = {}
    for side in sorted((folder / "units").glob("*.json")):
        meta = json.loads(side.read_text())
        if "compute" in meta:
            out[side.stem] = float(meta["compute"]["seconds"])
            continue
        df = pd.read_csv(side.with_suffix(".csv"))
        out[side.stem] = float(df["seconds"].sum()) if "seconds" in df else 0.0
    return out


def timed_reproduce(out: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "workbench", "reproduce", "--quick", "--out", str(out), *extra],
                   check=True, capture_output=True, env={**__import__("os").environ, "WORKBENCH_NO_PNG": "1"})
    return time.perf_counter() - t0


def measure(workers: int) -> None:
    import os

    with tempfile.TemporaryDirectory() as tmp:
        serial = timed_reproduce(Path(tmp) / "serial", [])
        dask = timed_reproduce(Path(tmp) / "dask", ["--executor", "dask", "--workers", str(workers)])
        units = sum(unit_seconds(Path(tmp) / "dask").values())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"reproduce --quick: serial {serial:.1f} s, dask with {workers} local workers {dask:.1f} s: "
          f"speed-up {serial / dask:.2f}x ({os.cpu_count()} cores, load average {load:.1f} at the end); "
          f"the units' own seconds add up to {units:.1f} s")


def estimate(folder: Path) -> None:
    secs = unit_seconds(folder)
    total, longest = sum(secs.values()), max(secs.values(), default=0.0)
    print(f"\n{folder}: {len(secs)} units, {total / 60:.1f} min of unit time, the longest "
          f"{max(secs, key=secs.get) if secs else '-'} {longest / 60:.1f} min")
    print(f"{'machines':>8} {'minutes':>8} {'speed-up':>8}")
    for n in (1, 2, 4, 8, 16, 32, 64):
        m = makespan(secs.values(), n)
        print(f"{n:8d} {m / 60:8.1f} {total / m if m else float('nan'):8.1f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="local Dask workers for the measurement (default 2)")
    ap.add_argument("--results", default=str(ROOT / "data" / "results"), help="results folder for the estimate")
    ap.add_argument("--skip-run", action="store_true", help="only the estimate from --results")
    args = ap.parse_args(argv)
    if not args.skip_run:
        measure(args.workers)
    estimate(Path(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
