"""How far a lower bound blind to waits can go: the least no-wait period beside the general ILP's plan and bound.

    .venv/bin/python benchmarks/ilp_waits.py                                  # 24x4 and 32x4, 3 seeds (about 8 min)
    .venv/bin/python benchmarks/ilp_waits.py --no-random --profiles resnet50,densenet121 --levels 0,1,2,3
        [--time-limit 60] [--descent 20] [--seeds 3] [--fraction 0.5] [--csv out.csv]

Every lower bound the general ILP proves today (the stage-path bound, the cover bound, bin-packing
counts) sees an allocation through necessary conditions that hold when no stage waits: loads, link
loads, and each device's memory with ``k = ceil(path / T)`` in flight. The least period that these
conditions allow for one allocation is its *path period*
(:func:`workbench.planners.evaluate.period.path_period`, a lower bound on its exact period); the least
over all allocations, the *no-wait optimum* NW, is the most any such bound can prove. A descent over
allocations on the path period (from the ILP's plan and dp's, with random kicks, ``--descent``
seconds) finds an allocation whose path period NW' is at least NW. So:

* ``plan > NW'``: no bound blind to waits can prove the plan optimal. Either a better plan exists
  (between NW and the plan) or the proof needs a bound that sees waits (the operations of a device's
  stages colliding modulo T);
* on PipeDream's profiles (target: within 5 % of a proven bound), ``plan > 1.05 NW'`` says the same
  of the 5 % target.

Per instance: the ILP's plan (``plan_ilp(..., allocation="general", time_limit=...)``, re-checked by
the checker), the bound it proved, dp's period, NW', ``over`` = plan / NW' - 1, and the exact period of
the allocation NW' came from (:func:`~workbench.planners.evaluate.period.allocation_best`, random
chains only: by how much its waits lengthen it). On the profiles the descent runs on the fine chain in
the ILP plan's layer order. With ``--milp SECONDS`` (random chains), :func:`no_wait_milp` also asks
whether the no-wait relaxation is feasible just below the plan's period: HiGHS's termination
(``convergenceCriteriaSatisfied``: feasible, with the path period of the allocation it found;
``provenInfeasible``: then NW >= the plan; ``maxTimeLimit``) — a check of the descent by another mechanism.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ilp import figure_levels, random_instance  # noqa: E402

from workbench.model.chain import Chain  # noqa: E402
from workbench.model.plan import chain_for_plan  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.planners.dp.contiguous import plan_dp  # noqa: E402
from workbench.planners.evaluate.period import allocation_best, normalise, path_period  # noqa: E402
from workbench.planners.ilp.planner import plan_ilp  # noqa: E402
from workbench.planners.ilp.search import _neighbours  # noqa: E402
from workbench.verify.check import check  # noqa: E402

BETTER = 1e-9


def moves(a: tuple[int, ...], P: int):
    """Allocations one move from ``a``, as the ILP's local search makes them (a whole stage to another device,
    a stage boundary shifted by 2 to 8 layers, one layer to another device; no swaps)."""
    return _neighbours(a, P, 8, swaps=False)


def least_path_period(chain: Chain, platform: Target, starts: list[tuple[int, ...]], seconds: float,
                      seed: int = 0) -> tuple[float, tuple[int, ...]]:
    """First-improvement descent on the path period from each start, then from random two-move kicks of the
    best, for ``seconds``: the least path period found and its allocation."""
    rng = random.Random(seed)
    end = time.perf_counter() + seconds
    P = platform.devices
    best = min((path_period(chain, platform, a), a) for a in starts)
    queue = list(starts)
    while time.perf_counter() < end:
        if queue:
            cur = queue.pop()
        else:
            cur = best[1]
            for _ in range(2):
                cur = rng.choice(list(moves(cur, P)))
        r = path_period(chain, platform, cur)
        improved = True
        while improved and time.perf_counter() < end:
            improved = False
            for m in moves(cur, P):
                v = path_period(chain, platform, m, r * (1 - BETTER))
                if v < r * (1 - BETTER):
                    cur, r, improved = m, v, True
                    break
        if r < best[0]:
            best = (r, cur)
    return best


def no_wait_milp(chain: Chain, platform: Target, T: float, time_limit: float) -> tuple[str, tuple[int, ...] | None]:
    """Is some allocation valid at period T in the no-wait relaxation? A MILP with no schedule: a device per
    layer (the first layer on device 0, devices used in order), device loads within T, and each layer's
    in-flight count K_l with K_l T >= its compute to the end and back plus both transfers of every cut from
    it on, K_l >= K_{l-1} within a stage (a stage holds its first layer's count), each device's sum of
    K_l a_l + w0_l within M (the paper's memory model: no head, tail or buffer terms). Returns HiGHS's
    termination and an allocation when it found one.

    Times are in periods and memory in M: in seconds and bytes (PipeDream's profiles: 1e-2 s, 3e9 bytes)
    HiGHS answered ``provenInfeasible`` on resnet50 x 8 even above dp's period, where dp's allocation keeps
    every constraint (each one evaluated): never read an infeasible answer here as a proof without such a
    check. Scaled, that instance times out at 60 s instead (177 layers x 8 devices)."""
    import numpy as np
    import pyomo.environ as pyo

    from workbench.planners.ilp.bounds import chain_arrays
    from workbench.planners.ilp.solve import solve_model

    comp, down, c, a, w0 = chain_arrays(chain, platform)
    L, P, M = len(chain), platform.devices, platform.memory
    comp, down, c, a, w0 = comp / T, down / T, c / T, a / M, w0 / M     # in periods and memories (docstring)
    k_lo = np.maximum(1, np.ceil(down - 1e-9))
    k_hi = np.maximum(k_lo, np.minimum(np.floor(1 / np.maximum(a, 1e-12)), k_lo + 2 * L + 2))
    m = pyo.ConcreteModel()
    m.y = pyo.Var(range(L), range(P), within=pyo.Binary)
    m.same = pyo.Var(range(1, L), range(P), bounds=(0, 1))         # layers l-1 and l both on device p
    m.cut = pyo.Var(range(L - 1), bounds=(0, 1))                   # a cut between l and l+1
    m.K = pyo.Var(range(L), within=pyo.Integers, bounds=lambda _, l: (k_lo[l], k_hi[l]))
    m.mem = pyo.Var(range(L), range(P), bounds=(0, None))         # layer l's memory if on device p
    m.c = pyo.ConstraintList()
    for l in range(L):
        m.c.add(sum(m.y[l, p] for p in range(P)) == 1)
        m.c.add(m.K[l] >= down[l] + 2 * sum(c[q] * m.cut[q] for q in range(l, L - 1)))
        for p in range(P):
            m.c.add(m.mem[l, p] >= a[l] * m.K[l] + w0[l] - (a[l] * k_hi[l] + w0[l]) * (1 - m.y[l, p]))
    m.c.add(m.y[0, 0] == 1)
    for l in range(1, L):
        for p in range(P):
            if p:
                m.c.add(m.y[l, p] <= sum(m.y[q, p - 1] for q in range(l)))
            m.c.add(m.same[l, p] <= m.y[l, p])
            m.c.add(m.same[l, p] <= m.y[l - 1, p])
            m.c.add(m.same[l, p] >= m.y[l, p] + m.y[l - 1, p] - 1)
        m.c.add(m.cut[l - 1] == 1 - sum(m.same[l, p] for p in range(P)))
        m.c.add(m.K[l] >= m.K[l - 1] - k_hi[l - 1] * m.cut[l - 1])
    for p in range(P):
        m.c.add(sum(comp[l] * m.y[l, p] for l in range(L)) <= 1)
        m.c.add(sum(m.mem[l, p] for l in range(L)) <= 1)
    m.obj = pyo.Objective(expr=0)
    res = solve_model(m, time_limit=time_limit)
    if res.incumbent_objective is None:
        return str(res.termination_condition).split(".")[-1], None
    found = tuple(int(np.argmax([pyo.value(m.y[l, p]) for p in range(P)])) for l in range(L))
    return str(res.termination_condition).split(".")[-1], normalise(found)


def measure(group: str, name: str, level: str, chain: Chain, plat: Target, time_limit: float, descent: float,
            exact: bool, milp: float = 0.0) -> dict:
    """One instance: the ILP's plan and bound, dp, and the least no-wait period found."""
    p = plan_ilp(chain, plat, allocation="general", time_limit=time_limit)
    dp = plan_dp(chain, plat)
    bad = check(p, chain, plat) if p.feasible else []
    if bad:
        print(f"BUG: the checker rejects the ILP's plan of {name} at {level}: {bad[0]}", flush=True)
    fine = chain_for_plan(p, chain)
    same_order = tuple(dp.chain_order or ()) == tuple(p.chain_order or ())    # then dp's allocation is of `fine`
    dp_a = tuple((dp if same_order else plan_dp(fine, plat, graph=False)).assignment)
    nw, a = least_path_period(fine, plat, [normalise(p.assignment), normalise(dp_a)], descent)
    row = {"group": group, "instance": name, "level": level, "plan": p.period, "status": p.status,
           "bound": p.period * (1 - (p.gap or 0.0)), "dp": dp.period, "nowait": nw, "over": p.period / nw - 1,
           "valid": not bad}
    if exact:
        got = allocation_best(fine, plat, a, deadline=time.perf_counter() + 60)
        row["nowait_exact"] = got[0] if got else None
    if milp > 0:            # the no-wait relaxation just below the plan's period
        status, found = no_wait_milp(fine, plat, p.period * (1 - 1e-6), milp)
        row["milp"] = status
        row["milp_path_period"] = path_period(fine, plat, found) if found else None
    return row


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="the ILP's, per instance (default 60)")
    ap.add_argument("--descent", type=float, default=20.0, help="seconds of path-period descent (default 20)")
    ap.add_argument("--sizes", default="24x4,32x4")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--fraction", type=float, default=0.5, help="random: memory level (default 0.5)")
    ap.add_argument("--profiles", default="", help="PipeDream profiles, e.g. resnet50,densenet121 (default none)")
    ap.add_argument("--levels", default="0,1,2,3", help="PipeDream: levels of the figures (default 0,1,2,3)")
    ap.add_argument("--devices", type=int, default=8, help="PipeDream: devices (default 8)")
    ap.add_argument("--milp", type=float, default=0.0,
                    help="seconds for the no-wait MILP just below each plan's period (default 0: not run)")
    ap.add_argument("--no-random", action="store_true")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    rows = []
    if not a.no_random:
        for size in a.sizes.split(","):
            L, P = (int(v) for v in size.split("x"))
            for seed in range(a.seeds):
                ch, plat = random_instance(seed, L, P, a.fraction)
                rows.append(measure(size, f"random{seed}", f"frac {a.fraction:g}", ch, plat, a.time_limit,
                                    a.descent, exact=True, milp=a.milp))
                print(rows[-1], flush=True)
    if a.profiles:
        from workbench.profiles import load_profile

        for net in a.profiles.split(","):
            ch = load_profile(f"pipedream/{net}")
            base, levels = figure_levels(ch, a.devices)
            for i in (int(v) for v in a.levels.split(",")):
                rows.append(measure(f"{net} x{a.devices}", net, f"level {i}", ch, base.with_(memory=levels[i]),
                                    a.time_limit, a.descent, exact=False))
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    if a.csv:
        df.to_csv(a.csv, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.5g}".format):
        print(df.to_string(index=False))
    return df


if __name__ == "__main__":
    main()
