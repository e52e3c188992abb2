"""Tests for workbench.model.tolerances."""

from __future__ import annotations

import numpy as np

from workbench.model import tolerances
from workbench.model.tolerances import CEIL_SLACK, ceil_count, ceil_counts


def test_ceil_forgives_only_float_noise():
    assert ceil_count(3.0 * (1 + CEIL_SLACK / 2)) == 3
    assert ceil_count(3.0 * (1 + 1e-9)) == 4
    assert ceil_count(0.0) == 1
    assert ceil_counts(np.array([0.0, 3.0 * (1 + CEIL_SLACK / 2), 3.0 * (1 + 1e-9)])).tolist() == [1.0, 3.0, 4.0]


def test_every_tolerance_is_a_small_positive_number_below_the_plans():
    names = [n for n in tolerances.__all__ if n.isupper()]
    assert names and all(0 < getattr(tolerances, n) < 1 for n in names)
    # a bound's bisection may stop early (it rounds down, so it stays a bound); every other one is below REL_TOL
    loose = [n for n in names if getattr(tolerances, n) > tolerances.REL_TOL]
    assert loose == ["STAGE_BOUND_PRECISION"], loose
