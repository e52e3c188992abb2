"""workbench.parallel.run.memory: the tracker's peak against allocations whose bytes are known."""

import torch
from torch import nn

from workbench.parallel.run.memory import RankMemory, collective_buffers, tensor_bytes


def test_the_peak_is_the_state_plus_what_the_step_held_at_once():
    layer = nn.Linear(64, 64)                          # (64 x 64 + 64) x 4 bytes
    resident = torch.zeros(100)                        # 400 bytes made before the step (a receive buffer)
    probe = RankMemory(torch.device("cpu"))
    with probe.tracking([layer], None, [resident], fsdp=False):
        a = torch.empty(1000)                          # 4000 bytes ...
        b = torch.empty(500)                           # ... with 2000 more at once
        del a, b
        c = torch.empty(1200)                          # 4800 later: less than the 6000 held together
        del c
    params = (64 * 64 + 64) * 4
    assert probe.peak() == params + 400 + 6000
    parts = probe.breakdown()
    assert parts["Parameter"] == params and parts["Other"] == 400 and parts["Total"] == probe.peak()


def test_storages_count_once_and_the_collectives_are_named():
    t = torch.zeros(10, 10)
    assert tensor_bytes([t, t[:5], t.view(100)]) == 400
    assert collective_buffers({"All Gather": 64, "Reduce Scatter": 0, "Total": 64}, receive_bytes=32,
                              bucket_bytes=0) == {"all_gather": 64, "reduce_scatter": 0, "pipeline_receive": 32}
    assert collective_buffers({"Total": 1}, receive_bytes=0, bucket_bytes=8) == {"ddp_buckets": 8}
