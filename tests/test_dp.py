"""Tests for workbench.planners.dp.contiguous against brute force written here, independently."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from instances import compositions
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.planners.dp.contiguous import least_contiguous_memory, plan_dp, schedule_partition
from workbench.planners.partition import bottleneck_partition

try:
    from workbench.verify.check import check
except ImportError:  # pragma: no cover - the checker lands separately
    check = None


# ----------------------------------------------------------------------------
# independent brute force
# ----------------------------------------------------------------------------
def stage_sums(chain: Chain, a: int, b: int):
    ls = chain.layers[a:b + 1]
    F = sum(l.forward for l in ls)
    B = sum(l.backward for l in ls)
    A = sum(chain.saved(i) for i in range(a, b + 1))
    W = sum(l.weight_bytes for l in ls)
    return F, B, A, W


def comm(chain: Chain, plat: Target, b: int) -> float:
    if b == len(chain) - 1:
        return 0.0
    return plat.latency + chain.cut(b) / plat.bandwidth


def bottleneck(chain, plat, parts):
    return max(max(sum(stage_sums(chain, a, b)[:2]), comm(chain, plat, b)) for a, b in parts)


def brute_unconstrained(chain, plat):
    return min(bottleneck(chain, plat, parts) for parts in compositions(len(chain), plat.devices))


def paper_memory(chain, plat, a, b, k):
    F, B, A, W = stage_sums(chain, a, b)
    return k * A + plat.setup.weight_factor * W + (k - 1) * W * (plat.setup.weights == "stash")


def fits(chain, plat, parts, T, memory=paper_memory):
    """The window recurrence of the brief, written out again: valid at period T? ``memory(chain,
    plat, a, b, k)``: the bytes of stage a..b alone on its device with k mini-batches in flight."""
    w = None
    for s in range(len(parts) - 1, -1, -1):
        a, b = parts[s]
        F, B, _, _ = stage_sums(chain, a, b)
        c = comm(chain, plat, b)
        if F + B > T * (1 + 1e-12) or c > T * (1 + 1e-12):
            return False
        raw = F + B if w is None else F + 2 * c + w + B
        k = max(1, math.ceil(raw / T - 1e-9))
        w = raw if raw - (k - 1) * T >= F + B else (k - 1) * T + F + B
        if memory(chain, plat, a, b, k) > plat.memory * (1 + 1e-9):
            return False
    return True


def brute_min_period(chain, plat, parts, memory=paper_memory):
    lo = bottleneck(chain, plat, parts)
    if fits(chain, plat, parts, lo, memory):
        return lo
    hi = lo + sum(sum(stage_sums(chain, a, b)[:2]) + 2 * comm(chain, plat, b) for a, b in parts) * 1.01
    if not fits(chain, plat, parts, hi, memory):
        return math.inf
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fits(chain, plat, parts, mid, memory) else (mid, hi)
    return hi


def random_chain(rng: np.random.Generator, L: int, *, mem: bool = False) -> Chain:
    layers = []
    for i in range(L):
        f = float(rng.uniform(0.1, 3.0))
        layers.append(Layer(f"l{i}", f, float(f * rng.uniform(1, 3)), float(rng.integers(0, 100)),
                            float(rng.integers(1, 60)) if mem else float(rng.integers(0, 40))))
    return Chain(tuple(layers), input_bytes=float(rng.integers(1, 50)))


# ----------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------
def test_unconstrained_matches_brute_force_on_300_chains():
    rng = np.random.default_rng(1)
    for trial in range(300):
        L = int(rng.integers(1, 11))
        P = int(rng.integers(1, 5))
        chain = random_chain(rng, L)
        plat = Target.of(P, bandwidth=float(rng.choice([10.0, 30.0, math.inf])), latency=float(rng.choice([0, 0.2])),
                        memory_model="paper")
        p = plan_dp(chain, plat)
        want = brute_unconstrained(chain, plat)
        assert p.period == pytest.approx(want, rel=1e-9), (trial, L, P)
        assert p.status == "optimal"
        if check is not None:
            assert check(p, chain, plat) == [], (trial, [str(v) for v in check(p, chain, plat)])


def test_memory_limited_matches_brute_force_on_150_chains():
    rng = np.random.default_rng(7)
    n_limited = n_infeasible = 0
    for trial in range(150):
        L = int(rng.integers(2, 9))
        P = int(rng.integers(2, 5))
        chain = random_chain(rng, L, mem=True)
        base = Target.of(P, bandwidth=float(rng.choice([20.0, 80.0])),
                        weights=str(rng.choice(["stash", "single"])), weight_factor=float(rng.choice([1, 2])),
                        memory_model="paper")
        # memory between the k=1 minimum and a loose limit, so that both regimes occur
        kmin, _ = least_contiguous_memory(chain, base)
        plat = base.with_(memory=float(kmin * rng.uniform(0.6, 3.0)))
        periods = {tuple(pa): brute_min_period(chain, plat, pa) for pa in compositions(L, P)}
        want = min(periods.values())
        p = plan_dp(chain, plat)
        if math.isinf(want):
            n_infeasible += 1
            assert p.status == "infeasible" and "least memory" in p.notes[0]
            continue
        unconstrained = brute_unconstrained(chain, plat)
        n_limited += want > unconstrained * (1 + 1e-9)
        assert p.period == pytest.approx(want, rel=1e-6), (trial, L, P)
        assert p.fits
        if check is not None:
            assert check(p, chain, plat) == [], (trial, [str(v) for v in check(p, chain, plat)])
    assert n_limited >= 20 and n_infeasible >= 5      # the test exercises both regimes


def test_least_memory_is_k1_bottleneck():
    rng = np.random.default_rng(3)
    for _ in range(50):
        chain = random_chain(rng, int(rng.integers(1, 8)), mem=True)
        plat = Target.of(int(rng.integers(1, 4)), weight_factor=2.0, memory_model="paper")
        got, _ = least_contiguous_memory(chain, plat)
        want = min(max(stage_sums(chain, a, b)[2] + 2.0 * stage_sums(chain, a, b)[3] for a, b in parts)
                   for parts in compositions(len(chain), plat.devices))
        assert got == pytest.approx(want)


def test_infeasible_says_least_memory():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 100, 10) for i in range(4)), input_bytes=10)
    p = plan_dp(chain, Target.of(2, memory=150, memory_model="paper"))
    assert p.status == "infeasible" and not p.feasible
    assert "220 B" in p.notes[0] or "220" in p.notes[0]   # 2 layers: 2*(10+100)


def test_bottleneck_partition_fewest_stages():
    cost = np.array([[1.0, 1.0], [0.0, 1.0]])
    assert bottleneck_partition(cost, 2) == (1.0, [(0, 1)])


def test_window_recurrence_delays_backward():
    # stage 0: F=1, B=1; stage 1: F=1, B=1.5; T=2.5: raw0 = 1 + 2.5 + 1 = 4.5, k=2, r=2 = F+B: no delay.
    ch = Chain((Layer("a", 1, 1, 0, 0), Layer("b", 1, 1.5, 0, 0)))
    plan = schedule_partition(ch, Target.of(2, memory_model="paper"), [(0, 0), (1, 1)], method="t", period=2.5)
    windows = [s.bwd_start + c - s.fwd_start for s, c in zip(plan.stages, (1, 1.5))]
    assert windows == pytest.approx([4.5, 2.5]) and [s.in_flight for s in plan.stages] == [2, 1]
    # T=2.6: raw0 = 4.5, k=2, r=1.9 < 2: delayed to (k-1)T + F + B = 4.6
    plan = schedule_partition(ch, Target.of(2, memory_model="paper"), [(0, 0), (1, 1)], method="t", period=2.6)
    assert plan.stages[0].bwd_start + 1 - plan.stages[0].fwd_start == pytest.approx(4.6)


def test_general_allocation_gets_note_and_registry_dispatch():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(6)))
    p = run_planner(chain, Target.of(3, memory_model="paper"), "dp", allocation="general")
    assert p.period == pytest.approx(6.0) and p.allocation == "contiguous"
    assert any("contiguous" in n for n in p.notes)


def test_memory_limit_raises_period_monotonically():
    rng = np.random.default_rng(11)
    chain = random_chain(rng, 30, mem=True)
    base = Target.of(4, bandwidth=50.0, memory_model="paper")
    kmin, _ = least_contiguous_memory(chain, base)
    periods = [plan_dp(chain, base.with_(memory=kmin * f)).period for f in (1.0, 1.3, 2.0, 4.0, 100.0)]
    assert all(a >= b * (1 - 1e-9) for a, b in zip(periods, periods[1:]))
    assert math.isfinite(periods[0])
    assert periods[-1] == pytest.approx(plan_dp(chain, base).period)


def test_agrees_with_schedule_best_schedule():
    """schedule.best_schedule (written separately) finds the same least period on dp's partition."""
    schedule = pytest.importorskip("workbench.schedules.builder")
    rng = np.random.default_rng(21)
    for _ in range(40):
        chain = random_chain(rng, int(rng.integers(2, 12)), mem=True)
        base = Target.of(int(rng.integers(2, 5)), bandwidth=40.0, memory_model="paper")
        kmin, _ = least_contiguous_memory(chain, base)
        plat = base.with_(memory=kmin * float(rng.uniform(1.0, 2.5)))
        p = plan_dp(chain, plat)
        q = schedule.best_schedule(chain, plat, p.assignment)
        assert q.period == pytest.approx(p.period, rel=1e-6)


