"""A search in a second process while the main one solves: how the ILP uses a machine's second core.

HiGHS solves the MILP on one core; the searches that find general plans
(:func:`workbench.planners.ilp.search.guided_search`, then
:func:`workbench.planners.ilp.search.local_search` with kicks) run on another.
:func:`start_search` forks a process that searches from a plan until a deadline (a ``perf_counter``
time: the clock is the system's monotonic one, shared by the processes) and sends back the best
allocation it scored exactly; :meth:`Background.result` waits for it (at most a moment past the
deadline) and rebuilds it as a plan, which the caller re-checks before using it. Where a process
cannot be forked (not Linux, or a single core), :func:`start_search` returns None and the caller
runs its searches itself.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.dp.contiguous import plan_dp
>>> import time
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 1) for i in range(4)), input_bytes=1)
>>> plat = Target.of(2, memory=1000, memory_model="paper")
>>> bg = start_search(ch, plat, plan_dp(ch, plat), time.perf_counter() + 1.0, cores=2)
>>> bg is None or bg.result() is None or bg.result().period <= plan_dp(ch, plat).period
True
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

from workbench.model.chain import Chain
from workbench.model.plan import Plan, make_plan
from workbench.model.target import Target
from workbench.planners.ilp.search import guided_search, local_search

__all__ = ["Background", "start_search", "GUIDED_SHARE"]

#: the background's time goes this much to the guided search, the rest to the local search with kicks
GUIDED_SHARE = 0.6
#: seconds the main process waits past the deadline for the background's answer
GRACE = 1.0


def _search(chain: Chain, platform: Target, start: Plan, deadline: float, target: float | None,
            max_stages: int, conn: Any) -> None:
    """The child: the guided search, then the local search with kicks, from ``start``; sends the best
    (assignment, period, forward starts, backward starts), or None if nothing beat ``start``."""
    best = start
    try:
        mid = time.perf_counter() + GUIDED_SHARE * max(0.0, deadline - time.perf_counter())
        g = guided_search(chain, platform, best, deadline=mid, max_stages=max_stages, target=target)
        best = g if g.period < best.period else best
        if target is None or best.period > target:
            loc = local_search(chain, platform, best, deadline=deadline, kicks=1_000_000)
            best = loc if loc.period < best.period else best
    except Exception:  # noqa: BLE001 - a failed search finds nothing; the main process goes on
        pass
    if best is start:
        conn.send(None)
    else:
        conn.send((tuple(best.assignment), best.period, [s.fwd_start for s in best.stages],
                   [s.bwd_start for s in best.stages]))
    conn.close()


class Background:
    """A running background search (:func:`start_search`)."""

    def __init__(self, process: Any, conn: Any, chain: Chain, platform: Target, deadline: float) -> None:
        self.process, self.conn, self.chain, self.platform, self.deadline = process, conn, chain, platform, deadline
        self._answer: Plan | None = None
        self._done = False

    def result(self) -> Plan | None:
        """The best plan the search found (None: nothing better than its start, or no answer by the deadline
        plus :data:`GRACE`); it stops the process."""
        if not self._done:
            wait = max(0.0, self.deadline - time.perf_counter()) + GRACE
            if self.conn.poll(wait):
                try:
                    got = self.conn.recv()
                except (EOFError, OSError):
                    got = None
                if got is not None:
                    a, T, f, b = got
                    self._answer = make_plan(self.chain, self.platform, T, list(a), f, b, method="guided_search")
            self.stop()
        return self._answer

    def stop(self) -> None:
        """End the process (its answer, if not read yet, is lost)."""
        self._done = True
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=1.0)
        self.conn.close()


def start_search(chain: Chain, platform: Target, start: Plan, deadline: float, *, target: float | None = None,
                 max_stages: int | None = None, cores: int | None = None) -> Background | None:
    """Fork a process searching general plans from ``start`` until ``deadline`` (module docstring); None where
    there is no second core or no ``fork``, or in a daemonic process (a Dask worker's: it may have no
    children). ``target``: a proven lower bound (the search stops there)."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if cores < 2 or not sys.platform.startswith("linux") or multiprocessing.current_process().daemon:
        return None
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    stages = max_stages if max_stages is not None else 2 * platform.devices
    proc = ctx.Process(target=_search, args=(chain, platform, start, deadline, target, stages, child), daemon=True)
    proc.start()
    child.close()
    return Background(proc, parent, chain, platform, deadline)
