"""torch's multi-stage schedules as planning methods, one per torch schedule of :mod:`workbench.schedules.registry`
(``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb``, ``zbv``, ``dualpipev``; docs/model.md, "Torch's schedules").

A plan is a partition of the chain into S = P V stages (V = ``chunks``
stages per device, fixed at 2 for the V schedules), laid out as torch lays
them out (:meth:`workbench.schedules.registry.Schedule.stage_devices`), run in the order
torch's own class produces (:func:`workbench.schedules.torch_orders.torch_order`) for
``micro_batches`` micro-batches (default 4 P), then a flush. It is simulated
(:func:`workbench.schedules.simulate_orders.simulate_order`): its period is the
makespan over the micro-batches, its memory the simulated peak per device.

**The partition, balanced by time under the memory limit.** The order does
not depend on the partition, and a device's memory changes only at its own
operations, so each device's peak is read off the order exactly, without
running the clock (:class:`workbench.schedules.order_memory.OrderMemory`: during each of its operations, per stage
the micro-batches held and the weight gradients pending, times the memory
model's terms, :mod:`workbench.model.memory`, plus the running operation's
excess; the optimizer's step after the flush). The search:

1. the time-balanced partition: the least largest stage time ``tau`` such that
   a partition has every stage within ``tau`` (bisection over the distinct stage
   times, each probe a DP over (stage, first layer) reachability), each stage then as close as allowed to
   an equal share of the compute left; if it fits, it is the plan;
2. otherwise seeds from shares of the limit per stage (equal per device, by
   need, by the most micro-batches the stage holds; a device's stages' needs
   added up bound its peak, so a partition within the shares fits), each
   improved by a local search that moves one stage boundary at a time to the
   best neighbour, first towards fitting, then towards a smaller largest
   stage time and more even device loads;
3. every candidate is simulated; the fastest that fits is the plan.

Without ``micro_batches`` the flush holds 4 P, 2 P or P micro-batches: of
those torch takes, the count whose plan is fastest within the limit (fewer
micro-batches hold less memory and add bubble). A heuristic, not
an optimum (status ``feasible``); on random small chains it finds a fitting
partition where exhaustive search does in 39 of 40 cases, 2.5 % slower on
average (``tests/test_torch_schedules.py`` holds the comparison). A plan that
cannot fit says so (``plan.fits`` is False), as the flushed schedules do.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1, 1) for i in range(8)), input_bytes=1)
>>> p = TORCH_PLANNERS["interleaved-1f1b"](ch, Platform(2, memory_model="paper"), micro_batches=4)
>>> [(s.first, s.last, s.device) for s in p.stages], p.period   # (m v + p - 1)(f + b) / m = 9 x 6 / 4
([(0, 1, 0), (2, 3, 1), (4, 5, 0), (6, 7, 1)], 13.5)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from workbench.model.chain import Chain, Platform
from workbench.model.memory import LayerTerms, flushed_platform, layer_terms
from workbench.model.memory_bands import square_terms
from workbench.model.plan import Plan, Stage, infeasible_plan, lower_bound, with_memory_setup
from workbench.model.split import split_columns, split_note
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes, format_seconds
from workbench.schedules.ops import Op
from workbench.schedules.order_cache import load_answer
from workbench.schedules.order_memory import OrderMemory
from workbench.schedules.registry import TORCH_SCHEDULES
from workbench.schedules.simulate_orders import held_counts, simulate_order
from workbench.schedules.torch_orders import order_counts, torch_order, torch_schedule

__all__ = ["plan_torch_schedule", "TORCH_PLANNERS"]


@dataclass
class _Problem:
    """One schedule's partition problem: per layer compute, per stage its device and counts, the memory
    terms (L x L matrices over stage first x last layer) and the limit."""

    chain: Chain
    platform: Platform
    dev: list[int]
    k: list[int]
    p: list[int]
    comp: np.ndarray
    terms: LayerTerms

    def __post_init__(self) -> None:
        L = len(self.chain)
        self.pre = np.concatenate([[0.0], np.cumsum(self.comp)])
        first, last = np.arange(L)[:, None], np.arange(L)[None, :]
        self.span = np.where(last >= first, self.pre[last + 1] - self.pre[first], np.inf)
        sq = square_terms(self.terms)
        pend = np.concatenate([[0.0], np.cumsum(split_columns(self.chain)[1])])
        pend_sq = np.where(last >= first, pend[last + 1] - pend[first], 0.0)
        if self.platform.memory_model != "full":
            pend_sq = np.zeros_like(pend_sq)
        base = sq.static + sq.extra - self.terms.const
        self.mem = [np.where(last >= first, k * sq.A + base + q * pend_sq, np.inf) for k, q in zip(self.k, self.p)]

    def feasible(self, tau: float, caps: Sequence[float]) -> list[np.ndarray] | None:
        """Backward reachability: ``can[s][a]`` is True when layers a.. split into stages s.. within ``tau``
        and the caps; None when stage 0 cannot start at layer 0."""
        L, S = len(self.comp), len(self.k)
        can = [np.zeros(L + 1, dtype=bool) for _ in range(S + 1)]
        can[S][L] = True
        nxt_index = np.minimum(np.arange(L)[None, :] + 1, L)            # the layer after a stage ending at b
        for s in range(S - 1, -1, -1):
            ok = (self.span <= tau * (1 + REL_TOL)) & (self.mem[s] <= caps[s] * (1 + REL_TOL))
            can[s][:L] = np.any(ok & can[s + 1][nxt_index], axis=1)
        return can if can[0][0] else None

    def pick(self, tau: float, caps: Sequence[float], can: list[np.ndarray]) -> list[tuple[int, int]]:
        """A partition within ``tau`` and the caps: each stage as close as allowed to an equal share of the
        compute left."""
        L, S = len(self.comp), len(self.k)
        out, a = [], 0
        for s in range(S):
            ends = np.arange(a, L)
            ok = (self.span[a, a:] <= tau * (1 + REL_TOL)) & (self.mem[s][a, a:] <= caps[s] * (1 + REL_TOL)) \
                & can[s + 1][ends + 1]
            target = (self.pre[L] - self.pre[a]) / (S - s)
            choice = ends[ok][np.argmin(np.abs(self.span[a, a:][ok] - target))]
            out.append((a, int(choice)))
            a = int(choice) + 1
        return out

    def least_tau(self, caps: Sequence[float]) -> list[tuple[int, int]] | None:
        """The partition at the least feasible largest stage time, or None: a bisection over the distinct
        stage times (the optimum is one of them)."""
        if not hasattr(self, "_taus"):
            finite = self.span[np.isfinite(self.span)]
            self._taus = np.unique(finite[finite >= self.comp.max()])
        taus = self._taus
        can = self.feasible(float(taus[-1]), caps)
        if can is None:
            return None
        lo, hi, best = 0, len(taus) - 1, can
        while lo < hi:
            mid = (lo + hi) // 2
            got = self.feasible(float(taus[mid]), caps)
            if got is None:
                lo = mid + 1
            else:
                hi, best = mid, got
        return self.pick(float(taus[hi]), caps, best)

    def needs(self, parts: list[tuple[int, int]]) -> list[float]:
        return [float(self.mem[s][a, b]) for s, (a, b) in enumerate(parts)]


def _shares(prob: _Problem, base: list[tuple[int, int]], devices: int) -> list[list[float]]:
    """The shares of the limit per stage tried as seeds: equal per device, by need under ``base``, by held
    count."""
    def per_device(weights: Sequence[float]) -> list[float]:
        tot = [0.0] * devices
        for s, w in enumerate(weights):
            tot[prob.dev[s]] += w
        return [w / tot[prob.dev[s]] if tot[prob.dev[s]] > 0 else 1.0 for s, w in enumerate(weights)]

    return [per_device([1.0] * len(prob.k)), per_device(prob.needs(base)), per_device([float(k) for k in prob.k])]


def _score(prob: _Problem, peaks: OrderMemory, parts: list[tuple[int, int]], limit: float
           ) -> tuple[float, float, float]:
    """(how far the worst device is over the limit, the largest stage time, the sum of squared device loads)."""
    over = max(0.0, max(peaks.peaks(parts)) - limit) if np.isfinite(limit) else 0.0
    times = [prob.pre[b + 1] - prob.pre[a] for a, b in parts]
    load = [0.0] * prob.platform.devices
    for s, t in enumerate(times):
        load[prob.dev[s]] += t
    return over, max(times), float(sum(x * x for x in load))


def _local_search(prob: _Problem, peaks: OrderMemory, parts: list[tuple[int, int]], limit: float
                  ) -> list[tuple[int, int]]:
    """Move one stage boundary at a time (by one layer, or by a few) to the best neighbour, first towards
    fitting the limit, then towards a smaller largest stage time, until no move helps."""
    L = len(prob.comp)
    bounds = [b for _, b in parts[:-1]]
    steps = sorted({1, max(1, L // (4 * len(parts)))})
    best = _score(prob, peaks, parts, limit)
    for _ in range(4 * L):
        found = None
        for i in range(len(bounds)):
            for step in steps:
                for delta in (-step, step):
                    nb = bounds[i] + delta
                    lo = bounds[i - 1] + 1 if i > 0 else 0
                    hi = bounds[i + 1] - 1 if i + 1 < len(bounds) else L - 2
                    if not lo <= nb <= hi:
                        continue
                    trial = bounds[:i] + [nb] + bounds[i + 1:]
                    sc = _score(prob, peaks, _parts(trial, L), limit)
                    if sc < best and (found is None or sc < found[0]):
                        found = (sc, trial)
        if found is None:
            break
        best, bounds = found
    return _parts(bounds, L)


def _parts(bounds: Sequence[int], L: int) -> list[tuple[int, int]]:
    starts = [0] + [b + 1 for b in bounds]
    return [(a, e) for a, e in zip(starts, list(bounds) + [L - 1])]


def _candidates(prob: _Problem, peaks: OrderMemory, limit: float, devices: int) -> list[list[tuple[int, int]]]:
    """Partitions to simulate: the time-balanced one and, under a finite limit, seeds from shares of the limit
    per stage (the sum of its stages' needs bounds a device's peak), each improved by :func:`_local_search`."""
    inf = [np.inf] * len(prob.k)
    base = prob.least_tau(inf)
    if base is None:
        return []
    if not np.isfinite(limit) or max(peaks.peaks(base)) <= limit * (1 + REL_TOL):
        return [base]
    seeds = [base]
    budget = limit - prob.terms.const
    for share in _shares(prob, base, devices):
        got = prob.least_tau([budget * x for x in share])
        if got is not None:
            seeds.append(got)
    out = []
    for seed in seeds:
        found = _local_search(prob, peaks, seed, limit)
        if found not in out:
            out.append(found)
    return out


def plan_torch_schedule(chain: Chain, platform: Platform, name: str, *, allocation: str = "contiguous",
                        time_limit: float | None = None, micro_batches: int | None = None,
                        chunks: int | None = None, flushes: int = 1, **options: Any) -> Plan:
    """Plan ``chain`` with torch's schedule ``name`` (see the module docstring). Without ``micro_batches``
    the flush holds 4 P, 2 P or P micro-batches, whichever torch takes and plans fastest (all three are tried).

    ``time_limit`` is taken for the planners' common signature and not consulted: a method plans llama3-70b
    on 8 devices in 0.1-0.3 s (measured on the 2-core machine under load), after the one-off import of
    ``torch.distributed.pipelining`` by the first order (1.1 s idle, 2.7 s under load), which is what makes
    ``--time-limit 1`` overrun (3.04-3.31 s for the whole call against 1.1 x 1 + 2 s); only orders cached
    on disk would avoid it."""
    t0 = time.perf_counter()
    P = platform.devices
    sched = torch_schedule(name)
    V = sched.chunks(chunks)
    S = P * V
    if len(chain) < S:
        return infeasible_plan(chain, platform, name, f"{name} with {V} stages on each of {P} devices needs at least "
                               f"{S} layers; the chain has {len(chain)}", solve_seconds=time.perf_counter() - t0)
    if micro_batches is not None and int(micro_batches) < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches!r}")
    counts = [int(micro_batches)] if micro_batches is not None else [4 * P, 2 * P, P]
    dev = sched.stage_devices(P, S)
    best: tuple[bool, float, Any] | None = None
    refused = ""
    say = options.get("progress") or (lambda line: None)
    cold = "torch.distributed.pipelining" not in sys.modules and load_answer((name, P, V, counts[0])) is None
    say(f"{name}: {S} stages on {P} devices, {' or '.join(map(str, counts))} micro-batches, in the order torch's "
        f"{sched.torch_class} gives" + (" (asked of torch: importing torch.distributed.pipelining takes seconds, "
                                        "once; its answers are kept on disk)" if cold else ""))
    for m in counts:
        try:
            order = torch_order(name, P, V, m)
        except ValueError as e:
            if micro_batches is not None:
                raise
            refused = str(e)
            say(f"{name}: {m} micro-batches: {e}")
            continue
        parts, trace = _best_partition(chain, platform, name, order, dev, m, flushes)
        fits = float(trace.peak_memory().max()) <= platform.memory * (1 + REL_TOL)
        say(f"{name}: {m} micro-batches: period {format_seconds(float(trace.period))}, peak "
            f"{format_bytes(float(trace.peak_memory().max()))}{'' if fits else ' (does not fit)'}")
        key = (not fits, float(trace.period) if fits else float(trace.peak_memory().max()))
        if best is None or key < best[:2]:
            best = (key[0], key[1], (parts, trace, m))
    if best is None:
        raise ValueError(refused)
    parts, trace, m = best[2]
    return _plan_of(chain, platform, name, sched.torch_class, parts, dev, trace, m, V, flushes, sched.split_backward,
                    time.perf_counter() - t0)


def _best_partition(chain: Chain, platform: Platform, name: str, order: dict[int, tuple[Op, ...]],
                    dev: list[int], m: int, flushes: int) -> tuple[list[tuple[int, int]], Any]:
    """The fastest candidate partition that fits (else the one needing least memory) and its simulated trace."""
    S = len(dev)
    k, p, _ = order_counts(order, S)
    prob = _Problem(chain, platform, dev, k, p, chain.forward + chain.backward,
                    layer_terms(chain, flushed_platform(platform)))     # a flush's gradients accumulate
    peaks = OrderMemory(chain, platform, dev, order)
    cache: dict[tuple, Any] = {}

    def simulated(parts: list[tuple[int, int]]):
        key = tuple(parts)
        if key not in cache:
            cache[key] = simulate_order(chain, platform, [(a, b, d) for (a, b), d in zip(parts, dev)], order, m,
                                        flushes, schedule=name)
        return cache[key]

    def fits(parts: list[tuple[int, int]]) -> bool:
        return float(simulated(parts).peak_memory().max()) <= platform.memory * (1 + REL_TOL)

    found = _candidates(prob, peaks, platform.memory, platform.devices)
    fitting = [c for c in found if fits(c)]
    chosen = min(fitting, key=lambda c: simulated(c).period) if fitting else \
        min(found, key=lambda c: float(simulated(c).peak_memory().max()))
    return chosen, simulated(chosen)


def _plan_of(chain: Chain, platform: Platform, name: str, torch_class: str, parts: list[tuple[int, int]],
             dev: list[int], trace, m: int, V: int, flushes: int, split: bool, seconds: float) -> Plan:
    """The plan of a simulated partition: stages with mini-batch 0's start times and held counts."""
    ops = trace.ops
    stages = []
    for s, ((a, b), d) in enumerate(zip(parts, dev)):
        mine = ops[(ops["stage"] == s) & (ops["batch"] == 0)]
        f0 = float(mine.loc[mine["kind"] == "F", "start"].min())
        b0 = float(mine.loc[mine["kind"].isin(["B", "I"]), "start"].min())
        stages.append(Stage(a, b, d, f0, b0, max(held_counts(ops, s), 1)))
    assignment = [0] * len(chain)
    for (a, b), d in zip(parts, dev):
        assignment[a:b + 1] = [d] * (b - a + 1)
    peak = tuple(float(x) for x in trace.peak_memory())
    notes = [f"{name}: torch's {torch_class}, {V} stage(s) per device, a flush every {m} micro-batches; "
             f"period = makespan / {m}"]
    if split and (note := split_note(chain)):
        notes.append(note)
    over = max(peak) - platform.memory
    if over > platform.memory * REL_TOL:
        notes.append(f"does not fit: needs {format_bytes(max(peak))}, limit {format_bytes(platform.memory)} "
                     f"(over by {format_bytes(over)})")
    return Plan(period=float(trace.period), assignment=tuple(assignment), stages=tuple(stages),
                devices=platform.devices, memory=peak, memory_limit=platform.memory,
                lower_bound=lower_bound(chain, platform), method=name,
                allocation="general" if V > 1 else "contiguous", status="feasible", solve_seconds=seconds,
                schedule=name, micro_batches=m, extra={"makespan": float(trace.makespan), "flushes": flushes},
                **with_memory_setup(chain, platform, {"notes": tuple(notes)}))


def _planner(name: str):
    """The planner of torch's schedule ``name``: :func:`plan_torch_schedule` with it, named ``plan_<name>``."""
    def plan(chain: Chain, platform: Platform, **options: Any) -> Plan:
        return plan_torch_schedule(chain, platform, name, **options)

    plan.__name__ = plan.__qualname__ = "plan_" + name.replace("-", "_")
    plan.__doc__ = (f"torch's ``{torch_schedule(name).torch_class}`` (:func:`plan_torch_schedule`; options "
                    f"``chunks``, ``micro_batches``).")
    return plan


#: method name -> planner, one per torch schedule of the registry
TORCH_PLANNERS = {name: _planner(name) for name in TORCH_SCHEDULES}