def _peer(name):
    from workbench.profiles import available_profiles, load_profile

    if f"pipedream/{name}" not in available_profiles():
        pytest.skip("peer profiles absent")
    return load_profile(f"pipedream/{name}")


@pytest.mark.parametrize("P,want_ms", [(2, 370.9), (4, 216.4), (8, 159.5)])
def test_reproduces_pipedream_optimum_vgg16(P, want_ms):
    chain = _peer("vgg16")
    assert plan_dp(chain, Target.of(P, memory_model="paper")).period * 1e3 == pytest.approx(want_ms, abs=0.06)


def test_graph_mode_on_resnet50():
    from workbench.model.plan import chain_for_plan

    chain = _peer("resnet50")
    plat = Target.of(8, memory_model="paper")
    p = plan_dp(chain, plat)
    default = plan_dp(chain, plat, graph=False)
    assert p.period * 1e3 == pytest.approx(56.7, abs=0.05)
    assert p.period <= default.period * (1 + 1e-9)
    if p.chain_order is not None:
        used = chain_for_plan(p, chain)
        assert sorted(l.name for l in used.layers) == sorted(l.name for l in chain.layers)
        if check is not None:
            assert check(p, chain, plat) == []


def test_cli_dp_with_memory(tmp_path):
    from workbench.front.cli import main

    _peer("vgg16")
    out = tmp_path / "p.json"
    rc = main(["plan", "--profile", "pipedream/vgg16", "--devices", "4", "--memory", "8GiB", "--method", "dp",
               "--memory-model", "paper",
               "--json", str(out)])
    import json

    d = json.loads(out.read_text())
    assert rc == 0 and d["status"] == "optimal" and max(d["memory"]) <= 8 * 2**30
    rc = main(["plan", "--profile", "pipedream/vgg16", "--devices", "4", "--memory", "1GiB", "--method", "dp",
               "--memory-model", "paper",
               "--json", str(out)])
    d = json.loads(out.read_text())
    assert rc != 0 and d["status"] == "infeasible"


