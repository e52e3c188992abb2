"""Tests of the brute-force planner against independent computations."""

import itertools
import math
import random

import pytest

from oracles import paper_stage_memory
from workbench.model.chain import Chain, Layer
from workbench.model.plan import stages_of
from workbench.model.target import Target
from workbench.planners import brute
from workbench.planners.brute import contiguous_allocations, general_allocations, plan_brute
from workbench.planners.evaluate.allocation import allocation_of
from workbench.planners.evaluate.orders import general_period
from workbench.planners.evaluate.period import allocation_period

try:
    from workbench.verify.check import check
except ImportError:  # pragma: no cover - the checker lands separately
    check = None


def assert_valid(plan, chain, platform):
    if check is not None and plan.feasible:
        v = check(plan, chain, platform)
        assert v == [], [str(x) for x in v]


def rand_instance(rng, L, P, memory=True, comm=True):
    layers = tuple(Layer(f"l{i}", rng.randint(1, 9) * 1e-3, rng.randint(1, 9) * 1e-3,
                         rng.randint(0, 50), rng.randint(1, 30)) for i in range(L))
    chain = Chain(layers, input_bytes=rng.randint(1, 30))
    bw = rng.choice([math.inf, 10000.0, 5000.0]) if comm else math.inf
    M = math.inf
    if memory:
        tot = sum(chain.saved(i) + l.weight_bytes for i, l in enumerate(layers))
        M = tot * rng.uniform(0.4, 1.5)
    weights = rng.choice(["stash", "single"])
    return chain, Target.of(P, memory=M, bandwidth=bw, weights=weights, weight_factor=rng.choice([1, 2]),
                           memory_model="paper")


# ----------------------------------------------------------------------------- independent helpers
def unconstrained_period(chain, platform, assignment):
    """max(device load, link load) of one allocation, from the layers directly."""
    P = max(assignment) + 1
    load = [0.0] * P
    for l, d in enumerate(assignment):
        load[d] += chain[l].forward + chain[l].backward
    links = {}
    for l in range(len(chain) - 1):
        p, q = assignment[l], assignment[l + 1]
        if p != q:
            c = platform.latency + chain.cut(l) / platform.bandwidth
            links[frozenset((p, q))] = links.get(frozenset((p, q)), 0.0) + c
    return max(load + list(links.values()))


def greedy_feasible(chain, platform, runs, T):
    """Contiguous plan at period T by the window recurrence; True when it fits (memory, loads, links)."""
    S = len(runs)
    cs = [chain.stage_costs(a, b, platform) for a, b in runs]
    if any(c.forward + c.backward > T * (1 + 1e-12) for c in cs):
        return False
    if any(cs[s].comm > T * (1 + 1e-12) for s in range(S - 1)):
        return False
    window = 0.0
    for s in range(S - 1, -1, -1):
        F, B = cs[s].forward, cs[s].backward
        if s == S - 1:
            window = F + B
        else:
            window = F + 2 * cs[s].comm + window + B
        k = max(1, math.ceil(window / T - 1e-12))
        if window - (k - 1) * T < F + B - 1e-12 * T:   # the backward would overlap the forward mod T
            window = (k - 1) * T + F + B
            k = max(1, math.ceil(window / T - 1e-12))
        if paper_stage_memory(platform, cs[s].saved, cs[s].weights, k) > platform.memory * (1 + 1e-9):
            return False
    return True


def contiguous_by_search(chain, platform):
    """Least period over compositions: breakpoints T = (path segment) / m, then a fine grid below."""
    L, P = len(chain), platform.devices
    best = math.inf
    for cuts_n in range(0, min(P, L)):
        for cuts in itertools.combinations(range(1, L), cuts_n):
            b = (0,) + cuts + (L,)
            runs = [(b[i], b[i + 1] - 1) for i in range(len(b) - 1)]
            cs = [chain.stage_costs(x, y, platform) for x, y in runs]
            S = len(runs)
            # every sum of consecutive stage segments (F + B + 2c inside) over small integers
            cand = {c.forward + c.backward for c in cs} | {cs[s].comm for s in range(S - 1)}
            for s in range(S):
                acc = 0.0
                for j in range(s, S):
                    seg = acc + cs[j].forward + cs[j].backward
                    for m in range(1, 40):
                        cand.add(seg / m)
                    acc += cs[j].forward + cs[j].backward + 2 * cs[j].comm
            feas = sorted(t for t in cand if t > 0 and greedy_feasible(chain, platform, runs, t * (1 + 1e-12)))
            if feas:
                t = feas[0]
                lo = max(c.forward + c.backward for c in cs)
                # a fine grid below the breakpoint finds nothing feasible
                for i in range(60):
                    g = lo + (t - lo) * i / 60
                    if g < t * (1 - 1e-9):
                        assert not greedy_feasible(chain, platform, runs, g), (runs, g, t)
                best = min(best, t)
    return best


