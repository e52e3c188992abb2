"""The frontier chart: a line per method, the best that fits at each limit beneath, labelled."""

from __future__ import annotations

import pandas as pd

from workbench.viz.frontier import frontier_figure, frontier_points


def _table() -> pd.DataFrame:
    return pd.DataFrame({"method_key": ["dp", "dp", "zbv", "zbv"],
                         "label": ["memory-aware DP"] * 2 + ["ZB-V (torch)"] * 2,
                         "family": ["periodic"] * 2 + ["flushed"] * 2, "memory_limit": [2**30, 2**31] * 2,
                         "throughput": [1.0, 1.5, 0.0, 2.0]})


def test_the_frontier_takes_the_fastest_that_fits():
    best = frontier_points(_table())
    assert best["label"].tolist() == ["memory-aware DP", "ZB-V (torch)"] and best["throughput"].tolist() == [1.0, 2.0]


def test_a_method_that_does_not_fit_has_no_point_there():
    fig = frontier_figure(_table(), "toy")
    zbv = next(t for t in fig.data if t.name == "ZB-V (torch)")
    assert list(zbv.x) == [1.0, 2.0] and pd.isna(zbv.y[0]) and zbv.y[1] == 2.0
    assert fig.data[0].name == "best that fits (frontier)" and list(fig.data[0].text) == ["memory-aware DP",
                                                                                           "ZB-V (torch)"]
