"""Benchmark of the plan ILP: solve time and gap against size.

    .venv/bin/python benchmarks/ilp.py [--quick] [--time-limit 60] [--seeds 3] [--allocation general]
                                       [--sizes 16x4] [--milp-too]

Random chains (as in tests/test_ilp.py) with the memory limit binding (halfway
between the least memory any plan needs and the peak of the unconstrained DP
plan), contiguous and general, plus resnet50 from the peer profiles on 8
devices. Targets (issue 4, 2-core machine): contiguous 32 x 8 proven optimal
< 60 s; general 16 x 4 proven optimal < 60 s; resnet50 x 8 a plan < 120 s
with gap <= 5 %. Timings are noisy on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.chain import Chain, Layer, Platform  # noqa: E402
from workbench.planners.dp.contiguous import plan_dp  # noqa: E402
from workbench.planners.ilp.bounds import least_memory_bound  # noqa: E402
from workbench.planners.ilp.planner import plan_ilp  # noqa: E402
from workbench.verify.check import check  # noqa: E402


def random_instance(seed: int, L: int, P: int, frac: float = 0.5) -> tuple[Chain, Platform]:
    rng = np.random.default_rng(seed)
    layers = tuple(Layer(f"l{i}", float(rng.uniform(0.5, 10)), float(rng.uniform(0.5, 20)),
                         float(rng.integers(1, 60)), float(rng.integers(1, 40))) for i in range(L))
    ch = Chain(layers, input_bytes=float(rng.integers(1, 40)))
    plat = Platform(P, bandwidth=float(rng.uniform(2, 10)), memory_model="paper")
    need, _ = least_memory_bound(ch, plat)
    free = plan_dp(ch, plat, graph=False).peak_memory
    return ch, plat.with_(memory=need + frac * max(free - need, 0.0))


def run(name: str, ch: Chain, plat: Platform, allocation: str, time_limit: float, **kw) -> dict:
    t = time.perf_counter()
    p = plan_ilp(ch, plat, allocation=allocation, time_limit=time_limit, **kw)
    sec = time.perf_counter() - t
    dp = plan_dp(ch, plat, graph=False)
    ok = (not p.feasible) or not check(p, ch, plat)
    return {"instance": name, "L": len(ch), "P": plat.devices, "allocation": allocation, "status": p.status,
            "period": p.period, "dp_period": dp.period,
            "gain_vs_dp": (dp.period / p.period - 1) if p.feasible else None,
            "gap": p.gap, "seconds": round(sec, 2), "valid": ok,
            "coarse": p.extra.get("blocks") if isinstance(p.extra, dict) else None}


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--no-resnet", action="store_true")
    ap.add_argument("--no-random", action="store_true", help="resnet50 only")
    ap.add_argument("--allocation", choices=("contiguous", "general"), help="only this allocation")
    ap.add_argument("--sizes", help="these random sizes instead of the default ones, e.g. 16x4,24x4")
    ap.add_argument("--milp-too", action="store_true",
                    help="general: also run the MILP alone (cover=False) beside the default (cover search first)")
    a = ap.parse_args(argv)
    sizes = [("contiguous", 8, 3), ("contiguous", 16, 4), ("contiguous", 32, 8),
             ("general", 8, 3), ("general", 12, 4), ("general", 16, 4)]
    if a.quick:
        sizes = [s for s in sizes if s[1] <= 12]
    if a.allocation:
        sizes = [s for s in sizes if s[0] == a.allocation]
    if a.sizes:  # any L x P, for the allocation(s) asked for
        want = [tuple(int(v) for v in x.split("x")) for x in a.sizes.split(",")]
        allocs = [a.allocation] if a.allocation else ["contiguous", "general"]
        sizes = [(al, L, P) for al in allocs for L, P in want]
    rows = []
    if a.no_random:
        sizes = []
    for alloc, L, P in sizes:
        for seed in range(a.seeds):
            ch, plat = random_instance(seed, L, P)
            variants = [("default", {})]
            if alloc == "general" and a.milp_too:
                variants.append(("milp alone", {"cover": False}))
            for label, kw in variants:
                # cold contiguous (no DP incumbent) measures the ILP itself; the DP is exact there anyway
                r = run(f"random{seed}", ch, plat, alloc, a.time_limit, warm_start=(alloc == "general"), **kw)
                r["variant"] = label
                rows.append(r)
                print(r, flush=True)
    if not a.no_resnet:
        from workbench.profiles import load_profile

        ch = load_profile("pipedream/resnet50")
        base = Platform(8, bandwidth="12GB/s", memory_model="paper")
        need, _ = least_memory_bound(ch, base)
        free = plan_dp(ch, base, graph=False).peak_memory
        for frac in (0.25, 0.5):
            plat = base.with_(memory=need + frac * (free - need))
            for alloc in ("contiguous", "general"):
                if a.allocation and alloc != a.allocation:
                    continue
                r = run(f"resnet50 M={plat.memory / 2**30:.1f}GiB", ch, plat, alloc, 120.0)
                r["variant"] = "default"
                rows.append(r)
                print(r, flush=True)
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.to_string(index=False))
        print()
        print(df.groupby(["allocation", "L", "P", "variant"]).agg(
            solved=("status", lambda s: (s == "optimal").mean()), max_s=("seconds", "max"),
            mean_s=("seconds", "mean"), max_gap=("gap", "max")).to_string())
    return df


if __name__ == "__main__":
    main()