# ----------------------------------------------------------------------------- enumeration
def test_allocation_counts():
    assert len(list(contiguous_allocations(6, 3))) == 1 + 5 + 10
    # Stirling numbers: S(6,1) + S(6,2) + S(6,3) = 1 + 31 + 90
    g = list(general_allocations(6, 3))
    assert len(g) == 122 and len(set(g)) == 122
    # every map up to relabelling appears once
    canon = {tuple({d: i for i, d in enumerate(dict.fromkeys(a))}[x] for x in a)
             for a in itertools.product(range(3), repeat=6)}
    assert canon == set(g)


# ----------------------------------------------------------------------------- (a) no memory limit
@pytest.mark.parametrize("allocation", ["contiguous", "general"])
def test_unconstrained_equals_load_bound(allocation):
    rng = random.Random(11)
    for _ in range(25):
        L, P = rng.randint(1, 7), rng.randint(1, 3)
        chain, plat = rand_instance(rng, L, P, memory=False)
        allocs = contiguous_allocations(L, P) if allocation == "contiguous" else general_allocations(L, P)
        want = min(unconstrained_period(chain, plat, a) for a in allocs)
        plan = plan_brute(chain, plat, allocation=allocation, cache=False)
        assert plan.status == "optimal"
        assert plan.period == pytest.approx(want, rel=1e-9)
        assert_valid(plan, chain, plat)


# ----------------------------------------------------------------------------- (b) contiguous vs recurrence
def test_contiguous_matches_window_recurrence():
    rng = random.Random(7)
    n_binding = 0
    for _ in range(40):
        L, P = rng.randint(1, 7), rng.randint(1, 4)
        chain, plat = rand_instance(rng, L, P)
        want = contiguous_by_search(chain, plat)
        plan = plan_brute(chain, plat, cache=False)
        if math.isinf(want):
            assert not plan.feasible
            continue
        assert plan.period == pytest.approx(want, rel=1e-7)
        assert len(set(plan.assignment)) == len(stages_of(plan.assignment))
        assert_valid(plan, chain, plat)
        free = plan_brute(chain, plat.with_(memory=math.inf), cache=False).period
        n_binding += plan.period > free * (1 + 1e-9)
    assert n_binding >= 5   # the memory limit really binds on some instances


def test_general_search_agrees_with_closed_form_on_contiguous_allocations():
    """The general engine (search over k and pair offsets) against the contiguous closed form."""
    rng = random.Random(3)
    for _ in range(25):
        L, P = rng.randint(1, 5), rng.randint(1, 3)
        chain, plat = rand_instance(rng, L, P)
        for a in contiguous_allocations(L, P):
            r1 = allocation_period(chain, plat, a)
            r2 = allocation_period(chain, plat, a, exact_general=True)
            assert (r1 is None) == (r2 is None)
            if r1 is not None:
                assert r2[0] == pytest.approx(r1[0], rel=1e-8)


# ----------------------------------------------------------------------------- (c), (d) general <= contiguous, valid
def test_general_never_worse_and_plans_valid():
    rng = random.Random(5)
    better = 0
    for _ in range(20):
        L, P = rng.randint(2, 7), rng.randint(2, 3)
        chain, plat = rand_instance(rng, L, P, memory=rng.random() < 0.85)
        c = plan_brute(chain, plat, cache=False)
        g = plan_brute(chain, plat, allocation="general", cache=False)
        assert g.feasible or not c.feasible
        if c.feasible:
            assert g.period <= c.period * (1 + 1e-9)
            better += g.period < c.period * (1 - 1e-6)
        assert_valid(c, chain, plat)
        assert_valid(g, chain, plat)
        if g.feasible:
            assert g.status == "optimal" and g.method == "brute" and g.allocation == "general"
            assert all(m <= plat.memory * (1 + 1e-6) for m in g.memory)
    assert better >= 3


