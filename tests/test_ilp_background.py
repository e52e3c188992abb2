"""workbench.planners.ilp.background: the search on a second core, its deadline, its answer re-checked."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from instances import footprint_limit, ilp_chain
from workbench.model.target import Target
from workbench.planners.budget import Budget
from workbench.planners.dp.contiguous import plan_dp
from workbench.planners.ilp.background import GRACE, start_search
from workbench.planners.ilp.options import IlpOptions
from workbench.planners.ilp.runner import Run, run_phases
from workbench.verify.check import check


def random_chain_and_platform(seed: int, L: int, P: int):
    rng = np.random.default_rng(seed)
    chain = ilp_chain(rng, L)
    return chain, Target.of(P, memory=footprint_limit(chain, P, rng, 1.5, 2.5), memory_model="paper")


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the background search forks (Linux)")


@linux
def test_the_background_search_answers_by_its_deadline_with_a_valid_plan():
    for seed in range(3):
        chain, plat = random_chain_and_platform(seed, 10, 3)
        start = plan_dp(chain, plat, graph=False)
        t0 = time.perf_counter()
        bg = start_search(chain, plat, start, t0 + 1.5, cores=2)
        assert bg is not None
        got = bg.result()
        assert time.perf_counter() - t0 <= 1.5 + GRACE + 1.0
        assert not bg.process.is_alive()
        if got is not None:
            assert got.period < start.period and check(got, chain, plat) == []


def test_one_core_runs_nothing_in_the_background():
    chain, plat = random_chain_and_platform(0, 6, 2)
    assert start_search(chain, plat, plan_dp(chain, plat), time.perf_counter() + 1.0, cores=1) is None


def test_a_daemonic_process_runs_nothing_in_the_background():
    """A Dask worker is daemonic and may have no children: the ILP runs without its second core there (a
    forked search would fail the unit)."""
    import multiprocessing

    def child(conn):
        chain, plat = random_chain_and_platform(0, 6, 2)
        conn.send(start_search(chain, plat, plan_dp(chain, plat), time.perf_counter() + 1.0, cores=2) is None)

    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(there,), daemon=True)
    proc.start()
    assert here.recv() is True
    proc.join()


@linux
def test_the_runner_stops_the_background_when_a_phase_fails():
    chain, plat = random_chain_and_platform(1, 8, 2)
    run = Run(chain, plat, "general", IlpOptions(), Budget(5.0))

    def starts(r):
        r.background = start_search(chain, plat, plan_dp(chain, plat), time.perf_counter() + 30.0, cores=2)

    def fails(r):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_phases(run, [starts, fails])
    assert not run.background.process.is_alive()
