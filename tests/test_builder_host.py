"""workbench.schedules.builder_host: the general builder with host-link transfers (rule 8)."""

from __future__ import annotations

import pytest

from policy_instances import instance
from workbench.model.activations import apply_policies
from workbench.planners.evaluate.period import allocation_period
from workbench.schedules.builder import Scheduler, best_schedule
from workbench.schedules.builder_host import general_offload, settle
from workbench.verify.check import check


def test_settle_needs_every_move_to_agree():
    assert settle(10.0, 0.0, [lambda t: t + 1.0 if t < 3.0 else t]) == pytest.approx(3.0)
    assert settle(10.0, 0.0, [lambda t: None]) is None
    assert settle(1.0, 0.0, [lambda t: t + 0.5]) is None          # never settles: no slot


def test_general_schedules_with_offload_are_valid_and_not_below_brute():
    """The asap builder places host-link transfers (rule 8); its period is never below brute force's."""
    tried = 0
    for seed in range(30):
        chain, plat = instance(700 + seed, max_layers=5)
        if plat.devices < 2 or len(chain) < 3:
            continue
        eff = apply_policies(chain, "offload")
        asg = [0, 1] + [0] * (len(chain) - 2)            # device 0 holds two stages
        p = best_schedule(eff, plat, asg)
        if not p.feasible:
            continue
        tried += 1
        assert check(p.with_(activations=("offload",) * len(chain)), chain, plat) == [], seed
        exact = allocation_period(eff, plat, asg)
        assert exact is not None and p.period >= exact[0] * (1 - 1e-6), seed
    assert tried >= 5


def test_the_builder_books_transfers_apart():
    chain, plat = instance(711, max_layers=5)
    eff = apply_policies(chain, "offload")
    sched = Scheduler(eff, plat.with_(devices=max(plat.devices, 2), memory=float("inf")),
                      [0, 1] + [0] * (len(chain) - 2))
    T = sched.load_period * 3
    f, b = general_offload(sched.F, sched.B, sched.c, sched.dev, sched.x, T)
    assert len(f) == len(b) == sched.stage_count and all(bb >= ff for ff, bb in zip(f, b))
