"""Budgets: how long each phase of a planner may run, in seconds or, deterministically, in work.

A planner call with a time limit makes one :class:`Budget` when it starts;
each phase (an incumbent search, the cover search, the MILP, the final bound)
asks it for a deadline: a share of what is left, less what later phases
reserve. The searches poll their deadline as ``time.perf_counter() > deadline``
(:mod:`workbench.planners.brute`, :mod:`workbench.planners.ilp.cover`,
:mod:`workbench.planners.ilp.search` all do), so a deadline is either a float
(wall-clock: the default) or a :class:`WorkDeadline`.

**Deterministic budgets** (``deterministic=True``). A wall-clock deadline
stops a search wherever the machine happens to be, so two runs differ. A
:class:`WorkDeadline` compares as passed once the search has polled it a fixed
number of times (its *ticks*: one per node of the order and vector searches
of brute, per 1,024 nodes of the cover search, per move of the guided search),
so a search stops at the same point on every run. A phase's ticks are its
nominal seconds times the rate that search polls at on the reference machine
(``TICKS_PER_SECOND``, measured on the project's 2-core CPU machine by
``benchmarks/ilp_budget.py``); the MILP gets ``mip_max_nodes`` instead of a time
limit, after the root node, whose work no node limit bounds: it is estimated from the
model's size (:func:`milp_root_seconds`), and the MILP is skipped when its share cannot
cover it. Nominal seconds flow as wall seconds do: a phase that stops early
leaves its unused ticks to the next. The wall clock stays as a safety net at
``DETERMINISTIC_SLACK`` times the limit (plus 2 s): a phase it stops is
recorded (:attr:`Budget.cut_short`) and the plan says its result may vary (:data:`MAY_VARY`, and
``extra["may_vary"]``).

**Progress.** ``progress`` (any callable taking a line) receives one line per
phase; without it a budget is quiet.

>>> b = Budget(10.0)
>>> d = b.deadline(0.5)            # half of the 10 s left: a perf_counter() time
>>> 4.9 < d - b.t0 < 5.1
True
>>> w = Budget(10.0, deterministic=True).deadline(0.5, "cover")
>>> w.ticks_left == int(5.0 * TICKS_PER_SECOND["cover"])
True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["Budget", "WorkDeadline", "within", "charge", "milp_root_seconds", "milp_rows", "milp_ready_seconds",
           "BUILD_ROWS_PER_SECOND", "TICKS_PER_SECOND", "CANDIDATE_TICKS",
           "MILP_NODES_PER_SECOND", "DETERMINISTIC_SLACK", "PhaseShares", "POLISH_SECONDS", "MIN_CHILD_SECONDS",
           "MAY_VARY"]

#: polls of the deadline per second of each search on the reference machine (benchmarks/ilp_budget.py)
TICKS_PER_SECOND: dict[str, float] = {
    "local_search": 50_000.0,
    "cover": 20_000.0,
    "guided_search": 30_000.0,
    "bound": 1_000.0,
}
#: ticks charged for each allocation scored exactly (work the evaluator does between polls)
CANDIDATE_TICKS = 500
#: rows of a plan MILP Pyomo builds per second (measured on the shared 2-core machine: 5,000-8,000)
BUILD_ROWS_PER_SECOND = 5000.0
#: branch-and-bound nodes of HiGHS per second on the reference machine (a 32-block general model)
MILP_NODES_PER_SECOND = 5.0
#: deterministic budgets: the wall clock stops a call only after this many times its limit (plus 2 s)
DETERMINISTIC_SLACK = 3.0
#: seconds for the polishing LP of a MILP solution when there is no time limit
POLISH_SECONDS = 30.0
#: the least time limit a sub-call gets (a budget needs a positive number of seconds)
MIN_CHILD_SECONDS = 1e-3
#: what a plan's notes say when the wall-clock safety net stopped one of its deterministic phases (the plan
#: also records it as ``extra["may_vary"]``, workbench.model.plan_extra)
MAY_VARY = "deterministic budgets: the wall-clock safety net stopped a phase; this result may vary"


@dataclass(frozen=True)
class PhaseShares:
    """How the ILP shares a time limit among its phases (docs/model.md, "Planners"; the phases are in
    :mod:`workbench.planners.ilp.phases` and :mod:`workbench.planners.ilp.coarse`). A *share* is a
    fraction of what is left when the phase starts; an *until* is the fraction of the whole limit
    spent when the phase must end; seconds are wall-clock (or, deterministic, nominal) seconds.

    >>> PhaseShares().local_search, PhaseShares().refine_until
    (0.25, 0.98)
    """

    #: the local search from the incumbent (general): this share of what is left, at most ``search_seconds``
    local_search: float = 0.25
    #: the stage-path bound's stages packed onto the devices (general, planners/ilp/packing.py): this share
    packing: float = 0.1
    #: seconds of a time limit kept from the MILP for the polishing LP ...
    polish_reserve: float = 1.0
    #: ... at most this fraction of the limit
    polish_reserve_share: float = 0.1
    #: with less left (wall-clock budgets), the MILP is skipped: the incumbent and its gap
    milp_min_seconds: float = 0.2
    #: the least time limit HiGHS and the polishing LP get; the polishing LP's without a time limit
    solver_floor: float = 0.05
    polish_seconds: float = POLISH_SECONDS
    #: graph mode needs about this many times the default order's DP (best_order and a DP)
    graph_after_dp: float = 3.0
    #: coarsened plans: the stage-path bound on the layers runs first, until this fraction of the limit, ...
    fine_bound_until: float = 0.2
    #: ... (general) its stages packed onto the devices until this one, ...
    packing_until: float = 0.3
    #: ... on 16 blocks or more (general), the block ILP until this one, ...
    block_until: float = 0.45
    #: ... (on fewer blocks, or contiguous, until this one) ...
    block_alone_until: float = 0.8
    #: ... the half-block solve until this one (without a limit: this many seconds), ...
    half_blocks_until: float = 0.65
    half_blocks_seconds: float = 30.0
    #: ... the guided search on the fine chain until this one (without a limit: this many seconds, and
    #: it stops after ``stale_kicks`` kicks in a row find nothing better, or once it meets the bound)
    refine_until: float = 0.98
    refine_seconds: float = 20.0
    stale_kicks: int = 25


class WorkDeadline:
    """A deadline that passes after ``ticks`` polls (``time.perf_counter() > deadline``), or at the
    wall-clock time ``wall`` (a safety net: then ``cut_short`` is set).

    >>> d = WorkDeadline(2)
    >>> [time.perf_counter() > d for _ in range(4)], d.used
    ([False, False, True, True], 2)
    """

    def __init__(self, ticks: int, wall: float | None = None, parent: "WorkDeadline | None" = None) -> None:
        self.ticks = max(0, int(ticks))
        self.wall = wall
        self.parent = parent
        self.used = 0          # polls answered "not yet"
        self.over = False      # passed (for good)
        self.cut_short = False

    @property
    def ticks_left(self) -> int:
        return 0 if self.over else max(0, self.ticks - self.used)

    def _passed(self, now: float) -> bool:
        if not self.over:
            if self.used >= self.ticks or (self.parent is not None and self.parent._passed(now)):
                self.over = True
            elif self.wall is not None and now > self.wall:
                self.over = self.cut_short = True
            else:
                self.used += 1
        return self.over

    def charge(self, ticks: int) -> None:
        """Count ``ticks`` polls' worth of work done without polling (e.g. an allocation scored)."""
        if not self.over:
            self.used = min(self.ticks, self.used + int(ticks))
            if self.parent is not None:
                self.parent.charge(ticks)

    def __lt__(self, now: float) -> bool:      # now > deadline
        return self._passed(now)

    def __gt__(self, now: float) -> bool:      # now < deadline
        return not self._passed(now)


