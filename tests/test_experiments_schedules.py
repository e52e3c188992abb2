"""Which schedule at which memory: the best plan per level across families, the general allocation against every
torch schedule, and the frontier of one chain."""

from __future__ import annotations

import math

import pandas as pd

from workbench.experiments.schedules import (
    TORCH_KEYS,
    best_at_three_levels,
    best_per_level,
    frontier_levels,
    frontier_table,
    general_vs_torch,
    schedules_figure,
)
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target


def _sweeps() -> pd.DataFrame:
    rows = []
    # level 0: only dp fits; level 1: 1F1B beats dp; level 2: the general ILP beats everything; level 3: a tie
    table = {0: {"dp": 5.0, "ilp-general": math.nan, "1f1b": math.nan, "zbv": math.nan},
             1: {"dp": 4.0, "ilp-general": 3.5, "1f1b": 3.0, "zbv": 3.2},
             2: {"dp": 3.0, "ilp-general": 2.0, "1f1b": 2.5, "zbv": 2.2},
             3: {"dp": 2.0, "ilp-general": 2.0, "1f1b": 2.4, "zbv": 2.0}}
    for lvl, periods in table.items():
        for key, period in periods.items():
            rows.append({"network": "toy", "devices": 2, "level": lvl, "memory_limit": float(2**30 * (lvl + 1)),
                         "method_key": key, "fits": not math.isnan(period), "period": period})
    return pd.DataFrame(rows)


def test_the_best_plan_per_level_is_named_across_families():
    best = best_per_level(_sweeps())
    assert best["method_key"].tolist() == ["dp", "1f1b", "ilp-general", "dp"]
    assert best["family"].tolist() == ["periodic", "flushed", "periodic", "periodic"]
    assert best.iloc[3]["tied"] == "ilp-general,zbv"


def test_the_general_allocation_against_torchs_schedules():
    duel = general_vs_torch(_sweeps())
    assert duel["winner"].tolist() == ["neither", "torch", "general", "tie"]
    assert duel.iloc[1]["torch_best"] == "1f1b" and duel.iloc[2]["ratio"] == 2.2 / 2.0
    assert set(TORCH_KEYS) >= {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv",
                               "dualpipev"}


def test_three_levels_and_the_figure():
    best = best_per_level(_sweeps())
    three = best_at_three_levels(best)
    assert three["where"].tolist() == ["tight", "middle", "loose"] and three["best"].tolist()[1] == "general ILP"
    info = schedules_figure(_sweeps())
    assert info.stems == ["schedules_toy"] and set(info.tables) == {"best_plan.csv", "general_vs_torch.csv"}
    assert any("faster in 1 (up to 1.1x), slower in 1 (down to 0.857x, by 1f1b)" in h for h in info.headlines)


def test_the_frontier_of_one_chain_has_every_variant_at_every_level():
    chain = Chain(tuple(Layer(f"l{i}", 1e-3, 2e-3, 2**20, 2**18, 2**19) for i in range(8)), input_bytes=2**18)
    plat = Target.of(2, optimizer="sgd")
    levels = frontier_levels(chain, plat, 3)
    assert levels == sorted(levels) and len(levels) == 3
    table = frontier_table(chain, plat, levels, keys=("dp", "1f1b", "zbv", "ilp-general"), time_limit=2)
    assert len(table) == 4 * 3 and (table.groupby("method_key").size() == 3).all()
    loosest = table[table.memory_limit == levels[-1]]
    assert loosest["fits"].all() and (loosest["throughput"] > 0).all()


def test_close_levels_do_not_collide():
    """The markers' labels alternate above and below along a row, and the axis labels only levels 15 % apart."""
    from workbench.experiments.schedules import _markers, spaced_ticks

    best = pd.DataFrame({"network": ["n"] * 3, "devices": [2] * 3, "level": [0, 1, 2],
                         "memory_limit": [1.00 * 2**30, 1.05 * 2**30, 2.0 * 2**30], "method_key": ["dp"] * 3,
                         "period": [3.0, 2.0, 1.0], "tied": [""] * 3})
    fig = _markers("n", best)
    assert list(fig.data[0].textposition) == ["top center", "bottom center", "top center"]
    assert list(fig.layout.xaxis.tickvals) == spaced_ticks([1.0, 1.05, 2.0]) == [1.0, 2.0]