# ----------------------------------------------------------------------------
# long chains: the banded probes, the search from the bound, time limits
# ----------------------------------------------------------------------------
def _full_model_chain(rng: np.random.Generator, L: int) -> Chain:
    return Chain(tuple(Layer(f"l{i}", float(rng.uniform(1e-4, 3e-3)), float(rng.uniform(2e-4, 6e-3)),
                             float(rng.uniform(0, 2e7)), float(rng.uniform(1e6, 2e7)), float(rng.uniform(1e6, 4e7)))
                       for i in range(L)), input_bytes=1e6)


def test_search_from_the_bound_finds_the_same_period(monkeypatch):
    """Long chains climb from the unconstrained period (dp.WIDE_PROBE); the period is the one the
    descent from above finds, bit for bit, and the plan is valid."""
    from workbench.planners.dp import contiguous as dp

    rng = np.random.default_rng(17)
    for trial in range(12):
        chain = _full_model_chain(rng, int(rng.integers(20, 200)))
        free = plan_dp(chain, Target.of(int(rng.integers(2, 24))))
        plat = Target.of(free.devices, memory=free.peak_memory * float(rng.uniform(0.2, 0.9)))
        monkeypatch.setattr(dp, "WIDE_PROBE", math.inf)
        down = plan_dp(chain, plat)
        monkeypatch.setattr(dp, "WIDE_PROBE", 0)
        up = plan_dp(chain, plat)
        assert up.period == down.period and up.status == down.status, trial
        if up.feasible:
            assert check(up, chain, plat) == []


def test_long_chain_with_a_binding_limit_is_valid_and_not_below_the_bounds():
    rng = np.random.default_rng(23)
    chain = _full_model_chain(rng, 1500)
    free = plan_dp(chain, Target.of(32))
    plat = Target.of(32, memory=free.peak_memory * 0.4)
    p = plan_dp(chain, plat)
    assert p.status == "optimal" and p.period > free.period and check(p, chain, plat) == []
    # optimal up to the search's precision: the partition found just below the period does not fit
    from workbench.planners.dp.memory_dp import memory_dp

    assert memory_dp(chain, plat, p.period * (1 - 2e-9)) is None


