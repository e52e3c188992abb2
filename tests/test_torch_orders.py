"""torch's orders as the workbench reads them: the same as torch's own schedule classes compute, laid out as torch
lays out the stages."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining import schedules as ts

from workbench.schedules.registry import TORCH_SCHEDULES, schedule_of
from workbench.schedules.torch_orders import torch_order


@pytest.mark.parametrize("name", sorted(TORCH_SCHEDULES))
@pytest.mark.parametrize("P,m", [(2, 4), (4, 8), (4, 16)])
def test_every_operation_once_in_a_rank_order_torch_accepts(name, P, m):
    V = schedule_of(name).chunks(None)
    order = torch_order(name, P, V, m)
    S = P * V
    dev = schedule_of(name).stage_devices(P, S)
    for rank, acts in order.items():
        assert all(dev[a.stage] == rank for a in acts)
    forwards = sorted((a.stage, a.batch) for acts in order.values() for a in acts if a.kind == "F")
    assert forwards == [(s, i) for s in range(S) for i in range(m)]
    # torch's own validation of a compute-only schedule (every action once, per stage and micro-batch)
    parsed = {r: [ts._Action.from_str(str(a)) for a in acts] for r, acts in order.items()}
    assert ts._validate_schedule(parsed, P, S, m) is not None


def test_the_interleaved_order_is_torchs_own_class_output():
    """Against torch's class computing its order by itself (its private method on a bare instance)."""
    cls = ts.ScheduleInterleaved1F1B
    inst = cls.__new__(cls)
    inst.pp_group_size, inst._n_microbatches, inst.n_local_stages = 4, 8, 2
    inst.number_of_rounds = 2
    inst.microbatches_per_round = 4
    for rank in range(4):
        theirs = [str(a) for a in inst._calculate_single_rank_operations(rank) if a is not None]
        assert [str(a) for a in torch_order("interleaved-1f1b", 4, 2, 8)[rank]] == theirs


def test_dualpipev_overlapped_actions_become_a_forward_then_a_full_backward():
    order = torch_order("dualpipev", 2, None, 4)
    text = [str(a) for a in order[0]]
    assert text[7:9] == ["0F3", "3B1"]          # torch's (0F3;3B1)OVERLAP_F_B


def test_refusals_name_torchs_reason():
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        torch_order("dualpipev", 4, None, 4)
    with pytest.raises(ValueError, match="unknown torch schedule"):
        torch_order("nosuch", 2, 2, 4)


@pytest.mark.parametrize("name", sorted(TORCH_SCHEDULES))
def test_the_order_is_what_torchs_full_class_computes(name):
    """The order is read from torch's class without its lowering to communication actions (quadratic in the
    micro-batches: 10,000 ran past 300 s); against the class built whole, as torch builds it."""
    from workbench.schedules.torch_orders import _StandIn

    sched = schedule_of(name)
    for P, m in [(1, 2), (2, 4), (2, 6), (3, 9), (4, 8), (4, 12)]:
        V = sched.chunks(None)
        S = P * V
        mine = [s for s, d in enumerate(sched.stage_devices(P, S)) if d == 0]
        try:
            whole = getattr(ts, sched.torch_class)([_StandIn(s, S, P) for s in mine], m)
        except (ValueError, AssertionError, RuntimeError):
            with pytest.raises(ValueError, match="refuses"):
                torch_order(name, P, V, m)
            continue
        theirs = {r: [str(sub) for a in acts if a is not None for sub in (a.sub_actions or (a,))]
                  for r, acts in whole.pipeline_order.items()}
        assert {r: [str(a) for a in acts] for r, acts in torch_order(name, P, V, m).items()} == theirs


def test_orders_kept_on_disk_spare_a_later_process_the_import_of_torchs_pipelining(tmp_path):
    """A process that finds its orders kept plans without importing torch.distributed.pipelining (1-6 s, more
    than a short time limit); a kept refusal is refused again."""
    import os
    import subprocess
    import sys

    from workbench.schedules.order_cache import ENV

    env = {**os.environ, ENV: str(tmp_path)}
    script = ("import sys\n"
              "from workbench.model.chain import Chain, Layer\nfrom workbench.model.target import Target\n"
              "from workbench.planners import plan\n"
              "ch = Chain(tuple(Layer(f'l{i}', 1.0, 2.0, 4, 1, 1) for i in range(8)), input_bytes=1)\n"
              "p = plan(ch, Target.of(2, memory_model='paper'), 'zbv', micro_batches=4, time_limit=5)\n"
              "try:\n"
              "    plan(ch, Target.of(2), 'dualpipev', micro_batches=2)\n"
              "except ValueError as e:\n"
              "    print('refused', 'at least as many microbatches' in str(e))\n"
              "print(p.period, 'torch.distributed.pipelining' in sys.modules)\n")
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split()[-1] == "True" and second.stdout.split()[-1] == "False"
    assert first.stdout.split()[-2] == second.stdout.split()[-2]
    assert "refused True" in first.stdout and "refused True" in second.stdout
    assert len(list((tmp_path / "torch-orders").rglob("*.json"))) == 2
