"""Time limits and deterministic budgets of the ILP: rates, overruns, repeatability.

    .venv/bin/python benchmarks/ilp_budget.py [--quick] [--rates] [--limits 2,10] [--repeat]

Three tables (issue 17):

* ``--rates``: how often each search polls its deadline per second (the ticks of
  :mod:`workbench.planners.budget`) and HiGHS's nodes per second, each search run for a few
  seconds against a wall-clock deadline; ``TICKS_PER_SECOND`` and
  ``MILP_NODES_PER_SECOND`` in the budget module come from this table.
* time limits: the wall time of ``plan(..., "ilp", allocation="general", time_limit=T)``
  against the target ``1.1 T + 2 s``, per instance and limit, with the plan and its gap;
* ``--repeat``: two runs of each instance with ``deterministic=True``: identical plans?

Instances: a synthetic chain of 600 layers on 4 devices with a binding memory limit (no
peer profiles needed), the bundled resnet101 on 4 devices, and PipeDream's resnet50 and
nasnetamobile on 8 devices when the peer profiles are there. Timings are noisy on the shared
2-core machine: compare within one run.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.chain import Chain, Layer  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.planners import plan  # noqa: E402
from workbench.planners.budget import WorkDeadline  # noqa: E402


def synthetic(L: int = 600, seed: int = 1) -> Chain:
    """Random layers: 0.5-3 ms forward, 1-6 ms backward, up to 4 MB of weights and activations."""
    r = random.Random(seed)
    return Chain(tuple(Layer(f"l{i}", r.uniform(0.5, 3) * 1e-3, r.uniform(1, 6) * 1e-3, r.uniform(0, 4e6),
                             r.uniform(1e5, 4e6)) for i in range(L)), input_bytes=1e6)


def instances(quick: bool) -> dict[str, tuple[Chain, Target]]:
    from workbench.paths import peer_profiles_dir
    from workbench.profiles import load_profile

    # the synthetic chain is sized for the paper's rule 7 (under the full model with Adam nothing fits 1 GB)
    out = {"synthetic600 x 4 @1GB": (synthetic(), Target.of(4, memory=1e9, bandwidth=12e9, memory_model="paper")),
           "resnet101 x 4 @3GiB": (load_profile("resnet101"), Target.of(4, memory="3GiB", bandwidth="12GB/s"))}
    if peer_profiles_dir() is not None and not quick:
        out["pipedream/resnet50 x 8 @8GiB"] = (load_profile("pipedream/resnet50"),
                                               Target.of(8, memory="8GiB", bandwidth="12GB/s"))
        out["pipedream/nasnetamobile x 8 @4GiB"] = (load_profile("pipedream/nasnetamobile"),
                                                    Target.of(8, memory="4GiB", bandwidth="12GB/s"))
    return out


def _polls(run, seconds: float) -> float:
    """Polls per second of ``run(deadline)`` against a wall-clock deadline ``seconds`` away."""
    d = WorkDeadline(10**15, wall=time.perf_counter() + seconds)
    t = time.perf_counter()
    run(d)
    return d.used / max(time.perf_counter() - t, 1e-9)


def rates(chain: Chain, platform: Target, seconds: float) -> dict[str, float]:
    """Polls per second of each search, and HiGHS nodes per second, on ``chain`` coarsened to 32 and 16 blocks."""
    from workbench.planners.blocks import block_groups
    from workbench.planners.dp.contiguous import plan_dp
    from workbench.planners.ilp.cover import TooManySets, cover_search
    from workbench.planners.ilp.model import build_model
    from workbench.planners.ilp.search import guided_search, local_search
    from workbench.planners.ilp.solve import solve_model
    from workbench.planners.ilp.stage_bound import stage_path_bound

    fine = plan_dp(chain, platform, graph=False)
    b32 = chain.coarsen(block_groups(chain, 32, platform))
    b16 = chain.coarsen(block_groups(chain, 16, platform))
    dp32, dp16 = plan_dp(b32, platform, graph=False), plan_dp(b16, platform, graph=False)
    row = {"local_search": _polls(lambda d: local_search(b32, platform, dp32, deadline=d), seconds),
           "guided_search": _polls(lambda d: guided_search(chain, platform, fine, deadline=d), seconds),
           "bound": _polls(lambda d: stage_path_bound(chain, platform, fine.period, rel=1e-9, deadline=d), seconds)}
    try:
        row["cover"] = _polls(lambda d: cover_search(b16, platform, dp16.period, deadline=d), seconds)
    except TooManySets:
        row["cover"] = float("nan")
    m = build_model(b32, platform, allocation="general", period_bounds=(0.5 * dp32.period, dp32.period * (1 + 1e-7)))
    t = time.perf_counter()
    res = solve_model(m, time_limit=4 * seconds)
    row["milp_nodes"] = res.extra_info.mip_node_count / (time.perf_counter() - t)
    return row


def limit_row(name: str, chain: Chain, platform: Target, limit: float) -> dict:
    t = time.perf_counter()
    p = plan(chain, platform, "ilp", allocation="general", time_limit=limit)
    wall = time.perf_counter() - t
    return {"instance": name, "limit_s": limit, "wall_s": round(wall, 2), "target_s": round(1.1 * limit + 2, 2),
            "within": wall <= 1.1 * limit + 2, "status": p.status, "period_s": p.period,
            "gap": None if p.gap is None else round(p.gap, 4)}


def repeat_row(name: str, chain: Chain, platform: Target, limit: float) -> dict:
    runs, walls = [], []
    for _ in range(2):
        t = time.perf_counter()
        p = plan(chain, platform, "ilp", allocation="general", time_limit=limit, deterministic=True)
        walls.append(round(time.perf_counter() - t, 1))
        runs.append((p.period, p.assignment, p.status, p.gap, tuple((s.fwd_start, s.bwd_start) for s in p.stages),
                     p.extra.get("deterministic")))
    return {"instance": name, "limit_s": limit, "wall_s": walls, "identical": runs[0][:5] == runs[1][:5],
            "period_s": runs[0][0], "not_cut_short": [r[5] for r in runs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the two instances without peer profiles, limit 2 s")
    ap.add_argument("--rates", action="store_true", help="measure the polling rates (slow)")
    ap.add_argument("--repeat", action="store_true", help="two deterministic runs per instance")
    ap.add_argument("--limits", default=None, help="comma-separated time limits (default 2,10; quick: 2)")
    args = ap.parse_args(argv)
    cases = instances(args.quick)
    pd.set_option("display.width", 200)
    if args.rates:
        table = pd.DataFrame([{"instance": n, **rates(c, p, 3.0)} for n, (c, p) in cases.items()])
        print("polls (ticks) per second of each search; HiGHS nodes per second")
        print(table.round(1).to_string(index=False))
    limits = [float(x) for x in (args.limits or ("2" if args.quick else "2,10")).split(",")]
    table = pd.DataFrame([limit_row(n, c, p, T) for n, (c, p) in cases.items() for T in limits])
    print("\nwall time of the general ILP against its time limit (target: 1.1 x limit + 2 s)")
    print(table.to_string(index=False))
    if args.repeat:
        table = pd.DataFrame([repeat_row(n, c, p, limits[-1]) for n, (c, p) in cases.items()])
        print("\ntwo deterministic runs\n" + table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
