"""Benchmark the planners on the peer profiles: period, ratio to the bound, peak memory, planner time.

For every peer profile (``pipedream/<net>``, skipped if the folder is
absent), P in {2, 4, 8}, and two memory settings (unlimited, and tight =
1.2 x the least memory any contiguous plan needs), it runs every method and
prints one row per (profile, P, memory, method). Then it times the exact DP
on a random 400-layer chain with 16 devices.

Timings: ``time_s`` is wall-clock, ``cpu_s`` the process CPU time; on a
shared machine both are noisy (wall-clock the more), compare orders of
magnitude only.

    .venv/bin/python benchmarks/planners.py                 # everything
    .venv/bin/python benchmarks/planners.py --profiles vgg16 resnet50 --devices 4
    .venv/bin/python benchmarks/planners.py --csv build/planners.csv
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.methods import METHODS as REGISTRY  # noqa: E402
from workbench.model.chain import Chain, Layer  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.planners import plan as run_planner  # noqa: E402
from workbench.planners.dp.contiguous import least_contiguous_memory, plan_dp  # noqa: E402

#: the checked periodic baselines and the flushed schedules (workbench.methods)
METHODS = [m.name for m in REGISTRY if m.baseline or m.family == "flushed"]


def fmt_mem(b: float) -> str:
    return "-" if not math.isfinite(b) else f"{b / 2**30:.2f}"


def run_one(chain: Chain, platform: Target, method: str) -> dict:
    t0 = time.perf_counter()
    c0 = time.process_time()
    try:
        p = run_planner(chain, platform, method)
        err = ""
    except Exception as e:  # noqa: BLE001 - a benchmark reports failures, it does not stop
        return {"method": method, "period_ms": math.nan, "ratio": math.nan, "peak_GiB": "-", "fits": "error",
                "time_s": time.perf_counter() - t0, "note": f"{type(e).__name__}: {e}"[:60]}
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if not p.feasible:
        return {"method": method, "period_ms": math.nan, "ratio": math.nan, "peak_GiB": "-", "fits": "infeasible",
                "time_s": dt, "cpu_s": cpu, "note": (p.notes[0] if p.notes else "")[:60]}
    return {"method": method, "period_ms": p.period * 1e3, "ratio": p.ratio_to_bound(),
            "peak_GiB": fmt_mem(p.peak_memory), "fits": "yes" if p.fits else "NO", "time_s": dt, "cpu_s": cpu,
            "note": "graph order" if p.chain_order else err}


def profiles_table(names: list[str] | None, devices: list[int], methods: list[str], tight: float) -> pd.DataFrame:
    from workbench.profiles import available_profiles, load_profile

    avail = {k: v for k, v in available_profiles().items() if k.startswith("pipedream/")}
    if not avail:
        print("no PipeDream profiles found (data/profiles/pipedream or $WORKBENCH_PEER_PROFILES): skipping the "
              "profile table")
        return pd.DataFrame()
    rows = []
    for name in sorted(avail):
        if names and name.split("/", 1)[1] not in names:
            continue
        chain = load_profile(name)
        for P in devices:
            base = Target.of(P, bandwidth="12GB/s", memory_model="paper")
            need, _ = least_contiguous_memory(chain, base)
            for label, plat in (("unlimited", base), (f"{tight:g}x least={need * tight / 2**30:.2f}GiB",
                                                      base.with_(memory=need * tight))):
                for m in methods:
                    r = run_one(chain, plat, m)
                    rows.append({"profile": name.split("/", 1)[1], "P": P, "memory": label, **r})
                    print(f"  {name:26s} P={P} {label:26s} {m:10s} {r['period_ms']:9.2f} ms  "
                          f"{r['fits']:10s} {r['time_s']:6.2f} s", file=sys.stderr)
    return pd.DataFrame(rows)


def dp_timing(L: int = 400, P: int = 16, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    chain = Chain(tuple(Layer(f"l{i}", float(rng.uniform(1e-4, 3e-3)), float(rng.uniform(2e-4, 6e-3)),
                              float(rng.integers(0, 50_000_000)), float(rng.integers(100_000, 50_000_000)))
                        for i in range(L)))
    base = Target.of(P, bandwidth="12GB/s", memory_model="paper")
    need, _ = least_contiguous_memory(chain, base)
    rows = []
    for label, plat in (("unlimited", base), ("1.05x least", base.with_(memory=need * 1.05)),
                        ("1.5x least", base.with_(memory=need * 1.5)), ("3x least", base.with_(memory=need * 3))):
        t0, c0 = time.perf_counter(), time.process_time()
        p = plan_dp(chain, plat)
        rows.append({"chain": f"random L={L}", "P": P, "memory": label, "period_ms": p.period * 1e3,
                     "status": p.status, "time_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", nargs="*", default=None, help="peer profile names (default: all)")
    ap.add_argument("--devices", nargs="*", type=int, default=[2, 4, 8])
    ap.add_argument("--methods", nargs="*", default=METHODS)
    ap.add_argument("--tight", type=float, default=1.2, help="tight memory = this x the least contiguous need")
    ap.add_argument("--csv", default=None, help="also write the profile table here")
    ap.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    args = ap.parse_args(argv)

    show = (lambda df: df.to_markdown(index=False, floatfmt=".3f")) if args.markdown else (
        lambda df: df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    table = profiles_table(args.profiles, args.devices, args.methods, args.tight)
    if len(table):
        print(show(table))
        if args.csv:
            Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(args.csv, index=False)
    print()
    print("exact DP on a random chain (shared machine: timings noisy)")
    print(show(dp_timing()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
