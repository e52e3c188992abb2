"""workbench.parallel.run.summary: where each rank's prediction comes from, the tied copies' check, the table."""

import math

import torch

from layout_runs import pipeline_plan
from workbench.model.layout import Layout
from workbench.parallel.run.summary import format_layout_summary, predict_rank_memory, tied_copies_equal


def test_the_prediction_is_one_call_with_its_source_named():
    lay = Layout(pp=2, dp=2)
    pipeline = pipeline_plan([2], 5).with_(memory=(100.0, 200.0))
    assert [predict_rank_memory(pipeline, None, None, lay, r, 2)[0] for r in range(4)] == [100.0, 100.0, 200.0, 200.0]
    assert "tp=1, dp=1 prediction" in predict_rank_memory(pipeline, None, None, lay, 0, 2)[1]
    per_rank = pipeline.with_(memory=(1.0, 2.0, 3.0, 4.0))     # a plan that lists every rank's peak
    assert predict_rank_memory(per_rank, None, None, lay, 2, 2) == (3.0, "the plan's per-rank memory")


def test_tied_copies_that_differ_are_reported():
    w = torch.ones(3)
    same = [{"tied": {"w": {"weight": w, "grad": w}}}, {"tied": {"w": {"weight": w.clone(), "grad": w.clone()}}}]
    assert tied_copies_equal(same) == {"w": True}
    apart = same + [{"tied": {"w": {"weight": w + 1e-7, "grad": w}}}]
    assert tied_copies_equal(apart) == {"w": False}


def test_the_table_prints_every_rank():
    ranks = [{"rank": r, "coords": list(Layout(pp=2, dp=2).coords(r)), "memory_predicted": 100.0,
              "memory_measured": 101.0 + r, "collectives": {"all_gather": 8, "reduce_scatter": 0}} for r in range(4)]
    text = format_layout_summary({"model": "m", "layout": "TP 1 x PP 2 x DP 2, FSDP", "devices": 4,
                                  "micro_batches": 2, "schedule": "1f1b", "optimizer": "adam", "dtype": "float32",
                                  "wall_seconds": 1.0, "ranks": ranks, "prediction": ["p"],
                                  "max_grad_error": math.nan, "grad_tolerance": 1e-5,
                                  "tied_copies_equal": {"w": False}})
    assert "rank 3 (pp 1, dp 1, tp 0): predicted 100 B -> measured 104 B (+4.00%); collectives at the peak: " \
           "all_gather 8 B" in text
    assert "not checked" in text and "tied w: copies on the pipeline ranks DIFFER" in text
