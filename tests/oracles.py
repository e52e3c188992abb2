"""What the tests compute on their own, from docs/model.md: memory formulas, and the optimal plan.

Nothing here comes from the package but its model types (``Chain``, ``Layer``,
``Platform``, ``Plan``, ``Stage``) and its checker (``workbench.verify.check`` and the
checker's own memory, ``workbench.verify.check_memory``): the planners are tested
against code that shares none of theirs.

**The exhaustive oracle** (:func:`optimal_plan`) enumerates every allocation
(contiguous: compositions of the chain into at most P runs, devices in chain
order; general: every map layer -> device up to relabelling the devices) and
finds each one's least period with one small MILP (scipy's, not the
package's; solved with and without presolve, the better kept, see :func:`_least_period`). It is written in scaled
time, as the rules read: with R the
lower bound ``max(sum of compute / P, largest layer)``, ``u = R / T`` and every
start time in periods (``tau = t / T``), an operation of d seconds lasts
``(d / R) u`` periods, and for a fixed allocation rules 2-7 become linear:

* rules 2-4: ``tau_next - tau_prev >= (d / R) u`` along one mini-batch's
  chain of operations (forwards, the turn, backwards, transfers included);
* rule 5: two operations o, p of one device (lengths > 0) lie apart modulo T
  iff for some integer q, ``q + (d_o / R) u <= tau_p - tau_o <= q + 1 - (d_p / R) u``;
* rule 6: per pair of devices, the transfers between them ``sum (c / R) u <= 1``;
* rule 7: an integer ``k_s >= tau_bwd_s + (B_s / R) u - tau_fwd_s`` per stage
  (the plan's in-flight count is the least such k) and, per device, the
  checker's memory, linear in each k: ``mem(1, .., 1) + sum_s (k_s - 1) slope_s <= M``.

Maximising u gives the allocation's least period. The start times are bounded
by a horizon that every valid plan can be brought within: shifting an
operation and everything after it (or before it) by whole periods keeps every
residue modulo T, so a plan can have every wait between consecutive operations
of a mini-batch shorter than T; then all of them lie within the chain's total
time plus one period per operation. The best allocation's plan is rebuilt
with exact start times (longest paths on the difference constraints at the least
period of the integers the MILP chose, found by bisection to 1e-13: the MILP itself holds only to its
tolerances, so the oracle's periods are exact to about 1e-6) and certified by the checker. Rule 8 (offloaded
activations) is not modelled: the oracle refuses such chains.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> paper_stage_memory(Target.of(1, weight_factor=2, memory_model="paper"), 10, 100, 3)   # 3 x 10 + 2 x 100 + 2 x 100
430.0
>>> chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3)))
>>> round(optimal_plan(chain, Target.of(2, memory_model="paper"), "general").period, 6)
6.0
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace
from typing import Iterator, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from policy_instances import random_chain
from workbench.model.chain import Chain
from workbench.model.plan import Plan, Stage
from workbench.model.target import Target
from workbench.verify.check import check
from workbench.verify.check_memory import memory_by_device


def paper_stage_memory(platform, saved: float, weights: float, k: int) -> float:
    """The paper's rule 7 for one stage: ``k A + phi W + [stash] (k - 1) W``."""
    k = int(k)
    stashed = (k - 1) * weights if platform.setup.weights == "stash" else 0.0
    return float(k * saved + platform.setup.weight_factor * weights + stashed)


# ----------------------------------------------------------------------------
# allocations
# ----------------------------------------------------------------------------
def allocations(n_layers: int, devices: int, allocation: str, last: bool = False) -> Iterator[tuple[int, ...]]:
    """Every allocation: contiguous runs on devices 0, 1, ... in chain order (``last``: on the last
    devices, as dp places stages on several nodes), or (general) every map layer -> device whose devices
    appear in first-use order (one per relabelling)."""
    if allocation == "contiguous":
        for parts in range(1, min(devices, n_layers) + 1):
            first = devices - parts if last else 0
            for cuts in itertools.combinations(range(1, n_layers), parts - 1):
                edges = (0,) + cuts + (n_layers,)
                yield tuple(first + p for p in range(parts) for _ in range(edges[p + 1] - edges[p]))
        return
    for a in itertools.product(range(devices), repeat=n_layers):
        if all(a[i] <= max(a[:i], default=-1) + 1 for i in range(n_layers)):
            yield a


