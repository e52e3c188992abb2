"""workbench.parallel.run.pipeline: torch's multi-stage schedules under data parallelism, against one process."""

import pytest

from layout_runs import mlp, tiny_gpt2
from workbench.model.layout import Layout
from workbench.model.plan import Plan, Stage
from workbench.parallel.run.checks import check_layout_plan
from workbench.parallel.run.config import LayoutConfig
from workbench.parallel.run.launch import layout_gradient_errors, run_layout
from workbench.parallel.run.pipeline import needs_programs, schedule_kind
from workbench.parallel.run.summary import tied_copies_equal


def _two_per_device(schedule: str, devices: list[int]) -> Plan:
    """Four stages of a 5-layer chain, two per pipeline device (``devices``: each stage's)."""
    bounds = [(0, 0), (1, 1), (2, 2), (3, 4)]
    stages = tuple(Stage(a, b, d, 0.0, 0.0, 1) for (a, b), d in zip(bounds, devices))
    assignment = tuple(d for (a, b), d in zip(bounds, devices) for _ in range(a, b + 1))
    return Plan(1.0, assignment, stages, 2, memory=(0.0, 0.0), schedule=schedule, micro_batches=4)


@pytest.mark.parametrize("schedule,devices,zero,wl", [
    ("interleaved-1f1b", [0, 1, 0, 1], 3, tiny_gpt2),     # the tied embedding and head on the two ranks
    ("zbv", [0, 1, 1, 0], 2, mlp),                       # a V, its backward split: zero 2 only
])
def test_multi_stage_schedules_with_data_parallelism_equal_one_process(schedule, devices, zero, wl):
    cfg = LayoutConfig(_two_per_device(schedule, devices), Layout(pp=2, dp=2, zero=zero), wl(), 4)
    check_layout_plan(cfg.plan, cfg.layout)
    parts = run_layout(cfg)
    _, rel = layout_gradient_errors(parts, cfg.workload, cfg.layout, 4, say=lambda *a, **k: None)
    assert rel < 1e-4
    assert all(tied_copies_equal(parts).values())


def test_a_split_backward_is_refused_where_torch_gets_it_wrong():
    with pytest.raises(ValueError, match="zbv schedule splits each backward .* zero=3 .* run it with zero=2"):
        check_layout_plan(_two_per_device("zbv", [0, 1, 1, 0]), Layout(pp=2, dp=2, zero=3))
    with pytest.raises(ValueError, match=r"zero=0 \(DDP\)"):
        check_layout_plan(_two_per_device("interleaved-zb", [0, 1, 0, 1]), Layout(pp=2, dp=2))
    check_layout_plan(_two_per_device("interleaved-zb", [0, 1, 0, 1]), Layout(pp=2))      # no data parallelism


def test_a_vocabulary_parallel_loss_runs_under_an_interleaved_schedule():
    """lp=1 (the loss on vocabulary-sharded logits under torch's loss_parallel) on the last of four stages, two per
    pipeline rank, GPT-2's head tied to its embedding on the other rank: gradients equal one process's."""
    plan = _two_per_device("interleaved-1f1b", [0, 1, 0, 1])
    layout = Layout(tp=2, pp=2, loss_parallel=True)
    check_layout_plan(plan, layout)
    cfg = LayoutConfig(plan, layout, tiny_gpt2(), 4)
    parts = run_layout(cfg)
    _, rel = layout_gradient_errors(parts, cfg.workload, cfg.layout, 4, say=lambda *a, **k: None)
    assert rel < 1e-5
    assert all(tied_copies_equal(parts).values())


def test_which_schedules_run_the_plans_own_order():
    assert schedule_kind("gpipe") == "torch class ScheduleGPipe" and schedule_kind("zbv").endswith("ZBVZeroBubble")
    assert needs_programs(Plan(1.0, (0,), (), 1, schedule="periodic"))
    assert not needs_programs(Plan(1.0, (0,), (), 1, schedule="1f1b"))
