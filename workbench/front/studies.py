"""``reproduce`` and ``largest``: the studies' command-line handlers.

``reproduce`` recomputes every figure and the report (:mod:`workbench.experiments.report`); ``largest``
prints the largest GPT each method fits (:mod:`workbench.experiments.largest`).
"""

from __future__ import annotations

import sys
from typing import Any

from workbench.experiments.executors import Executor, check_scheduler
from workbench.experiments.largest import FAMILIES, METHODS, largest_table
from workbench.experiments.report import reproduce
from workbench.io import FolderBusy

__all__ = ["reproduce_command", "largest_command"]


def reproduce_command(args: Any) -> int:
    """CLI handler: ``python -m workbench reproduce [--quick] [--only NAME] [--out DIR] [--executor dask
    [--workers N | --scheduler ADDRESS]]``.

    Exit 0 when every check passes, 1 when a check fails, 2 when the run is
    refused (bad ``--only``, the folder is in use by another run, an executor that cannot start).
    """
    try:
        kind, workers, scheduler = (getattr(args, k, None) for k in ("executor", "workers", "scheduler"))
        executor = Executor(kind or "serial", workers, scheduler) if kind or workers or scheduler else None
        if executor is not None and executor.scheduler:   # before anything starts: a clear line, never a hang
            check_scheduler(executor.scheduler)
        rep = reproduce(quick=bool(getattr(args, "quick", False)), only=getattr(args, "only", None),
                        out=getattr(args, "out", None), executor=executor, others=True)
    except (ValueError, FolderBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {rep.report_path} ({len(rep.figures)} figures, {len(rep.computed)} units computed, "
          f"{len(rep.skipped)} from cache, {rep.seconds:.0f} s)")
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if rep.left_out:
        print(f"warning: {len(rep.left_out)} unit(s) left out of the figures; see the report", file=sys.stderr)
    if rep.violations:
        print(f"reproduce: CHECKS FAILED: {len(rep.violations)} violation(s); see {rep.report_path}", file=sys.stderr)
        for b in rep.violations[:10]:
            print(f"  {b}", file=sys.stderr)
        return 1
    return 0


def largest_command(args) -> int:
    """``python -m workbench largest``: print the table (and write it as CSV with ``--out``)."""
    from workbench.model.units import parse_size

    fams = tuple(args.family) if args.family else FAMILIES
    devs = tuple(args.devices) if args.devices else ((2, 4) if args.quick else (2, 4, 8))
    methods = METHODS if not args.quick else tuple(m for m in METHODS if m[1] != "ilp")
    memory = parse_size(args.memory, what="memory")
    df = largest_table(fams, devs, memory, methods, time_limit=args.time_limit,
                       progress=print, platform_kw={"zero_grad": getattr(args, "zero_grad", None) or "none"})
    if not (df["size"] > 0).any():      # an infeasible answer: said, not a table of zeros and NaN, and exit 2
        from workbench.experiments.largest import family_chain, parameters
        from workbench.model.units import format_bytes

        smallest = {f: family_chain(f, 1 if f == "depth" else 64) for f in fams}
        print(f"error: nothing fits in {format_bytes(memory)} per device: no method fits even the smallest model ("
              + "; ".join(f"{f}: {parameters(f, 1 if f == 'depth' else 64) / 1e6:.2f} M parameters, "
                          f"{format_bytes(float(c.weights.sum()))} of weights" for f, c in smallest.items())
              + f") on {', '.join(map(str, devs))} device(s)", file=sys.stderr)
        return 2
    print()
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if args.out:
        from workbench.io import write_frame_atomic

        write_frame_atomic(args.out, df)
        print(f"wrote {args.out}")
    return 0
