"""Every tolerance the workbench compares numbers with, named by what it compares.

Plans are valid up to :data:`REL_TOL` (docs/model.md, "Plan": "numbers are
compared with a relative tolerance of 1e-6"); everything else here is float
slack *inside* one computation, far below it, so that what a planner accepts
the checker accepts too. Each name says what it is relative to.

>>> REL_TOL > PERIOD_SEARCH > CEIL_SLACK
True
>>> ceil_count(2.0000000000001), ceil_count(0.2)
(2, 1)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "REL_TOL", "PERIOD_SEARCH", "CEIL_SLACK", "MEMORY_SLACK", "SLOT_FIT", "COUNT_NOISE", "ORDER_SLACK", "TIE",
    "BOUND_SEARCH",
    "MILP_GAP", "SOLVER_FEASIBILITY", "BETTER", "INCUMBENT_CAP", "COUNT_SLACK", "LOAD_SLACK", "FLOOR_MARGIN",
    "PRUNE_SLACK", "LAST_BITS", "COVER_SLACK", "SET_THRESHOLD_SEARCH", "STAGE_BOUND_PRECISION", "TINY",
    "START_PERIOD",
    "ceil_count", "ceil_counts",
]

#: a plan's numbers (start times, period, memory against the limit), relative: the checker's tolerance
REL_TOL = 1e-6
#: the least-period searches stop when their bracket is this narrow, relative to the period
PERIOD_SEARCH = 1e-9
#: in-flight counts: ceil(x) with x shrunk by this relative slack, so that 2.0000000000001 counts as 2
CEIL_SLACK = 1e-12
#: a planner's memory test against the limit M: bytes <= M * (1 + MEMORY_SLACK) (float sums of bytes)
MEMORY_SLACK = 1e-9
#: the schedule builders: an operation fits a free gap of the period if it overhangs by at most this x T
SLOT_FIT = 1e-9
#: the order search of a general allocation: a difference system is consistent up to this x T (float sums)
ORDER_SLACK = 1e-10
#: in-flight counts from a window of x periods: ceil(x - COUNT_SLACK) (an absolute slack on the count)
COUNT_SLACK = 1e-9
#: a load or an operation's length against a period: <= T * (1 + LOAD_SLACK)
LOAD_SLACK = 1e-9
#: dp's memory floor excludes a stage only above M x (1 + MEMORY_SLACK) x (1 + FLOOR_MARGIN): far beyond what
#: two float sums of the same bytes can differ by (and its in-flight floor is ceil(x (1 - FLOOR_MARGIN)))
FLOOR_MARGIN = 1e-9
#: brute force's order search prunes a branch above the memory limit x (1 + PRUNE_SLACK) (its leaves test exactly)
PRUNE_SLACK = 1e-12
#: sums of the same floats in another order differ in their last bits: a step up of at least this, a tie within it
LAST_BITS = 1e-15
#: the cover search: loads, thresholds and memory against a period or the limit, x (1 +- COVER_SLACK)
COVER_SLACK = 1e-9
#: the cover search's bisection on each device set's memory threshold stops within this, relative
SET_THRESHOLD_SEARCH = 1e-13
#: the stage-path lower bound's bisection stops within this (relative; it rounds down, so it stays a bound)
STAGE_BOUND_PRECISION = 1e-3
#: the least positive number a period or time scale is given where 0 would divide
TINY = 1e-300
#: a search for a least period whose lower end is 0 starts from this many seconds
START_PERIOD = 1e-12
#: the ILP's default relative gap: a plan within it of its proven bound is reported optimal
MILP_GAP = 1e-6
#: HiGHS's integrality / feasibility tolerance on every solve (tight: the checker re-checks the plan)
SOLVER_FEASIBILITY = 1e-9
#: a search keeps a new period only below the incumbent's x (1 - BETTER) (no churn on float ties)
BETTER = 1e-9
#: the MILP's period cap is the incumbent's x (1 + INCUMBENT_CAP), so that the incumbent stays feasible
INCUMBENT_CAP = 1e-7
#: the per-layer memory bound's bisection (ilp_bounds.memory_period_bound): precision and memory slack
BOUND_SEARCH = 1e-12
#: two periods within this relative distance are a tie (then a secondary key decides)
TIE = 1e-12
#: the schedule builder's in-flight count: ceil(x) forgives x - floor(x) up to this x max(x, 1) (float noise)
COUNT_NOISE = 1e-12


def ceil_count(x: float) -> int:
    """``ceil(x)`` with :data:`CEIL_SLACK`, at least 1: the in-flight count of a window of x periods.

    >>> ceil_count(3.0), ceil_count(3.01)
    (3, 4)
    """
    return max(1, math.ceil(x * (1.0 - CEIL_SLACK)))


def ceil_counts(x: np.ndarray | float) -> np.ndarray:
    """:func:`ceil_count` element-wise, as floats (numpy arrays of windows in periods).

    >>> ceil_counts(np.array([0.5, 2.0000000000001, 2.5])).tolist()
    [1.0, 2.0, 3.0]
    """
    return np.maximum(1.0, np.ceil(np.asarray(x) * (1.0 - CEIL_SLACK)))
