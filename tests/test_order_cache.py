"""workbench.schedules.order_cache: torch's orders kept on disk, read back only when they are this torch's."""

from __future__ import annotations

import json

from workbench.schedules import order_cache as oc
from workbench.schedules.ops import Op


def test_an_order_and_a_refusal_round_trip_and_another_torchs_file_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv(oc.ENV, str(tmp_path))
    order = {0: (Op(0, "F", 0, 0.0), Op(1, "F", 0, 1.0), Op(1, "B", 0, 2.0)), 1: ()}
    oc.store_order("ScheduleX", 2, 2, 1, order)
    oc.store_order("ScheduleX", 2, 2, 3, "torch's ScheduleX refuses 3 micro-batches")
    assert oc.load_order("ScheduleX", 2, 2, 1) == order
    assert oc.load_order("ScheduleX", 2, 2, 3) == "torch's ScheduleX refuses 3 micro-batches"
    path = next(tmp_path.glob("torch-orders/ScheduleX-*-m1.json"))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "torch": "0.0"}))
    assert oc.load_order("ScheduleX", 2, 2, 1) is None
    path.write_text("{not json")
    assert oc.load_order("ScheduleX", 2, 2, 1) is None


def test_no_cache_when_the_variable_is_empty_and_an_unwritable_folder_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv(oc.ENV, "")
    assert oc.cache_dir() is None
    oc.store_order("ScheduleX", 2, 2, 1, {0: ()})
    assert oc.load_order("ScheduleX", 2, 2, 1) is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(oc.ENV, str(blocker))          # torch-orders/ cannot be made under a file
    oc.store_order("ScheduleX", 2, 2, 1, {0: ()})
    assert oc.load_order("ScheduleX", 2, 2, 1) is None