# ----------------------------------------------------------------------------- independent LP oracle
def lp_oracle(chain, platform, assignment, kcap):
    """Least period of one allocation by enumerating, per device, a linear order of the operations'
    offsets from the device's first forward and their whole-period indices, with one LP (scipy) each.
    Only for tiny allocations; stage s tries k <= kcap[s] (give memory that allows no more). Operations
    later in the chain's time order have no smaller period index (floor of a non-decreasing time)."""
    from scipy.optimize import linprog

    runs = stages_of(assignment)
    S = len(runs)
    cs = [chain.stage_costs(a, b, platform) for a, b in runs]
    dev = [assignment[a] for a, _ in runs]
    d = [x for c in cs for x in (c.forward, c.backward)]   # op 2s forward, 2s+1 backward
    n = 2 * S
    nv = n + 1                                              # x_0..x_{n-1}, T
    devices = sorted(set(dev))
    best = math.inf
    static = max([sum(cs[s].forward + cs[s].backward for s in range(S) if dev[s] == p) for p in devices]
                 + [unconstrained_period(chain, platform, assignment)])
    kvecs = [ks for ks in itertools.product(*[range(1, kc + 1) for kc in kcap])
             if all(sum(paper_stage_memory(platform, cs[s].saved, cs[s].weights,
                                           ks[s]) for s in range(S) if dev[s] == p)
                    <= platform.memory for p in devices)]
    for ks in kvecs:
        per_dev = []
        for p in devices:
            st = [s for s in range(S) if dev[s] == p]
            ref = 2 * st[0]
            others = [2 * s for s in st[1:]] + [2 * s + 1 for s in reversed(st)]   # chain time order
            choices = []
            for idx in itertools.combinations_with_replacement(range(ks[st[0]] + 1), len(others)):
                n_of = dict(zip(others, idx))
                for order in itertools.permutations(others):
                    choices.append((ref, order, tuple(n_of[o] for o in order)))
            per_dev.append(choices)
        for combo in itertools.product(*per_dev):
            A, b = [], []

            def ge(coef, rhs):   # sum coef * v >= rhs
                row = [0.0] * nv
                for i, c in coef:
                    row[i] -= c
                A.append(row)
                b.append(-rhs)

            Ti = n
            for s in range(S - 1):
                ge([(2 * s + 2, 1), (2 * s, -1)], cs[s].forward + cs[s].comm)
                ge([(2 * s + 1, 1), (2 * s + 3, -1)], cs[s + 1].backward + cs[s].comm)
            ge([(2 * S - 1, 1), (2 * S - 2, -1)], cs[S - 1].forward)
            for s in range(S):
                ge([(Ti, ks[s]), (2 * s, 1), (2 * s + 1, -1)], cs[s].backward)
            for ref, order, idx in combo:
                # offset r_o = x_o - x_ref - n_o T, in [d_ref, T - d_o], increasing along the order
                prev, prev_n = ref, 0
                for o, no in zip(order, idx):
                    ge([(o, 1), (Ti, -no), (prev, -1), (Ti, prev_n)], d[prev])
                    prev, prev_n = o, no
                ge([(ref, 1), (Ti, 1), (prev, -1), (Ti, prev_n)], d[prev])
            res = linprog([0.0] * n + [1.0], A_ub=A, b_ub=b,
                          bounds=[(0, 0)] + [(None, None)] * (n - 1) + [(static, None)], method="highs")
            if res.status == 0:
                best = min(best, res.x[Ti])
    return best


def test_general_allocation_against_lp_oracle():
    rng = random.Random(2)
    for _ in range(2):
        # equal saved bytes, memory 3: device 0 (stages 0 and 2) has k0 + k2 <= 3, device 1 has k1 <= 3
        layers = tuple(Layer(f"l{i}", rng.randint(1, 5), rng.randint(1, 5), 0, 0, saved_bytes=1) for i in range(3))
        chain = Chain(layers)
        plat = Target.of(2, memory=3, memory_model="paper")
        got = allocation_period(chain, plat, (0, 1, 0))
        want = lp_oracle(chain, plat, (0, 1, 0), kcap=(2, 3, 2))
        assert got is not None and got[0] == pytest.approx(want, rel=1e-7)


def test_loose_order_search_agrees_with_full_enumeration():
    """_feasible_at's single memory-aware order search (every stage at its largest k, nodes pruned
    by the memory of their least windows) changes nothing: the certified period of random
    interleaved allocations equals the one from an order search per combination of maximal
    in-flight vectors (loose=False)."""
    rng = random.Random(7)
    compared = interleaved = 0
    for _ in range(60):
        L, P = rng.randint(4, 8), rng.randint(2, 3)
        chain, plat = rand_instance(rng, L, P)
        a = [rng.randrange(P) for _ in range(L)]
        al = allocation_of(chain, plat, a)
        if al.contiguous:
            continue
        full = general_period(al, plat, math.inf, loose=False)
        fast = general_period(al, plat, math.inf, loose=True)
        assert (full is None) == (fast is None), a
        if full is not None:
            assert fast[0] == pytest.approx(full[0], rel=1e-7), (a, fast[0], full[0])
            compared += 1
            interleaved += any(len(d) > 1 for d in al.devices)
    assert compared >= 20 and interleaved >= 20


