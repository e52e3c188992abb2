"""How ``dp`` scales with the chain: long chains on 64 devices, with and without a memory limit.

Targets (issue 17, on the project's 2-core CPU machine): 2,000 layers x 64 devices
in under 5 s and 10,000 layers x 64 devices in under 30 s and 2 GB, with a
binding memory limit and without one. Each case runs in a fresh process, so
``peak_MB`` is that process's peak resident memory (Python, numpy and the
workbench included, about 100 MB of it before planning).

Two chains: ``random`` (seeded layers: forward 0.1-3 ms, backward 0.2-6 ms,
outputs 1-20 MB, saved 1-40 MB, weights 0-20 MB) and ``gpt`` (the zoo GPT of
:mod:`workbench.experiments.largest` grown by depth: the measured d768 block repeated,
with its embedding and head). The memory limit is ``none`` or ``x F``: F the
peak memory of the unconstrained optimum (its first stages hold many
mini-batches), so x < 1 binds; the table says how much slower the optimum
becomes (``period / unconstrained``) and whether the search was exact.

A second table holds time-limited cases: 50,000 random layers x 64 devices at 256 GiB with a 20 s limit
(issue 39's audit: 32.7 s and no plan; on a long chain whose limit binds, a probe far above the optimum costs
a minute, so dp first plans on blocks of ten layers, ``workbench.planners.dp.coarse_start``; the optimum
there is 12.193 s, found without a limit in 628 s on the shared machine). Within the limit means within 10 %
+ 2 s of it, as every planner promises.

    .venv/bin/python benchmarks/dp_scale.py            # the tables
    .venv/bin/python benchmarks/dp_scale.py --quick    # 2,000 layers only, no time-limited case
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.chain import Chain, Layer  # noqa: E402
from workbench.model.target import Target  # noqa: E402

TARGETS = {2000: (5.0, None), 10000: (30.0, 2000.0)}   # layers -> (seconds, MB)


def random_chain(L: int, seed: int = 0) -> Chain:
    """Seeded layers of a few milliseconds and megabytes (see the module docstring)."""
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(L):
        layers.append(Layer(f"l{i}", float(rng.uniform(1e-4, 3e-3)), float(rng.uniform(2e-4, 6e-3)),
                            float(rng.uniform(0, 2e7)), float(rng.uniform(1e6, 2e7)), float(rng.uniform(1e6, 4e7))))
    return Chain(tuple(layers), input_bytes=1e6)


def make_chain(kind: str, L: int) -> Chain:
    if kind == "random":
        return random_chain(L)
    from workbench.experiments.largest import family_chain

    return family_chain("depth", L - 2)   # embedding + L - 2 blocks + head


def one_case(kind: str, L: int, P: int, fraction: float) -> dict:
    """Plan one case in this process; the figures as a dict (run by the parent in a child process)."""
    from workbench.planners.dp.contiguous import plan_dp

    chain = make_chain(kind, L)
    t = time.perf_counter()
    free = plan_dp(chain, Target.of(P))
    free_s = time.perf_counter() - t
    row = {"chain": kind, "layers": L, "devices": P}
    if math.isinf(fraction):
        plan, secs = free, free_s
        row["limit"] = "none"
    else:
        platform = Target.of(P, memory=free.peak_memory * fraction)
        t = time.perf_counter()
        plan = plan_dp(chain, platform)
        secs = time.perf_counter() - t
        row["limit"] = f"{fraction:g} F"
    row.update({"limit_GiB": plan.memory_limit / 2**30 if math.isfinite(plan.memory_limit) else math.inf,
                "status": plan.status, "period_ms": plan.period * 1e3,
                "period/unconstrained": plan.period / free.period, "seconds": secs,
                "peak_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    return row


def limited_case(kind: str, L: int, P: int, memory: str, time_limit: float) -> dict:
    """One time-limited case in this process (run by the parent in a child process)."""
    from workbench.planners.dp.contiguous import plan_dp
    from workbench.verify.check import check

    chain = make_chain(kind, L)
    platform = Target.of(P, memory=memory)
    t = time.perf_counter()
    plan = plan_dp(chain, platform, time_limit=time_limit)
    secs = time.perf_counter() - t
    return {"chain": kind, "layers": L, "devices": P, "memory": memory, "time_limit": time_limit, "seconds": secs,
            "within": secs <= 1.1 * time_limit + 2.0, "status": plan.status, "period_s": plan.period,
            "gap": plan.gap, "checked": bool(plan.feasible and not check(plan, chain, platform)),
            "peak_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


#: the time-limited cases: (chain, layers, devices, memory, time limit)
LIMITED = [("random", 50_000, 64, "256GiB", 20.0)]


def run_case(kind: str, L: int, P: int, fraction: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", kind, str(L), str(P), repr(fraction)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_limited(kind: str, L: int, P: int, memory: str, time_limit: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--limited", kind, str(L), str(P), memory, repr(time_limit)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 layers only")
    ap.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--limited", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        kind, L, P, fraction = args.case
        print(json.dumps(one_case(kind, int(L), int(P), float(fraction))))
        return 0
    if args.limited:
        kind, L, P, memory, limit = args.limited
        print(json.dumps(limited_case(kind, int(L), int(P), memory, float(limit))))
        return 0
    import pandas as pd

    rows = []
    for L in ((2000,) if args.quick else (2000, 10000)):
        for kind in ("random", "gpt"):
            for fraction in (math.inf, 0.6, 0.3):
                rows.append(run_case(kind, L, 64, fraction))
    df = pd.DataFrame(rows)
    df["target"] = [f"< {TARGETS[L][0]:g} s" + (f", < {TARGETS[L][1]:g} MB" if TARGETS[L][1] else "")
                    for L in df["layers"]]
    df["met"] = [r.seconds < TARGETS[r.layers][0] and (TARGETS[r.layers][1] is None or r.peak_MB < TARGETS[r.layers][1])
                 for r in df.itertuples()]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        if not args.quick:
            print()
            print(pd.DataFrame([run_limited(*case) for case in LIMITED]).to_string(
                index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
