"""torch's multi-stage schedules as planning methods: ``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb``,
``zbv`` and ``dualpipev`` (docs/model.md, "Torch's schedules").

A plan is a partition of the chain into S = P V stages (V = ``chunks``
stages per device, fixed at 2 for the V schedules), laid out as torch lays
them out (:func:`workbench.model.orders.stage_devices`), run in the order
torch's own class produces (:func:`workbench.model.orders.torch_order`) for
``micro_batches`` micro-batches (default 4 P), then a flush. It is simulated
(:func:`workbench.verify.simulate_orders.simulate_order`): its period is the
makespan over the micro-batches, its memory the simulated peak per device.

**The partition, balanced by time under the memory limit.** The order does
not depend on the partition, so it fixes, per stage, the most micro-batches
the stage ever holds (``k_s``) and the most whose weight gradients wait
between ``I`` and ``W`` (``p_s``). A stage ``i..j`` then needs at most
``k_s A + static + p_s pending + excess`` (the memory model's terms,
:mod:`workbench.model.memory`), and a device at most the sum over its stages
(an upper bound on the simulated peak: the maxima need not meet). Given a
share ``phi_s`` of the limit per stage (the shares of a device's stages add up to 1),
the least largest stage time ``tau`` such that a partition has every stage
within ``tau`` and its share is found by bisection, each probe a DP over
(stage, first layer) reachability; the partition picked at ``tau`` gives
each stage about an equal share of the time left. Shares tried: equal, in
proportion to the stages' needs under the time-balanced partition, and in
proportion to ``k_s``; each is then relaxed (scaled up, by bisection) while
the *simulated* peak still fits. Every candidate is simulated and the
fastest one that fits is the plan; a heuristic, not an optimum (the plan's
status is ``feasible``). Without a memory limit the partition is the
time-balanced one. A plan that cannot fit says so (``plan.fits`` is False),
as the flushed schedules do.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1, 1) for i in range(8)), input_bytes=1)
>>> p = plan_interleaved_1f1b(ch, Platform(2, memory_model="paper"), micro_batches=4)
>>> [(s.first, s.last, s.device) for s in p.stages], p.period   # (m v + p - 1)(f + b) / m = 9 x 6 / 4
([(0, 1, 0), (2, 3, 1), (4, 5, 0), (6, 7, 1)], 13.5)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from workbench.model.chain import Chain, Platform
from workbench.model.memory import LayerTerms, layer_terms, square_terms
from workbench.model.orders import Action, chunks_of, schedule_of, stage_devices, torch_order
from workbench.model.plan import Plan, Stage, infeasible_plan, lower_bound, with_memory_setup
from workbench.model.split import split_columns, split_note
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes
from workbench.verify.simulate_orders import held_counts, simulate_order

__all__ = ["plan_torch_schedule", "plan_interleaved_1f1b", "plan_looped_bfs", "plan_interleaved_zb", "plan_zbv",
           "plan_dualpipev", "order_counts", "TORCH_PLANNERS"]


def order_counts(order: dict[int, Sequence[Action]], stages: int) -> tuple[list[int], list[int]]:
    """Per stage, the most micro-batches it holds (forward done, last backward part not) and the most whose
    weight gradients wait (``I`` done, ``W`` not), read off the order alone (a device's memory changes only
    at its own operations).

    >>> order_counts(torch_order("interleaved-zb", 2, 1, 4), 2)    # the last stage runs I, I, W, I, W, ...
    ([2, 2], [0, 2])
    """
    held, peak = [0] * stages, [0] * stages
    wait, wpeak = [0] * stages, [0] * stages
    for acts in order.values():
        for a in acts:
            s = a.stage
            if a.kind == "F":
                held[s] += 1
                peak[s] = max(peak[s], held[s])
            elif a.kind in ("B", "W"):
                held[s] -= 1
            if a.kind == "I":
                wait[s] += 1
                wpeak[s] = max(wpeak[s], wait[s])
            elif a.kind == "W":
                wait[s] -= 1
    if stages:
        wpeak[0] = 0        # torch's stage 0 runs no I: its W holds nothing beyond its activations
    return peak, wpeak


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
        """The partition at the least feasible largest stage time (bisection), or None."""
        hi = float(self.pre[-1])
        can = self.feasible(hi, caps)
        if can is None:
            return None
        lo = float(self.comp.max())
        best = (hi, can)
        for _ in range(60):
            if hi - lo <= REL_TOL * hi:
                break
            mid = (lo + hi) / 2
            got = self.feasible(mid, caps)
            if got is None:
                lo = mid
            else:
                hi, best = mid, (mid, got)
        return self.pick(best[0], caps, best[1])

    def needs(self, parts: list[tuple[int, int]]) -> list[float]:
        return [float(self.mem[s][a, b]) for s, (a, b) in enumerate(parts)]


def _shares(prob: _Problem, base: list[tuple[int, int]], devices: int) -> list[list[float]]:
    """The shares of the limit per stage tried: equal per device, by need under ``base``, by held count."""
    def per_device(weights: Sequence[float]) -> list[float]:
        tot = [0.0] * devices
        for s, w in enumerate(weights):
            tot[prob.dev[s]] += w
        return [w / tot[prob.dev[s]] if tot[prob.dev[s]] > 0 else 1.0 for s, w in enumerate(weights)]

    return [per_device([1.0] * len(prob.k)), per_device(prob.needs(base)), per_device([float(k) for k in prob.k])]


def _candidates(prob: _Problem, limit: float, devices: int, evaluate) -> list[list[tuple[int, int]]]:
    """Partitions to simulate: the time-balanced one and, under a finite limit, per share the most relaxed
    caps whose partition's simulated peak still fits (``evaluate(parts) -> fits``)."""
    inf = [np.inf] * len(prob.k)
    base = prob.least_tau(inf)
    out = [base] if base is not None else []
    if not np.isfinite(limit) or base is None or evaluate(base):
        return out
    budget = limit - prob.terms.const
    for share in _shares(prob, base, devices):
        caps = [budget * x for x in share]
        parts = prob.least_tau(caps)
        if parts is None:
            continue
        lo, hi, good = 1.0, float(len(prob.k)), parts
        for _ in range(6):                 # relax the caps while the simulated peak still fits
            mid = (lo + hi) / 2
            trial = prob.least_tau([c * mid for c in caps])
            if trial is not None and evaluate(trial):
                lo, good = mid, trial
            else:
                hi = mid
        out.append(good)
    return out


