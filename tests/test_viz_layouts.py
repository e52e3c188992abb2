"""The layouts chart: families, the Pareto frontier (against a brute-force one), published points."""

from __future__ import annotations

import itertools
import random

import pandas as pd

from workbench.model.layout import Layout
from workbench.parallel.evaluate import Evaluation
from workbench.viz.layouts import FAMILY_COLOURS, Published, layout_family, layout_frontier, layout_points, pareto

GIB = 2**30


def _e(layout: Layout, tokens: float, peak_gib: float, status: str = "fits") -> Evaluation:
    memory = (peak_gib * GIB,) if status != "infeasible" else ()
    return Evaluation(layout, "keep", status, 1.0, memory, tokens, 0.3)


def test_every_combination_of_degrees_has_a_family_with_a_colour():
    names = {layout_family(Layout(tp=t, pp=p, dp=d)) for t, p, d in itertools.product((1, 2), repeat=3)}
    assert names == set(FAMILY_COLOURS)
    assert layout_family(Layout(tp=8, pp=8, dp=1)) == "TP x PP"


def test_pareto_matches_a_brute_force_frontier():
    rng = random.Random(3)
    t = pd.DataFrame({"peak_gib": [rng.choice([10.0, 20.0, 30.0, 40.0]) for _ in range(40)],
                      "tokens_per_gpu": [rng.uniform(0, 100) for _ in range(40)],
                      "fits": [rng.random() < 0.8 for _ in range(40)]})
    ok = t[t["fits"]]
    brute = {i for i, r in ok.iterrows()
             if not any((o["peak_gib"] <= r["peak_gib"] and o["tokens_per_gpu"] >= r["tokens_per_gpu"]
                         and (o["peak_gib"], o["tokens_per_gpu"]) != (r["peak_gib"], r["tokens_per_gpu"]))
                        for _, o in ok.iterrows())}
    assert set(pareto(t).index) == brute


def test_points_skip_layouts_without_a_plan_and_divide_by_the_gpus():
    evs = [_e(Layout(dp=4, zero=3), 4000.0, 30.0), _e(Layout(pp=4), 2000.0, 90.0, "over"),
           _e(Layout(tp=4), 0.0, 0.0, "infeasible")]
    p = layout_points(evs, 4)
    assert p["tokens_per_gpu"].tolist() == [1000.0, 500.0] and p["fits"].tolist() == [True, False]


def test_the_chart_draws_families_the_frontier_the_limit_and_published_points():
    evs = [_e(Layout(dp=4, zero=3), 4000.0, 30.0), _e(Layout(pp=4), 2000.0, 90.0, "over"),
           _e(Layout(pp=2, dp=2), 3000.0, 40.0)]
    fig = layout_frontier(evs, 4, title="toy", memory_limit=80 * GIB,
                          published=[Published("theirs", evs[0], 1200.0), Published("no figure", evs[2])],
                          chosen=evs[0])
    names = [t.name for t in fig.data]
    assert names[:4] == ["frontier (fastest at each memory)", "DP (FSDP / ZeRO)", "PP (pure pipeline)", "PP x DP"]
    assert list(fig.data[2].marker.symbol) == ["circle-open"]           # over the memory: hollow
    assert list(fig.data[0].x) == [30.0]                                # the pipeline over 80 GiB is not on it
    theirs = [t for t in fig.data if t.hovertemplate and "theirs: published" in t.hovertemplate]
    assert len(theirs) == 1 and list(theirs[0].y) == [1000.0, 1200.0]
    assert not any(t.hovertemplate and "no figure: published" in t.hovertemplate for t in fig.data)
    assert fig.layout.shapes[0].x0 == 80.0
    star = next(t for t in fig.data if t.name == "no figure")
    assert star.marker.color == FAMILY_COLOURS["PP x DP"] and list(star.y) == [750.0]
    ring = next(t for t in fig.data if t.name == "chosen")
    assert (list(ring.x), list(ring.y)) == ([30.0], [1000.0])
