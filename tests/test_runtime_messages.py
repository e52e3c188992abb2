"""The PipeDream engine's receive plan and tags, against the senders' programs walked independently."""

from __future__ import annotations

import pytest
import torch

from instances import runtime_plans
from workbench.runtime.messages import SendWaiter, message_tag, plan_receives, post_schedule
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


def test_tied_gradients_are_received_from_the_owners_forward_on_a_channel_of_their_own():
    """docs/model.md, "Tied parameters": the owner posts the receive of mini-batch i's tied gradient when its
    forward of i starts (one buffer per mini-batch in flight), so the sharer's send completes at once; tied
    gradients are queued apart from F and B messages (NCCL matches each process group in order)."""
    # stages 0..3 on ranks 0, 1, 0, 1; stage 3 shares a parameter owned by stage 0
    stage_dev = [0, 1, 0, 1]
    programs = [[], []]
    for i in range(2):
        programs[0] += [Op(0, "F", i), Op(2, "F", i), Op(2, "B", i), Op(0, "B", i)]
        programs[1] += [Op(1, "F", i), Op(3, "F", i), Op(3, "B", i), Op(1, "B", i)]
    shapes = {l: ((4,), torch.float32) for l in range(4)}
    owners = {0: [(3, 0, "w")]}
    r = plan_receives(programs, 0, stage_dev, [0, 1, 2, 3], shapes, owners, {(0, "w"): ((7, 3), torch.bfloat16)}, 1)
    assert list(r.queues[1]) == [("F", 2, 0), ("B", 2, 0), ("B", 0, 0), ("F", 2, 1), ("B", 2, 1), ("B", 0, 1)]
    assert list(r.queues[("T", 1)]) == [("T", 0, 0, 0), ("T", 0, 1, 0)]
    assert r.incoming[("T", 0, 1, 0)] == (1, (7, 3), torch.bfloat16)
    # posted at stage 0's forward of the same mini-batch (ops 0 and 4), not listed among the F/B receives
    assert r.tied_at == [(0, ("T", 0, 0, 0)), (4, ("T", 0, 1, 0))]
    assert all(key[0] != "T" for _, key in r.recv_at)
    schedule = post_schedule(r, len(programs[0]))
    assert [key for key in schedule[4] if key[0] == "T"] == [("T", 0, 1, 0)]
    assert sum(key[0] == "T" for keys in schedule for key in keys) == 2
    # tied tags lie above every F/B tag of the run
    fb = [message_tag(key, 2, 4, 1) for key in r.incoming if key[0] != "T"]
    tied = [message_tag(key, 2, 4, 1) for key in r.incoming if key[0] == "T"]
    assert min(tied) >= 2 * 2 * 4 > max(fb) and len(set(tied)) == len(tied)


@pytest.mark.parametrize("k", range(3))
def test_one_receive_is_posted_ahead_per_link(k):
    """docs/model.md, "Memory" (``buf_in``, ``buf_out``): before each op a rank has posted what the op consumes
    and, on each link (a stage's F receives, its B receives), exactly the next one; replayed here op by op."""
    plan = list(runtime_plans())[k]
    programs = programs_for(plan, 5)
    stage_dev = [st.device for st in plan.stages]
    shapes = {l: ((1,), torch.float32) for l in range(len(plan.assignment))}
    for rank in range(plan.devices):
        r = plan_receives(programs, rank, stage_dev, [st.last for st in plan.stages], shapes, {}, {}, 0)
        schedule = post_schedule(r, len(programs[rank]))
        posted, used = set(), set()
        for j, op in enumerate(programs[rank]):
            posted |= set(schedule[j])
            key = (op.kind, op.stage, op.batch)
            assert key not in r.incoming or key in posted          # what the op consumes is there
            used.add(key)
            waiting = posted - used
            links = {w[:2] for w in waiting}
            assert len(waiting) == len(links)                     # one ahead per link still in use ...
            assert links == {key[:2] for at, key in r.recv_at if at > j}
            for link in links:                                    # ... and it is that link's next receive
                later = [key for at, key in r.recv_at if key[:2] == link and at > j]
                assert later and min(waiting & set(later)) == later[0]


def test_send_waiter_reports_a_failed_send_at_drain():
    class Failing:
        def wait(self):
            raise RuntimeError("connection reset")

    w = SendWaiter()
    w.add(Failing(), torch.zeros(1))
    with pytest.raises(RuntimeError, match="connection reset"):
        w.drain()