def _runs(assignment: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive layers on one device."""
    runs, start = [], 0
    for i in range(1, len(assignment) + 1):
        if i == len(assignment) or assignment[i] != assignment[start]:
            runs.append((start, i - 1))
            start = i
    return runs


# ----------------------------------------------------------------------------
# one allocation
# ----------------------------------------------------------------------------
class _Stages:
    """The stages of one allocation: compute, transfers, operations per device, memory by k."""

    def __init__(self, chain: Chain, platform: Target, assignment: Sequence[int]) -> None:
        self.chain, self.platform, self.assignment = chain, platform, tuple(assignment)
        self.runs = _runs(assignment)
        S = self.S = len(self.runs)
        self.dev = [assignment[a] for a, _ in self.runs]
        self.F = [sum(chain.layers[l].forward for l in range(a, b + 1)) for a, b in self.runs]
        self.B = [sum(chain.layers[l].backward for l in range(a, b + 1)) for a, b in self.runs]
        self.c = [platform.comm_time(chain.cut(b), self.dev[s], self.dev[s + 1]) if s < S - 1 else 0.0
                  for s, (_, b) in enumerate(self.runs)]
        # the checker's memory of each device with every k = 1, and what one more mini-batch of stage s adds
        ones = [(a, b, self.dev[s], 1) for s, (a, b) in enumerate(self.runs)]
        self.base = memory_by_device(chain, platform, ones)
        self.slope = []
        for s in range(S):
            more = list(ones)
            more[s] = (*ones[s][:3], 2)
            self.slope.append(memory_by_device(chain, platform, more)[self.dev[s]] - self.base[self.dev[s]])

    def operations(self) -> list[tuple[int, float]]:
        """(device, length) of operation 2s (forward of stage s) and 2s + 1 (its backward)."""
        return [(self.dev[s], d) for s in range(self.S) for d in (self.F[s], self.B[s])]

    def chain_order(self) -> list[tuple[int, int, float]]:
        """(earlier, later, seconds between their starts at least): rules 2-4 along one mini-batch."""
        S, F, B, c = self.S, self.F, self.B, self.c
        arcs = [(2 * s, 2 * s + 2, F[s] + c[s]) for s in range(S - 1)]
        arcs.append((2 * S - 2, 2 * S - 1, F[S - 1]))
        arcs += [(2 * s + 3, 2 * s + 1, B[s + 1] + c[s]) for s in range(S - 1)]
        return arcs

    def device_pairs(self) -> list[tuple[int, int]]:
        ops = self.operations()
        return [(o, p) for o, p in itertools.combinations(range(len(ops)), 2)
                if ops[o][0] == ops[p][0] and ops[o][1] > 0 and ops[p][1] > 0]

    def link_loads(self) -> list[float]:
        loads: dict[tuple[int, int], float] = {}
        for s in range(self.S - 1):
            p, q = self.dev[s], self.dev[s + 1]
            if p != q and self.c[s] > 0:
                key = (min(p, q), max(p, q))
                loads[key] = loads.get(key, 0.0) + self.c[s]
        return list(loads.values())


def _least_period(st: _Stages, R: float, upper: float = math.inf) -> tuple[float, list[int], dict] | None:
    """The allocation's least period by one MILP (module docstring): (T, k per stage, q per device pair);
    None when no period (below ``upper``) fits."""
    S, ops, pairs = st.S, st.operations(), st.device_pairs()
    n_tau = 2 * S
    iu, itau, ik, iq = 0, 1, 1 + n_tau, 1 + n_tau + S
    n = iq + len(pairs)
    path = sum(st.F) + sum(st.B) + 2 * sum(st.c)
    H = path / R + 2 * S + 2                  # the horizon, in periods (module docstring)
    rows, lo, hi = [], [], []

    def row(coefs: dict[int, float], lb: float, ub: float) -> None:
        r = np.zeros(n)
        for i, v in coefs.items():
            r[i] += v
        rows.append(r)
        lo.append(lb)
        hi.append(ub)

    for a, b, d in st.chain_order():                                     # rules 2-4
        row({itau + b: 1.0, itau + a: -1.0, iu: -d / R}, 0.0, np.inf)
    for i, (o, p) in enumerate(pairs):                                   # rule 5
        row({itau + p: 1.0, itau + o: -1.0, iq + i: -1.0, iu: -ops[o][1] / R}, 0.0, np.inf)
        row({itau + p: 1.0, itau + o: -1.0, iq + i: -1.0, iu: ops[p][1] / R}, -np.inf, 1.0)
    for load in st.link_loads():                                         # rule 6
        row({iu: load / R}, -np.inf, 1.0)
    for s in range(S):                                                   # rule 7: the in-flight count
        row({ik + s: 1.0, itau + 2 * s + 1: -1.0, itau + 2 * s: 1.0, iu: -st.B[s] / R}, 0.0, np.inf)
    if math.isfinite(st.platform.memory):                                # rule 7: memory per device
        for d in sorted(set(st.dev)):
            ss = [s for s in range(S) if st.dev[s] == d]
            room = st.platform.memory - st.base[d] + sum(st.slope[s] for s in ss)
            row({ik + s: st.slope[s] for s in ss}, -np.inf, room)
    lb = np.concatenate([[R / upper if math.isfinite(upper) else 0.0], np.zeros(n_tau), np.ones(S),
                         np.full(len(pairs), -H - 2)])
    ub = np.concatenate([[1.0], np.full(n_tau, H), np.full(S, H + 2), np.full(len(pairs), H + 2)])
    ub[itau] = 0.0                                                       # the first forward starts at 0
    integrality = np.concatenate([np.zeros(1 + n_tau), np.ones(S + len(pairs))])
    cost = np.zeros(n)
    cost[iu] = -1.0
    # HiGHS (scipy 1.17) reports a few of these models optimal at a smaller u than a point it accepts
    # (about 2 % of them with presolve, 0.4 % without, never the same ones in our samples): solve both ways
    # and keep the better; every solution is certified by the checker afterwards
    best = None
    for presolve in (True, False):
        res = milp(cost, constraints=LinearConstraint(np.array(rows), lo, hi) if rows else None,
                   integrality=integrality, bounds=Bounds(lb, ub),
                   options={"mip_rel_gap": 0.0, "time_limit": 120, "presolve": presolve})
        if res.x is not None and res.x[iu] > 0 and (best is None or res.x[iu] > best[iu]):
            best = res.x
    if best is None:
        return None
    x = best
    counts = [int(round(v)) for v in x[ik:ik + S]]
    return float(R / x[iu]), counts, {pr: int(round(x[iq + i])) for i, pr in enumerate(pairs)}


def _start_times(st: _Stages, T: float, ks: list[int], qs: dict) -> list[float] | None:
    """Earliest start times (seconds) of every operation at period T with the integers fixed: longest
    paths on the difference constraints ``x_j - x_i >= w`` (None if they have a positive cycle)."""
    ops = st.operations()
    arcs = [(a, b, d) for a, b, d in st.chain_order()]
    for (o, p), q in qs.items():
        arcs.append((o, p, q * T + ops[o][1]))           # x_p - x_o >= q T + d_o
        arcs.append((p, o, -((q + 1) * T - ops[p][1])))  # x_o - x_p >= -((q + 1) T - d_p)
    for s, k in enumerate(ks):                            # window <= k T
        arcs.append((2 * s + 1, 2 * s, st.B[s] - k * T))
    n = 2 * st.S
    x = [0.0] * n
    for _ in range(n + 1):
        changed = False
        for a, b, w in arcs:
            if x[a] + w > x[b] + 1e-12 * T:
                x[b] = x[a] + w
                changed = True
        if not changed:
            return [v - x[0] for v in x]
    return None


def _count(window: float, T: float) -> int:
    """ceil(window / T), a count within docs/model.md's relative tolerance 1e-6 of a whole number being it."""
    x = window / T
    r = round(x)
    return max(1, int(r) if abs(x - r) <= 1e-6 * max(1.0, abs(x)) else math.ceil(x))


def _plan(st: _Stages, T: float, x: list[float], R: float, allocation: str) -> Plan:
    stages, counted = [], []
    for s, (a, b) in enumerate(st.runs):
        k = _count(x[2 * s + 1] + st.B[s] - x[2 * s], T)
        stages.append(Stage(a, b, st.dev[s], x[2 * s], x[2 * s + 1], k))
        counted.append((a, b, st.dev[s], k))
    memory = memory_by_device(st.chain, st.platform, counted)
    return Plan(period=T, assignment=st.assignment, stages=tuple(stages), devices=st.platform.devices,
                memory=tuple(memory), memory_limit=st.platform.memory, lower_bound=R, method="oracle",
                allocation=allocation, status="optimal")


def allocation_optimum(chain: Chain, platform: Target, assignment: Sequence[int],
                       upper: float = math.inf) -> Plan | None:
    """The least-period valid plan of one allocation (certified by the checker), or None if none fits
    (at a period up to ``upper``)."""
    if any(l.offload_bytes for l in chain.layers):
        raise ValueError("the oracle does not model offloaded activations (rule 8)")
    comp = [l.forward + l.backward for l in chain.layers]
    R = max(sum(comp) / platform.devices, max(comp))
    st = _Stages(chain, platform, assignment)
    found = _least_period(st, R, upper)
    if found is None:
        return None
    T, ks, qs = found
    # the MILP holds to its tolerances: the exact least period of its integers (feasibility of fixed
    # integers only grows with T: scale every start time), by bisection around its period
    lo, hi = T * (1 - 1e-5), T * (1 + 1e-5)
    while _start_times(st, hi, ks, qs) is None:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-13 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _start_times(st, mid, ks, qs) is not None else (mid, hi)
    T = max([hi] + st.link_loads())                 # rule 6 (the difference constraints do not hold it)
    x = _start_times(st, T, ks, qs)
    plan = _plan(st, T, x, R, "contiguous" if len(set(st.dev)) == st.S else "general")
    bad = check(plan, chain, platform)
    if bad:                                # pragma: no cover - the oracle must be right before it judges
        raise AssertionError(f"the oracle's plan for {assignment} fails the checker: {bad[0]}")
    return plan


def _load_bound(chain: Chain, platform: Target, assignment: Sequence[int]) -> float:
    """No plan of ``assignment`` has a period below its busiest device or link (rules 5 and 6)."""
    runs = _runs(assignment)
    dev = [assignment[a] for a, _ in runs]
    load: dict[int, float] = {}
    for l, d in enumerate(assignment):
        load[d] = load.get(d, 0.0) + chain.layers[l].forward + chain.layers[l].backward
    links: dict[tuple[int, int], float] = {}
    for s, (_, b) in enumerate(runs[:-1]):
        key = (min(dev[s], dev[s + 1]), max(dev[s], dev[s + 1]))
        links[key] = links.get(key, 0.0) + platform.comm_time(chain.cut(b), dev[s], dev[s + 1])
    return max(list(load.values()) + list(links.values()))


def optimal_plan(chain: Chain, platform: Target, allocation: str = "contiguous", last: bool = False) -> Plan | None:
    """The least-period valid plan over every ``allocation`` ("contiguous" or "general"; ``last``: contiguous
    stages on the last devices), None if none fits. Allocations are visited by their load bound and skipped
    once it reaches the best period found; each MILP is asked only for periods below it."""
    best = None
    order = sorted(allocations(len(chain), platform.devices, allocation, last),
                   key=lambda a: _load_bound(chain, platform, a))
    for a in order:
        if best is not None and _load_bound(chain, platform, a) >= best.period:
            break
        p = allocation_optimum(chain, platform, a, best.period if best is not None else math.inf)
        if p is not None and (best is None or p.period < best.period):
            best = p
    return best


# ----------------------------------------------------------------------------
# instances
# ----------------------------------------------------------------------------
def random_instance(seed: int, max_layers: int = 5, max_devices: int = 3) -> tuple[Chain, Target]:
    """A chain of 2..max_layers layers on 2..max_devices devices, either memory model, its memory limit
    between 0.2 and 0.8 of what the whole chain needs on one device with two mini-batches in flight
    (so that it binds, or rules out every plan, in many). Half of them share a parameter between two or
    three layers (docs/model.md, "Tied parameters"), some measure the fresh backward, and the training
    loop is either (drawn after everything else, so the rest of an instance is as it always was)."""
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(2, max_layers))
    platform = Target.of(rng.randint(2, max_devices), optimizer=rng.choice(["sgd", "adam"]),
                        memory_model=rng.choice(["full", "paper"]), weights=rng.choice(["stash", "single"]),
                        bandwidth=rng.uniform(5, 100))
    L = len(chain)
    roomy_draw = rng.uniform(0.2, 0.8)
    chain, platform = with_ties(rng, chain), platform.with_(zero_grad=rng.choice(["none", "zeros"]))
    roomy = max(memory_by_device(chain, platform.with_(devices=1), [(0, L - 1, 0, 2)]))
    return chain, platform.with_(memory=roomy * roomy_draw)


def with_ties(rng: random.Random, chain: Chain) -> Chain:
    """``chain`` with, half of the time, a parameter of the first user shared with one or two later layers
    (its bytes counted at the owner only, as a profile counts them), and some fresh backward peaks."""
    layers = list(chain.layers)
    for i, layer in enumerate(layers):
        if rng.random() < 0.4 and layer.backward_peak_bytes is not None:
            extra = rng.uniform(0, float(layer.grad_bytes if layer.grad_bytes is not None else layer.weight_bytes))
            layers[i] = replace(layer, backward_fresh_peak_bytes=layer.backward_peak_bytes + extra)
    meta = dict(chain.meta)
    if len(layers) >= 2 and rng.random() < 0.5:
        users = sorted(rng.sample(range(len(layers)), min(len(layers), rng.choice([2, 2, 3]))))
        nbytes = rng.uniform(1, 12)
        owner = layers[users[0]]
        layers[users[0]] = replace(owner, weight_bytes=owner.weight_bytes + nbytes)
        meta["tied"] = json.dumps([{"owner": owner.name, "layers": [layers[u].name for u in users], "bytes": nbytes,
                                    "parameter": "shared.weight"}])
    return Chain(tuple(layers), chain.input_bytes, chain.cut_bytes, meta)
