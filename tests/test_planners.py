"""The method dispatcher (workbench.planners.plan): every plan is re-checked before it is returned."""

from __future__ import annotations

import time

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan
from workbench.model.target import Target
from workbench.planners import GENERAL_METHODS, plan
from workbench.planners import PLANNERS as METHODS
from workbench.verify.check import check


def _chain(first_ms: float = 1.0) -> Chain:
    return Chain((Layer("a", first_ms / 1e3, 1e-3, 10, 4),) +
                 tuple(Layer(f"l{i}", 1e-3, 2e-3, 10, 4) for i in range(3)), input_bytes=4)


def test_a_plan_the_checker_rejects_is_never_optimal(monkeypatch):
    import workbench.planners as planners

    ch, plat = _chain(), Target.of(2, memory_model="paper")

    def liar(chain, platform, **_):  # period below the load of device 0: rule 5
        return make_plan(chain, platform, 1e-3, [0, 0, 1, 1], [0.0, 0.004], [0.01, 0.006], status="optimal", gap=0.0)

    monkeypatch.setattr(planners, "get_planner", lambda method: liar)
    p = plan(ch, plat, "dp")
    assert p.status == "feasible" and p.gap is None
    assert p.extra["violations"] and p.extra["violations"][0].startswith("rule 5")
    assert "the checker rejects this plan" in p.notes[-1]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_returns_a_plan_its_checker_accepts_or_says_so(method):
    """A layer of 1e297 s (past what a profile may hold) breaks the planners' float arithmetic;
    whatever they return, nothing the checker rejects is reported optimal."""
    ch, plat = _chain(1e300), Target.of(2, bandwidth=12e9, memory_model="paper")
    p = plan(ch, plat, method, allocation="general" if method in GENERAL_METHODS else "contiguous")
    if p.feasible and check(p, ch, plat):
        assert p.status != "optimal" and p.extra["violations"]


def test_valid_optimal_plans_pass_unchanged():
    ch, plat = _chain(), Target.of(2, memory=1000, memory_model="paper")
    p = plan(ch, plat, "dp")
    assert p.status == "optimal" and "violations" not in p.extra and not check(p, ch, plat)


@pytest.mark.parametrize("method,allocation,activations", [
    ("dp", "contiguous", "auto"), ("ilp", "contiguous", "auto"), ("ilp", "general", "auto"),
    ("ilp", "general", "keep"), ("pipedream", "contiguous", "auto"), ("mcap", "contiguous", "auto"),
    ("gpipe", "contiguous", "recompute"), ("interleaved-1f1b", "contiguous", "keep"),
    ("zbv", "contiguous", "keep")])
def test_every_method_honours_the_time_limit_on_a_dag_profile(method, allocation, activations):
    """PipeDream's resnet50 (177 layers) on 8 devices at a binding limit, 1 s for the whole call: every method
    ends within 10 % + 2 s, and what it returns is checked (a plan, or a flushed plan over the limit that says
    so) or says it stopped. The limit counts the import of torch's pipelining that torch's schedules need (1-6 s
    cold, by the machine's load; orders kept on disk spare later processes it: test_torch_orders); the test
    imports it first so that it measures the planner's own work (5.1 s and 7.5 s for interleaved-1f1b and
    zbv under load before their search polled the clock)."""
    import torch.distributed.pipelining  # noqa: F401

    from workbench.profiles import load_profile

    chain = load_profile("pipedream/resnet50")
    plat = Target.of(8, memory="5GiB")
    t0 = time.perf_counter()
    p = plan(chain, plat, method, allocation=allocation, activations=activations, time_limit=1.0)
    assert time.perf_counter() - t0 <= 1.1 * 1.0 + 2.0
    assert p.status in ("optimal", "feasible", "timeout", "infeasible")
    if p.feasible:  # a flushed plan over the limit says so (its re-check's violations), as the checker does
        assert len(check(p, chain, plat)) == len(p.extra.get("violations", []))
