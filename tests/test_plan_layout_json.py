"""A layout's plan JSON (workbench.model.plan, docs/model.md "Layouts"): every GPU in ``devices`` and ``memory``,
one replica's pipeline inside, and plans without a layout read as before."""

from __future__ import annotations

import json

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.planners import plan


def pipeline() -> Plan:
    ch = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 1e6, 1e5) for i in range(4)), input_bytes=1e5)
    return plan(ch, Target.of(2, weights="single", dp=2, zero=1), "1f1b", micro_batches=4)


def test_round_trip_with_every_rank():
    p = pipeline()
    layout = {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "micro_batch_size": 1, "micro_batches": 4, "schedule": "1f1b",
              "chunks": 1, "sequence_parallel": False}
    with_layout = p.with_(parallel={"parallel": layout, "tokens_per_second": 123.0, "mfu": 0.4})
    data = json.loads(with_layout.to_json())
    assert data["devices"] == 8 and data["tokens_per_second"] == 123.0
    assert data["memory"] == [p.memory[r // 4] for r in range(8)]       # rank order: tp, then dp, then pp
    back = Plan.from_dict(data)
    assert back.devices == 2 and back.memory == p.memory and back.parallel["mfu"] == 0.4
    assert back.setup["dp"] == 2 and back.setup["zero"] == 1
    del data["pipeline_memory"]                                          # the per-rank list alone still reads
    assert Plan.from_dict(data).memory == p.memory


def test_a_layout_plan_counting_its_pipeline_reads_as_it_is():
    """The layout runtime's own plan files name the layout and count the pipeline's ranks in devices."""
    p = pipeline()
    data = json.loads(p.to_json())
    data["parallel"] = {"tp": 1, "pp": 2, "dp": 2, "zero": 1}
    back = Plan.from_dict(data)
    assert back.devices == 2 and back.memory == p.memory


def test_plans_without_a_layout_read_as_before():
    p = pipeline().with_(parallel={})
    data = json.loads(p.to_json())
    assert "parallel" not in data and data["devices"] == 2
    assert Plan.from_dict(data).devices == 2


def test_a_layout_whose_devices_disagree_is_refused():
    data = json.loads(pipeline().with_(parallel={"parallel": {"tp": 1, "pp": 2, "dp": 2, "zero": 1}}).to_json())
    data["devices"] = 6
    with pytest.raises(ValueError, match="devices: 6 is neither the layout's 4 GPUs"):
        Plan.from_dict(data)
    data["devices"], data["parallel"]["zero"] = 4, 7
    with pytest.raises(ValueError, match="zero must be one of"):
        Plan.from_dict(data)