# ----------------------------------------------------------------------------- (e) by hand
def hand_chain():
    mk = lambda n, f, b, a: Layer(n, f, b, 0, 0, saved_bytes=a)  # noqa: E731
    return Chain((mk("heavy", 1, 2, 10), mk("mid", 2, 2, 10), mk("light", 0.5, 0.5, 1)))


def test_general_beats_contiguous_by_hand():
    """Compute 3, 4, 1 on 2 devices. Contiguous: {heavy | mid light} gives load 5 and at T = 5 the windows
    are 8 and 5 (2 and 1 in flight: 20 and 11 bytes), so 5 is optimal (the other splits load 7 and 8).
    General: {heavy, light} and {mid} load 4 and 4. At T < 5 device 1's forward [f1, f1 + 2) and backward
    b1 >= f1 + 3 cannot share the period in the same turn (3 > T - 2), so b1 >= f1 + T + 2 and the heavy
    stage's window is >= 1 + (T + 2) + 2 + 2 = T + 7 > 2T: 3 in flight, 3*10 + 1 = 31 bytes. With this
    schedule T = 4 works: f = 0, 1, 5; b = 10, 7, 5.5 (heavy 3 in flight, mid 2, light 1)."""
    chain = hand_chain()
    plat = Target.of(2, memory=31, memory_model="paper")
    g = plan_brute(chain, plat, allocation="general", cache=False)
    c = plan_brute(chain, plat, cache=False)
    assert g.period == pytest.approx(4.0) and c.period == pytest.approx(5.0)
    assert g.assignment == (0, 1, 0)
    assert_valid(g, chain, plat)
    # the hand schedule itself is valid
    from workbench.model.plan import make_plan
    hand = make_plan(chain, plat, 4.0, (0, 1, 0), [0, 1, 5], [10, 7, 5.5])
    assert [s.in_flight for s in hand.stages] == [3, 2, 1]
    assert_valid(hand, chain, plat)
    # one byte less: 3 in flight no longer fits, general falls back to the contiguous 5
    plat30 = Target.of(2, memory=30, memory_model="paper")
    assert plan_brute(chain, plat30, allocation="general", cache=False).period == pytest.approx(5.0)
    # too little memory for anything: infeasible, with a reason
    tiny = plan_brute(chain, Target.of(2, memory=5, memory_model="paper"), allocation="general", cache=False)
    assert not tiny.feasible and tiny.status == "infeasible" and tiny.notes


# ----------------------------------------------------------------------------- (f) refusal, options
def test_refuses_large_instances():
    chain = Chain(tuple(Layer(f"l{i}", 1, 1) for i in range(11)))
    with pytest.raises(ValueError, match="refuses a chain of 11 layers"):
        plan_brute(chain, Target.of(2, memory_model="paper"))
    assert plan_brute(chain, Target.of(2, memory_model="paper"), max_layers=11).period == pytest.approx(12.0)
    with pytest.raises(ValueError, match="allocation"):
        plan_brute(Chain((Layer("a", 1, 1),)), Target.of(1, memory_model="paper"), allocation="weird")


def test_registry_and_cache():
    from workbench.planners import plan as run_plan

    chain = hand_chain()
    plat = Target.of(2, memory=31, memory_model="paper")
    brute.clear_cache()
    p1 = run_plan(chain, plat, "brute", allocation="general")
    p2 = run_plan(chain, plat, "brute", allocation="general")
    assert p1 is p2 and p1.period == pytest.approx(4.0)


def test_offload_dp_equals_brute_and_general_plans_pass_the_checker():
    """One policy for all layers: dp on the effective chain equals brute force, offload included (rule 8)."""
    from policy_instances import instance
    from workbench.model.activations import apply_policies
    from workbench.planners.dp.contiguous import plan_dp

    for seed in range(40):
        chain, plat = instance(500 + seed, max_layers=5)
        pol = ("keep", "recompute", "offload")[seed % 3]
        eff = apply_policies(chain, pol)
        a, b = plan_dp(eff, plat), plan_brute(eff, plat)
        assert a.feasible == b.feasible and (not a.feasible or a.period == pytest.approx(b.period, rel=1e-6)), seed
        if seed % 4 == 0:
            g = plan_brute(eff, plat, allocation="general")
            if g.feasible:
                assert check(g.with_(activations=(pol,) * len(chain)), chain, plat) == [], seed


def test_cache_tells_chains_apart_by_their_meta():
    # the chain's equality leaves its meta out; the runtime constant (meta runtime_bytes) changes its memory
    layers = tuple(Layer(f"l{i}", 1.0, 2.0, 100, 40) for i in range(4))
    plat = Target.of(2, memory=600, optimizer="sgd")
    assert plan_brute(Chain(layers, input_bytes=40), plat).feasible
    assert not plan_brute(Chain(layers, input_bytes=40, meta={"runtime_bytes": "400"}), plat).feasible