def test_time_limit_stops_the_search_with_a_gap_and_progress():
    rng = np.random.default_rng(29)
    chain = _full_model_chain(rng, 3000)
    free = plan_dp(chain, Target.of(64))
    lines: list[str] = []
    t = time.perf_counter()
    p = plan_dp(chain, Target.of(64, memory=free.peak_memory * 0.3), time_limit=0.3, progress=lines.append)
    assert time.perf_counter() - t < 0.3 + 1.0
    assert p.status == "timeout" and lines and lines[0].startswith("dp: 3000 layers x 64 devices")
    if p.feasible:
        assert p.gap is not None and p.gap > 0 and p.period >= free.period


def test_least_contiguous_memory_against_the_checkers_memory():
    """The k = 1 bottleneck, against the checker's own memory of every stage (workbench.verify.check_memory)."""
    from workbench.verify.check_memory import memory_by_device

    rng = np.random.default_rng(31)
    for _ in range(30):
        L, P = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, float(rng.uniform(0, 50)), float(rng.uniform(1, 40)),
                                  float(rng.uniform(0, 60)), forward_peak_bytes=float(rng.uniform(0, 90)))
                            for i in range(L)), input_bytes=3.0)
        plat = Target.of(P, optimizer=str(rng.choice(["sgd", "adam"])))
        want = min(max(memory_by_device(chain, Target.of(1, optimizer=plat.setup.optimizer), [(a, b, 0, 1)])[0]
                       for a, b in parts) for parts in compositions(L, P))
        got, parts = least_contiguous_memory(chain, plat)
        assert got == pytest.approx(want, rel=1e-9)
        assert max(memory_by_device(chain, Target.of(1, optimizer=plat.setup.optimizer), [(a, b, 0, 1)])[0]
                   for a, b in parts) == pytest.approx(got, rel=1e-9)


def test_a_probe_looks_at_the_clock_between_its_bands(monkeypatch):
    """A probe builds its bands a block of rows at a time; past the deadline it stops before the next block
    (on 50,000 layers one probe's bands took a minute before the deadline was looked at)."""
    import importlib

    mdp = importlib.import_module("workbench.planners.dp.memory_dp")

    built = []
    real = mdp._band
    monkeypatch.setattr(mdp, "_band", lambda *a, **k: built.append(1) or real(*a, **k))
    monkeypatch.setattr(mdp, "BAND_ELEMENTS", 50)
    chain = _full_model_chain(np.random.default_rng(5), 300)
    plat = Target.of(8, memory=plan_dp(chain, Target.of(8)).peak_memory * 0.5)
    built.clear()
    with pytest.raises(TimeoutError):
        mdp.memory_dp(chain, plat, 10.0, deadline=time.perf_counter() - 1.0)
    assert built == []
    assert mdp.memory_dp(chain, plat, 10.0) is not None and len(built) > 1


def test_a_long_chain_starts_from_a_plan_on_blocks(monkeypatch):
    """Long chains whose limit binds first plan on blocks of ten layers (dp.coarse_start): that plan is valid
    on the layers, and the search below it ends on the same optimum as without it."""
    from workbench.planners.dp import coarse_start
    from workbench.planners.dp import contiguous as dp

    rng = np.random.default_rng(41)
    for trial in range(4):
        chain = _full_model_chain(rng, int(rng.integers(300, 600)))
        free = plan_dp(chain, Target.of(16))
        plat = Target.of(16, memory=free.peak_memory * float(rng.uniform(0.2, 0.5)))
        monkeypatch.setattr(dp, "WIDE_PROBE", 0)
        monkeypatch.setattr(dp, "MIN_LAYERS", 10**9)
        without = plan_dp(chain, plat)
        monkeypatch.setattr(dp, "MIN_LAYERS", 200)
        lines: list[str] = []
        with_start = plan_dp(chain, plat, progress=lines.append)
        assert any("a first plan on" in line for line in lines), trial
        assert with_start.period == pytest.approx(without.period, rel=1e-9) and with_start.status == "optimal"
        assert check(with_start, chain, plat) == []
        start = coarse_start.block_start(chain, lambda blocks: dp.plan_dp(blocks, plat).stages and [
            (s.first, s.last) for s in dp.plan_dp(blocks, plat).stages], lambda b: dp.partition_period(chain, plat, b))
        assert start is not None and start[1] >= without.period * (1 - 1e-9)