def plan_torch_schedule(chain: Chain, platform: Platform, name: str, *, allocation: str = "contiguous",
                        time_limit: float | None = None, micro_batches: int | None = None,
                        chunks: int | None = None, flushes: int = 1, **options: Any) -> Plan:
    """Plan ``chain`` with torch's schedule ``name`` (see the module docstring). Without ``micro_batches``
    the flush holds 4 P micro-batches, or 2 P or P when fewer fit the limit and torch takes them."""
    t0 = time.perf_counter()
    P = platform.devices
    V = chunks_of(name, chunks)
    S = P * V
    sched = schedule_of(name)
    if len(chain) < S:
        return infeasible_plan(chain, platform, name, f"{name} with {V} stages on each of {P} devices needs at least "
                               f"{S} layers; the chain has {len(chain)}", solve_seconds=time.perf_counter() - t0)
    if micro_batches is not None and int(micro_batches) < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches!r}")
    counts = [int(micro_batches)] if micro_batches is not None else [4 * P, 2 * P, P]
    dev = stage_devices(name, P, S)
    best: tuple[bool, float, Any] | None = None
    refused = ""
    for m in counts:
        try:
            order = torch_order(name, P, V, m)
        except ValueError as e:
            if micro_batches is not None:
                raise
            refused = str(e)
            continue
        parts, trace = _best_partition(chain, platform, name, order, dev, m, flushes)
        fits = float(trace.peak_memory().max()) <= platform.memory * (1 + REL_TOL)
        key = (not fits, float(trace.period) if fits else float(trace.peak_memory().max()))
        if best is None or key < best[:2]:
            best = (key[0], key[1], (parts, trace, m))
        if fits and micro_batches is None:
            break                      # more micro-batches per flush fit: fewer would only add bubble
    if best is None:
        raise ValueError(refused)
    parts, trace, m = best[2]
    return _plan_of(chain, platform, name, sched.torch_class, parts, dev, trace, m, V, flushes, sched.split,
                    time.perf_counter() - t0)


def _best_partition(chain: Chain, platform: Platform, name: str, order: dict[int, tuple[Action, ...]],
                    dev: list[int], m: int, flushes: int) -> tuple[list[tuple[int, int]], Any]:
    """The fastest candidate partition that fits (else the one needing least memory) and its simulated trace."""
    S = len(dev)
    k, p = order_counts(order, S)
    prob = _Problem(chain, platform, dev, k, p, chain.forward + chain.backward, layer_terms(chain, platform))
    cache: dict[tuple, Any] = {}

    def simulated(parts: list[tuple[int, int]]):
        key = tuple(parts)
        if key not in cache:
            cache[key] = simulate_order(chain, platform, [(a, b, d) for (a, b), d in zip(parts, dev)], order, m,
                                        flushes, schedule=name)
        return cache[key]

    def fits(parts: list[tuple[int, int]]) -> bool:
        return float(simulated(parts).peak_memory().max()) <= platform.memory * (1 + REL_TOL)

    found = _candidates(prob, platform.memory, platform.devices, fits)
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


def plan_interleaved_1f1b(chain: Chain, platform: Platform, **options: Any) -> Plan:
    """torch's ``ScheduleInterleaved1F1B`` (``chunks`` stages per device, default 2; ``micro_batches``)."""
    return plan_torch_schedule(chain, platform, "interleaved-1f1b", **options)


def plan_looped_bfs(chain: Chain, platform: Platform, **options: Any) -> Plan:
    """torch's ``ScheduleLoopedBFS`` (``chunks`` stages per device, default 2; ``micro_batches``)."""
    return plan_torch_schedule(chain, platform, "looped-bfs", **options)


def plan_interleaved_zb(chain: Chain, platform: Platform, **options: Any) -> Plan:
    """torch's ``ScheduleInterleavedZeroBubble`` (``chunks`` stages per device, default 2; ``micro_batches``)."""
    return plan_torch_schedule(chain, platform, "interleaved-zb", **options)


def plan_zbv(chain: Chain, platform: Platform, **options: Any) -> Plan:
    """torch's ``ScheduleZBVZeroBubble`` (two stages per device in a V; ``micro_batches``)."""
    return plan_torch_schedule(chain, platform, "zbv", **options)


def plan_dualpipev(chain: Chain, platform: Platform, **options: Any) -> Plan:
    """torch's ``ScheduleDualPipeV`` (two stages per device in a V; ``micro_batches`` at least 2 P)."""
    return plan_torch_schedule(chain, platform, "dualpipev", **options)


#: method name -> planner
TORCH_PLANNERS = {"interleaved-1f1b": plan_interleaved_1f1b, "looped-bfs": plan_looped_bfs,
                  "interleaved-zb": plan_interleaved_zb, "zbv": plan_zbv, "dualpipev": plan_dualpipev}
