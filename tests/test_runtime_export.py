"""Export to torch.distributed.pipelining action lists: round trip through the installed torch's loader."""

from __future__ import annotations

import pytest

from instances import runtime_plans
from workbench.model.plan import Plan, Stage
from workbench.runtime.export import actions_to_csv, format_grid, load_with_torch, plan_to_actions, write_schedule_csv

pytest.importorskip("torch.distributed.pipelining")


@pytest.mark.parametrize("comms", [False, True])
def test_round_trip_through_torch_loader(tmp_path, comms):
    from torch.distributed.pipelining import schedules as ts

    for k, plan in enumerate(runtime_plans()):
        m = 5
        path = write_schedule_csv(plan, tmp_path / f"plan{k}.csv", m, comms=comms)
        ours = plan_to_actions(plan, m, comms=comms)
        actions, stage_to_rank, lowered = load_with_torch(path, len(plan.stages), m,
                                                          format="compute_comms" if comms else "compute_only")
        # the text round-trips action for action, and torch infers the plan's stage -> device map
        assert {r: [str(a) for a in acts] for r, acts in actions.items()} == ours
        assert stage_to_rank == {s: st.device for s, st in enumerate(plan.stages)}
        # each rank runs F then B of every micro-batch of its stages once
        for r, acts in actions.items():
            comp = [a for a in acts if a.computation_type in (ts.F, ts.B)]
            mine = [s for s, st in enumerate(plan.stages) if st.device == r]
            assert len(comp) == 2 * m * len(mine)
        # our send/recv insertion agrees with torch's lowering (same comm actions per rank)
        if comms:
            from_torch = load_with_torch(write_schedule_csv(plan, tmp_path / f"c{k}.csv", m), len(plan.stages), m)[2]
            for r in actions:
                comm = lambda xs: sorted(str(a) for a in xs if "SEND" in str(a) or "RECV" in str(a))  # noqa: E731
                assert comm(actions[r]) == comm(from_torch[r])


def test_export_keeps_the_plan_order():
    plan = Plan(period=3.0, assignment=(0, 1), devices=2,
                stages=(Stage(0, 0, 0, 0.0, 4.0, 2), Stage(1, 1, 1, 1.0, 2.0, 1)))
    acts = plan_to_actions(plan, 4)
    assert acts[0] == ["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"]
    assert actions_to_csv(acts).splitlines()[1] == "1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3"
    assert "Rank 1" in format_grid(acts)


def test_torch_rejects_a_broken_schedule(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("0F0,0B0\n1B0,1F0\n")        # backward before forward on rank 1
    with pytest.raises(AssertionError):
        load_with_torch(p, 2, 1)


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev"])
def test_torch_schedule_plans_export_torchs_order_and_torch_accepts_it(tmp_path, name):
    from workbench.model.chain import Chain, Layer
    from workbench.model.target import Target
    from workbench.planners import plan
    from workbench.schedules.torch_orders import torch_order

    ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 4, 1, 1) for i in range(8)), input_bytes=1)
    p = plan(ch, Target.of(2, memory_model="paper"), name, micro_batches=4)
    assert plan_to_actions(p, 4) == {d: [str(a) for a in acts] for d, acts in torch_order(name, 2, 2, 4).items()}
    path = write_schedule_csv(p, tmp_path / "s.csv", 4)
    _, stage_to_rank, _ = load_with_torch(path, 4, 4)      # torch's parser, lowering and dry run
    assert stage_to_rank == {i: st.device for i, st in enumerate(p.stages)}