class Budget:
    """The seconds (or, ``deterministic``, the work) a planner call may spend, and its progress lines.

    ``seconds=None``: no limit (deadlines are None, and phases use their own defaults).
    """

    def __init__(self, seconds: float | None = None, *, deterministic: bool = False,
                 progress: Callable[[str], None] | None = None, prefix: str = "",
                 wall_end: float | None = None) -> None:
        if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"a time limit must be a positive finite number of seconds, got {seconds}")
        self.seconds = seconds
        self.deterministic = deterministic
        self.progress = progress
        self.prefix = prefix
        self.t0 = time.perf_counter()
        if wall_end is None and seconds is not None:
            slack = DETERMINISTIC_SLACK if deterministic else 1.0
            wall_end = self.t0 + slack * seconds + (2.0 if deterministic else 0.0)
        #: when the wall clock stops this budget: its limit, or (deterministic) the safety net
        self.wall_end = wall_end
        self._spent = 0.0                     # deterministic: nominal seconds of finished work
        self._open: list[tuple[WorkDeadline, float]] = []   # work deadlines and their rates
        self._children: list[Budget] = []
        self._cut_short = False

    # ----- what is left --------------------------------------------------------------------
    @property
    def limited(self) -> bool:
        return self.seconds is not None

    def elapsed(self) -> float:
        """Wall seconds since the budget was made."""
        return time.perf_counter() - self.t0

    def spent(self) -> float:
        """Seconds used: wall seconds, or (deterministic) the nominal seconds of the work done."""
        if not self.deterministic:
            return self.elapsed()
        return (self._spent + sum(d.used / rate for d, rate in self._open)
                + sum(c.spent() for c in self._children))

    def left(self) -> float:
        """Seconds left (inf without a limit; never negative)."""
        if self.seconds is None:
            return math.inf
        return max(0.0, self.seconds - self.spent())

    @property
    def cut_short(self) -> bool:
        """True when a deterministic phase was stopped by the wall clock (its result may vary)."""
        return (self._cut_short or any(d.cut_short for d, _ in self._open)
                or any(c.cut_short for c in self._children))

    # ----- deadlines -------------------------------------------------------------------------
    def phase_seconds(self, share: float = 1.0, reserve: float = 0.0, default: float | None = None,
                      until: float | None = None) -> float | None:
        """Seconds for the next phase: ``share`` of what is left after ``reserve`` seconds kept for
        later phases, or (``until``) what is left until that fraction of the limit is spent;
        ``default`` (may be None) without a limit.

        >>> Budget(10.0, deterministic=True).phase_seconds(until=0.2)
        2.0
        """
        if self.seconds is None:
            return default
        if until is not None:
            return max(0.0, min(until * self.seconds - self.spent(), self.left() - reserve))
        return max(0.0, (self.left() - reserve) * share)

    def deadline(self, share: float = 1.0, search: str = "local_search", *, reserve: float = 0.0,
                 default: float | None = None, cap: float | None = None,
                 until: float | None = None) -> float | WorkDeadline | None:
        """A deadline for the next phase (see :meth:`phase_seconds`; at most ``cap`` seconds): a
        ``perf_counter`` time, or (deterministic) a :class:`WorkDeadline` of that many seconds of
        ``search``'s polls."""
        secs = self.phase_seconds(share, reserve, default, until)
        if secs is None:
            return None
        if cap is not None:
            secs = min(secs, cap)
        if not self.deterministic:
            end = time.perf_counter() + secs
            return end if self.wall_end is None else min(end, self.wall_end)
        rate = TICKS_PER_SECOND[search]
        d = WorkDeadline(int(secs * rate), self.wall_end)
        self._open.append((d, rate))
        return d

    def milp_limits(self, reserve: float = 0.0, root_seconds: float = 0.0) -> dict[str, float | int] | None:
        """Solver limits for the MILP: ``{"time_limit": s}`` (wall-clock), or (deterministic) a node
        limit for what is left after ``root_seconds`` (the root node's estimated work, which no
        node limit bounds) with the safety net as the time limit; None: skip the MILP
        (deterministic, less work left than its root needs). ``{}`` without a limit."""
        secs = self.phase_seconds(reserve=reserve)
        if secs is None:
            return {}
        if not self.deterministic:
            return {"time_limit": secs}
        if secs < root_seconds:
            return None
        self._spent += root_seconds
        nodes = max(1, int((secs - root_seconds) * MILP_NODES_PER_SECOND))
        wall = max(0.01, (self.wall_end or math.inf) - time.perf_counter())
        return {"time_limit": wall, "mip_max_nodes": nodes}

    def spend_nodes(self, nodes: int) -> None:
        """Deterministic budgets: count a MILP's branch-and-bound nodes as work done."""
        if self.deterministic:
            self._spent += max(0, nodes) / MILP_NODES_PER_SECOND

    def child(self, share: float = 1.0, reserve: float = 0.0, default: float | None = None,
              prefix: str = "", until: float | None = None) -> "Budget":
        """A budget for a sub-call (e.g. the ILP on blocks): ``share`` of what is left (see
        :meth:`phase_seconds`); its work counts against this one."""
        secs = self.phase_seconds(share, reserve, default, until)
        secs = None if secs is None else max(secs, MIN_CHILD_SECONDS)
        wall = None
        if secs is not None:   # never past this budget's own end (deterministic: its safety net)
            own = time.perf_counter() + secs
            wall = self.wall_end if self.deterministic else min(own, self.wall_end or own)
        c = Budget(secs, deterministic=self.deterministic, progress=self.progress, prefix=self.prefix + prefix,
                   wall_end=wall)
        if self.deterministic:
            self._children.append(c)
        return c

    def note_cut_short(self) -> None:
        """Record that the wall clock stopped a deterministic phase (e.g. the MILP)."""
        if self.deterministic:
            self._cut_short = True

    # ----- progress ----------------------------------------------------------------------------
    def say(self, line: str) -> None:
        """Send a progress line (nothing without a ``progress`` sink)."""
        if self.progress is not None:
            self.progress(self.prefix + line)

    def describe(self, secs: float | None) -> str:
        """'up to 3.2 s' / 'up to 3.2 s of work' / 'no limit', for progress lines."""
        if secs is None:
            return "no time limit"
        return f"up to {secs:.1f} s" + (" of work" if self.deterministic else "")


