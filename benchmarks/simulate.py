"""Speed of the simulator and of the schedule builder; prints a table.

    .venv/bin/python benchmarks/simulate.py [--repeats 3]

Targets (issue 3): 8 devices x 1000 mini-batches simulated in under 2 s; a
16-stage contiguous schedule built in well under a millisecond.
"""

from __future__ import annotations

import argparse
import random
import time

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.schedules.builder import Scheduler, best_schedule, build_schedule
from workbench.schedules.registry import SCHEDULES
from workbench.schedules.simulate import simulate, simulate_flushed


def _chain(L: int, seed: int = 0) -> Chain:
    rng = random.Random(seed)
    return Chain(tuple(Layer(f"l{i}", rng.uniform(1e-3, 4e-3), rng.uniform(2e-3, 8e-3), rng.uniform(1e6, 5e7),
                             rng.uniform(1e6, 2e7)) for i in range(L)), input_bytes=4e6)


def _contiguous(L: int, P: int) -> list[int]:
    return [l * P // L for l in range(L)]


def _time(fn, repeats: int) -> float:
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return min(best)


def _time_many(fn, repeats: int, inner: int) -> float:
    return _time(lambda: [fn() for _ in range(inner)], repeats) / inner


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    r = args.repeats
    rows: list[tuple[str, str, float, str]] = []

    # ----- simulator -----------------------------------------------------------
    for P, N in ((8, 1000), (16, 1000), (8, 5000)):
        chain = _chain(4 * P)
        plat = Target.of(P, bandwidth="12GB/s", memory_model="paper")
        assign = _contiguous(len(chain), P)
        plan = build_schedule(chain, plat, assign, Scheduler(chain, plat, assign).load_period)
        t = _time(lambda: simulate(plan, chain, plat, batches=N), r)
        rows.append(("simulate periodic", f"{P} devices x {N} mini-batches", t, "< 2 s" if (P, N) == (8, 1000) else ""))
    for kind in [n for n, sched in SCHEDULES.items() if sched.stage_order]:   # GPipe, 1F1B: the ones on an allocation
        chain = _chain(32)
        plat = Target.of(8, bandwidth="12GB/s", memory_model="paper")
        t = _time(lambda: simulate_flushed(chain, plat, _contiguous(32, 8), 32, kind=kind, flushes=4), r)
        rows.append((f"simulate {kind}", "8 devices x 32 micro-batches x 4 flushes", t, ""))

    # ----- builder -------------------------------------------------------------
    for L, P in ((8, 4), (32, 8), (64, 16), (400, 16)):
        chain = _chain(L)
        plat = Target.of(P, bandwidth="12GB/s", memory_model="paper")
        assign = _contiguous(L, P)
        sch = Scheduler(chain, plat, assign)
        T = sch.load_period * 1.1
        size = f"{L} layers, {P} stages"
        rows.append(("Scheduler(...)", size, _time_many(lambda: Scheduler(chain, plat, assign), r, 200), ""))
        rows.append(("Scheduler.times (contiguous)", size, _time_many(lambda: sch.times(T), r, 2000),
                     "< 1 ms" if P == 16 else ""))
        rows.append(("build_schedule (contiguous)", f"{L} layers, {P} stages",
                     _time_many(lambda: build_schedule(chain, plat, assign, T), r, 200), ""))
        least = max(sch.one_in_flight_memory)
        at_t0 = max(sch.memory(sch.load_period))
        lim = plat.with_(memory=least + 0.3 * (at_t0 - least))
        rows.append(("best_schedule (contiguous, memory binding)", f"{L} layers, {P} stages",
                     _time_many(lambda: best_schedule(chain, lim, assign), r, 20), ""))
    for L, P in ((16, 4), (32, 8)):
        chain = _chain(L)
        plat = Target.of(P, bandwidth="12GB/s", memory_model="paper")
        rng = random.Random(1)
        assign = [rng.randrange(P) for _ in range(L)]
        sch = Scheduler(chain, plat, assign)
        T = sch.load_period * 1.1
        rows.append(("Scheduler.times (general, auto)", f"{L} layers, {len(sch.runs)} stages on {P}",
                     _time_many(lambda: sch.times(T), r, 200), ""))
        least = max(sch.one_in_flight_memory)
        lim = plat.with_(memory=least * 1.5)
        rows.append(("best_schedule (general)", f"{L} layers, {len(sch.runs)} stages on {P}",
                     _time_many(lambda: best_schedule(chain, lim, assign), r, 5), ""))

    w = max(len(a) for a, *_ in rows)
    v = max(len(b) for _, b, *_ in rows)
    print(f"{'what':<{w}}  {'size':<{v}}  {'time':>12}  target")
    for a, b, t, target in rows:
        ts = f"{t * 1e3:9.3f} ms" if t >= 1e-3 else f"{t * 1e6:9.1f} us"
        print(f"{a:<{w}}  {b:<{v}}  {ts:>12}  {target}")


if __name__ == "__main__":
    main()
