"""Benchmark of the general ILP at cluster scale: proven count, gap, time and gain over dp.

    .venv/bin/python benchmarks/ilp.py                       # everything below (about 3 hours at 60 s a solve)
    .venv/bin/python benchmarks/ilp.py --quick               # 16x4 and 16x8, one seed, alexnet and resnet50, 10 s
    .venv/bin/python benchmarks/ilp.py --no-profiles --sizes 24x4,32x4 --fractions 0.5
    .venv/bin/python benchmarks/ilp.py --no-random --profiles resnet50,vgg16 --levels 0,3
        [--time-limit 60] [--seeds 3] [--allocation general] [--csv results.csv]

**Random chains** (``--sizes``, default 16x4, 24x4, 32x4, 16x8, 24x8, 32x8; ``--seeds`` of each): layers
with forward 0.5-10, backward 0.5-20, weights 1-60 and activations 1-40 (the paper's memory model,
weight stashing, a link of 2-10 bytes per second), at three memory levels (``--fractions``): the limit is
the least memory any plan needs plus 0.25, 0.5 or 0.75 of the way to the peak of the unconstrained
contiguous DP plan, so it binds.

**PipeDream's profiles on 8 devices** (``--profiles``, default all nine): the settings of the committed
figures (``reproduce``: the paper's memory model, 12 GB/s, weight stashing) at the memory levels of
those figures (``--levels``, default all six; the same :func:`~workbench.experiments.complexity.memory_levels`
the sweeps use).

Every solve is ``plan_ilp(..., allocation="general", time_limit=...)``; its plan is re-checked by the
checker (a failure is a bug and is printed). Per instance: status, period, proven gap (to the bound the
ILP proved), seconds, and gain over dp (dp's period / the ILP's - 1; on a DAG, dp in its best layer
order). Per group: proven (status optimal) out of the instances, the largest gap, the largest time, the
mean gain. Targets (issue 26, 2-core machine, 60 s): 24x4 and 32x4 3/3 proven at a binding limit; every
PipeDream profile x 8 at every level within 5 % of its bound; moonshot 32x8 proven. The machine's load
changes every figure: rerun on an idle machine to compare, and compare ratios within one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.chain import Chain, Layer  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.planners.dp.contiguous import plan_dp  # noqa: E402
from workbench.planners.ilp.bounds import least_memory_bound  # noqa: E402
from workbench.planners.ilp.planner import plan_ilp  # noqa: E402
from workbench.verify.check import check  # noqa: E402

SIZES = "16x4,24x4,32x4,16x8,24x8,32x8"
PROFILES = "alexnet,vgg16,resnet18,resnet50,resnet101,inception_v3,densenet121,nasnetamobile,gnmt"


def random_instance(seed: int, L: int, P: int, frac: float = 0.5) -> tuple[Chain, Target]:
    """A random chain of L layers on P devices, its memory limit ``frac`` of the way from the least any plan
    needs to the peak of the unconstrained contiguous DP plan."""
    rng = np.random.default_rng(seed)
    layers = tuple(Layer(f"l{i}", float(rng.uniform(0.5, 10)), float(rng.uniform(0.5, 20)),
                         float(rng.integers(1, 60)), float(rng.integers(1, 40))) for i in range(L))
    ch = Chain(layers, input_bytes=float(rng.integers(1, 40)))
    plat = Target.of(P, bandwidth=float(rng.uniform(2, 10)), memory_model="paper")
    need, _ = least_memory_bound(ch, plat)
    free = plan_dp(ch, plat, graph=False).peak_memory
    return ch, plat.with_(memory=need + frac * max(free - need, 0.0))


def figure_levels(chain: Chain, devices: int) -> tuple[Target, list[float]]:
    """The platform and memory levels of the committed figures for ``chain`` on ``devices`` devices."""
    from workbench.experiments.complexity import memory_levels
    from workbench.experiments.settings import platform_for, settings_for
    from workbench.methods import names

    s = settings_for()
    platform = platform_for(s, devices)
    methods = tuple(names(baseline=True)) + tuple(names(family="flushed"))
    return platform, memory_levels(chain, platform, s.n_levels, methods=methods)


def solve(group: str, name: str, level: str, chain: Chain, plat: Target, allocation: str,
          time_limit: float) -> dict:
    """One ILP solve, re-checked, against dp."""
    t = time.perf_counter()
    p = plan_ilp(chain, plat, allocation=allocation, time_limit=time_limit)
    sec = time.perf_counter() - t
    dp = plan_dp(chain, plat)
    bad = check(p, chain, plat) if p.feasible else []
    if bad:
        print(f"BUG: the checker rejects the ILP's plan of {name} at {level}: {bad[0]}", flush=True)
    return {"group": group, "instance": name, "level": level, "L": len(chain), "P": plat.devices,
            "memory": plat.memory, "status": p.status, "period": p.period if p.feasible else None,
            "dp_period": dp.period if dp.feasible else None, "gap": p.gap if p.feasible else None,
            "gain_vs_dp": (dp.period / p.period - 1) if p.feasible and dp.feasible else None,
            "seconds": round(sec, 2), "valid": not bad, "found_by": p.extra.get("solve", {}).get("found_by"),
            "bound_by": p.extra.get("solve", {}).get("bound_by")}


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per group and level: proven out of n, largest gap, largest and mean time, mean and largest gain."""
    return df.groupby(["group", "level"], sort=False).agg(
        proven=("status", lambda s: f"{int((s == 'optimal').sum())}/{len(s)}"),
        max_gap=("gap", "max"), max_s=("seconds", "max"), mean_s=("seconds", "mean"),
        mean_gain=("gain_vs_dp", "mean"), max_gain=("gain_vs_dp", "max"), valid=("valid", "all"))


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--sizes", default=SIZES, help=f"random sizes L x P (default {SIZES})")
    ap.add_argument("--fractions", default="0.25,0.5,0.75", help="random: memory levels (default 0.25,0.5,0.75)")
    ap.add_argument("--profiles", default=PROFILES, help="PipeDream profiles (default all nine)")
    ap.add_argument("--levels", default="all", help="PipeDream: levels of the figures, e.g. 0,3 (default all)")
    ap.add_argument("--devices", type=int, default=8, help="PipeDream: devices (default 8)")
    ap.add_argument("--allocation", choices=("contiguous", "general"), default="general")
    ap.add_argument("--no-random", action="store_true")
    ap.add_argument("--no-profiles", action="store_true")
    ap.add_argument("--quick", action="store_true", help="16x4 and 16x8, one seed, alexnet and resnet50, 10 s")
    ap.add_argument("--csv", default=None, help="also write the rows here")
    a = ap.parse_args(argv)
    if a.quick:
        a.sizes, a.seeds, a.profiles, a.levels, a.time_limit, a.fractions = "16x4,16x8", 1, "alexnet,resnet50", \
            "0,5", 10.0, "0.5"
    rows = []
    if not a.no_random:
        for size in a.sizes.split(","):
            L, P = (int(v) for v in size.split("x"))
            for frac in (float(f) for f in a.fractions.split(",")):
                for seed in range(a.seeds):
                    ch, plat = random_instance(seed, L, P, frac)
                    rows.append(solve(size, f"random{seed}", f"frac {frac:g}", ch, plat, a.allocation, a.time_limit))
                    print(rows[-1], flush=True)
    if not a.no_profiles:
        from workbench.profiles import load_profile

        for net in a.profiles.split(","):
            ch = load_profile(f"pipedream/{net}")
            base, levels = figure_levels(ch, a.devices)
            pick = range(len(levels)) if a.levels == "all" else [int(v) for v in a.levels.split(",")]
            for i in pick:
                plat = base.with_(memory=levels[i])
                rows.append(solve(f"{net} x{a.devices}", net, f"level {i}", ch, plat, a.allocation, a.time_limit))
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    if a.csv:
        df.to_csv(a.csv, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(df.drop(columns=["memory"]).to_string(index=False))
        print()
        print(summary(df).to_string())
    return df


if __name__ == "__main__":
    main()