def within(deadline: float | WorkDeadline | None, seconds: float, search: str) -> float | WorkDeadline:
    """A deadline ``seconds`` from now (deterministic: that many seconds of ``search``'s polls), never
    after ``deadline``.

    >>> d = within(WorkDeadline(3), 1.0, "cover")   # the outer deadline's 3 polls end it first
    >>> [time.perf_counter() > d for _ in range(4)]
    [False, False, False, True]
    """
    if isinstance(deadline, WorkDeadline):
        return WorkDeadline(int(seconds * TICKS_PER_SECOND[search]), deadline.wall, parent=deadline)
    end = time.perf_counter() + seconds
    return end if deadline is None else min(end, deadline)


def charge(deadline: float | WorkDeadline | None, ticks: int = CANDIDATE_TICKS) -> None:
    """Charge ``ticks`` to a :class:`WorkDeadline` (nothing for a wall-clock deadline)."""
    if isinstance(deadline, WorkDeadline):
        deadline.charge(ticks)


def milp_rows(layers: int, devices: int) -> int:
    """About how many rows the general plan MILP of ``layers`` x ``devices`` has (fitted on 16x4: 2,261,
    32x4: 7,605, 24x8: 7,865, 32x8: 12,553; the contiguous one has fewer).

    >>> milp_rows(32, 8)
    12288
    """
    return int(6 * layers ** 2 + 12 * layers * devices + 1.5 * layers * devices ** 2)


def milp_ready_seconds(layers: int, devices: int) -> float:
    """Seconds before HiGHS can be stopped on a general MILP of ``layers`` x ``devices``: Pyomo building it
    (:data:`BUILD_ROWS_PER_SECOND`) and half the root node's estimate (:func:`milp_root_seconds`; HiGHS
    polls its time limit inside the root node, but late). Under a wall-clock limit the MILP is skipped when
    less than this is left.

    >>> round(milp_ready_seconds(32, 4), 1)
    5.2
    """
    rows = milp_rows(layers, devices)
    return rows / BUILD_ROWS_PER_SECOND + 0.5 * milp_root_seconds(rows)


def milp_root_seconds(constraints: int) -> float:
    """Estimated seconds of HiGHS's root node (presolve, cuts, heuristics) for a plan model with
    ``constraints`` rows, on the reference machine: ``(constraints / 2500) ** 1.6``, fitted on
    general models of 8-32 blocks on 2-8 devices (1,567 rows: 1.0 s; 7,605: 5.6 s; 12,553: 14.5 s).

    >>> round(milp_root_seconds(12_553), 1)
    13.2
    """
    return (max(0, constraints) / 2500.0) ** 1.6
