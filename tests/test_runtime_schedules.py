"""torch's multi-stage schedules run on torch.distributed (gloo, CPU) with torch's own schedule classes: every rank
runs torch's order, the gradients equal one process's, every rank's peak (MemTracker) is within 5 % of the
prediction and never more than 2 % above it.

No timing is asserted (the machine is shared). ``benchmarks/memory.py --schedules`` runs the same on larger models.
"""

from __future__ import annotations

import pytest

from workbench.methods import METHODS
from workbench.model.chain import Platform
from workbench.planners import plan as run_planner
from workbench.runtime.engine import Workload, grad_error, reference_gradients, run_plan
from workbench.schedules.order_memory import engine_extra
from workbench.schedules.torch_orders import torch_order

SCHEDULES = [m.name for m in METHODS if m.torch_class]
TIMEOUT = 120


@pytest.fixture(scope="module")
def gpt():
    """A GPT of 4 (2 ranks) or 6 (4 ranks) blocks, width 64: its profile (split measured) and workload."""
    from workbench.profiles.profiler import profile_zoo

    out = {}
    for P, layers in ((2, 4), (4, 6)):
        cfg = {"layers": layers, "d_model": 64, "heads": 2, "seq_len": 64, "vocab": 1024}
        out[P] = (profile_zoo("gpt", 2, repeats=1, warmup=0, **cfg), Workload.zoo("gpt", 2, **cfg))
    return out


def _run_and_check(chain, wl, P: int, name: str):
    platform = Platform(P, weights="single", optimizer="adam")
    plan = run_planner(chain, platform, name, micro_batches=2 * P)
    assert plan.fits and not plan.extra.get("violations")
    m = plan.micro_batches
    res = run_plan(plan, wl, m, weights="single", chain=chain, platform=platform, optimizer="adam", timeout=TIMEOUT)
    assert res.meta["engine"] == "torch"
    # every rank ran torch's order (the class computed it itself), one operation at a time
    order = torch_order(name, P, len(plan.stages) // P, m)
    comp = res.trace.ops[res.trace.ops["kind"].isin(["F", "B", "I", "W"])]
    for d in range(P):
        mine = comp[comp["device"] == d].sort_values("start")
        assert [f"{r.stage}{r.kind}{r.batch}" for r in mine.itertuples()] == [str(a) for a in order[d]]
    assert grad_error(res.grads, reference_gradients(wl, m))[1] < 1e-6
    extra = engine_extra(plan, chain, platform, m)
    for d in range(P):
        predicted, measured = plan.memory[d] + extra[d], res.meta["memory_peak"][d]
        assert -0.02 <= predicted / measured - 1 <= 0.05, (name, d, predicted, measured)
    return plan, res


@pytest.mark.parametrize("name", SCHEDULES)
def test_two_ranks(gpt, name):
    chain, wl = gpt[2]
    _run_and_check(chain, wl, 2, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["interleaved-zb", "zbv"])
def test_four_ranks(gpt, name):
    """Four ranks: the looped layout's zero bubble, and the V whose last device holds the two middle stages."""
    chain, wl = gpt[4]
    plan, _ = _run_and_check(chain, wl, 4, name)
    assert len({s.device for s in plan.stages}) == 4


def test_a_plan_of_torchs_schedule_runs_its_own_micro_batch_count(gpt):
    chain, wl = gpt[2]
    plan = run_planner(chain, Platform(2, weights="single"), "zbv", micro_batches=4)
    with pytest.raises(ValueError, match="--steps 4"):
        run_plan(plan, wl, 6, weights="single")
