"""The PipeDream engine's receive plan and tags, against the senders' programs walked independently."""

from __future__ import annotations

import pytest
import torch

from instances import runtime_plans
from workbench.runtime.messages import SendWaiter, message_tag, plan_receives
from workbench.schedules.ops import Op
from workbench.schedules.program import programs_for


def _sent_to(programs, stage_dev, dst):
    """Per sender, the F/B messages it sends to ``dst``, in its program's order (no ties)."""
    out = {}
    for src, prog in enumerate(programs):
        for o in prog:
            if o.kind == "F" and o.stage + 1 < len(stage_dev) and stage_dev[o.stage + 1] == dst != src:
                out.setdefault(src, []).append(("F", o.stage + 1, o.batch))
            if o.kind == "B" and o.stage > 0 and stage_dev[o.stage - 1] == dst != src:
                out.setdefault(src, []).append(("B", o.stage - 1, o.batch))
    return out


@pytest.mark.parametrize("k", range(3))
def test_receives_follow_each_senders_order(k):
    plan = list(runtime_plans())[k]
    steps = 5
    programs = programs_for(plan, steps)
    stage_dev = [st.device for st in plan.stages]
    last = [st.last for st in plan.stages]
    shapes = {l: ((l + 1, 2), torch.float32) for l in range(len(plan.assignment))}
    tags = set()
    for rank in range(plan.devices):
        r = plan_receives(programs, rank, stage_dev, last, shapes, {}, {}, 0)
        expected = _sent_to(programs, stage_dev, rank)
        assert {src: list(q) for src, q in r.queues.items()} == expected
        assert sorted(r.incoming) == sorted(key for keys in expected.values() for key in keys)
        for key, (src, shape, dtype) in r.incoming.items():
            # an F message carries the previous stage's output, a B message this stage's output gradient
            layer = last[key[1] - 1] if key[0] == "F" else last[key[1]]
            assert src != rank and shape == (layer + 1, 2) and dtype == torch.float32
        # each receive is listed at the op that consumes it, in program order
        prog = programs[rank]
        assert [j for j, _ in r.recv_at] == sorted(j for j, _ in r.recv_at)
        assert all((prog[j].kind, prog[j].stage, prog[j].batch) == key for j, key in r.recv_at)
        assert len(r.recv_at) == len(r.incoming)
        tags |= {message_tag(key, steps, len(stage_dev), 0) for key in r.incoming}
    n_messages = sum(len(v) for d in range(plan.devices) for v in _sent_to(programs, stage_dev, d).values())
    assert len(tags) == n_messages                      # every message its own tag


def test_tied_gradient_precedes_the_input_gradient_of_the_same_backward():
    # stages 0..3 on ranks 0, 1, 0, 1; stage 3 shares a parameter owned by stage 0
    stage_dev = [0, 1, 0, 1]
    programs = [[], []]
    for i in range(2):
        programs[0] += [Op(0, "F", i), Op(2, "F", i), Op(2, "B", i), Op(0, "B", i)]
        programs[1] += [Op(1, "F", i), Op(3, "F", i), Op(3, "B", i), Op(1, "B", i)]
    shapes = {l: ((4,), torch.float32) for l in range(4)}
    owners = {0: [(3, 0, "w")]}
    r = plan_receives(programs, 0, stage_dev, [0, 1, 2, 3], shapes, owners, {(0, "w"): ((7, 3), torch.bfloat16)}, 1)
    # rank 1 sends, per mini-batch: F(2) in F1, then in B3 the tied gradient before B(2), then B(0) in B1
    assert list(r.queues[1]) == [("F", 2, 0), ("T", 0, 0, 0), ("B", 2, 0), ("B", 0, 0),
                                 ("F", 2, 1), ("T", 0, 1, 0), ("B", 2, 1), ("B", 0, 1)]
    assert r.incoming[("T", 0, 1, 0)] == (1, (7, 3), torch.bfloat16)
    # the owner needs the tied gradient at its own backward of stage 0, after that backward's input gradient
    assert [key for j, key in r.recv_at if j == 3] == [("B", 0, 0), ("T", 0, 0, 0)]
    # tied tags lie above every F/B tag of the run
    fb = [message_tag(key, 2, 4, 1) for key in r.incoming if key[0] != "T"]
    tied = [message_tag(key, 2, 4, 1) for key in r.incoming if key[0] == "T"]
    assert min(tied) >= 2 * 2 * 4 > max(fb) and len(set(tied)) == len(tied)


def test_send_waiter_reports_a_failed_send_at_drain():
    class Failing:
        def wait(self):
            raise RuntimeError("connection reset")

    w = SendWaiter()
    w.add(Failing(), torch.zeros(1))
    with pytest.raises(RuntimeError, match="connection reset"):
        w.drain()
