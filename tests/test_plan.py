"""Plan files: JSON round trip and validation of everything read (workbench.model.plan.Plan.from_dict/from_json)."""

from __future__ import annotations

import json
import math

import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.plan import MAX_DEVICES, Plan, make_plan
from workbench.model.target import Target


def _plan() -> Plan:
    chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    return make_plan(chain, Target.of(2, memory_model="paper"), 0.006, [0, 0, 1, 1], [0.0, 0.002], [0.008, 0.004],
                     method="hand")


def _dict() -> dict:
    return json.loads(_plan().to_json())


def test_round_trip_and_infinite_period_as_null():
    assert Plan.from_dict(_dict()) == _plan()
    d = _dict() | {"period": None, "memory_limit": None}
    p = Plan.from_dict(d)
    assert math.isinf(p.period) and math.isinf(p.memory_limit)


@pytest.mark.parametrize("edit,pattern", [
    (lambda d: d.update(devices=1e9), r"devices: 1000000000 is out of range 1\.\.65536"),
    (lambda d: d.update(devices=0), r"devices: 0 is out of range"),
    (lambda d: d.update(devices=2.5), r"devices: 2\.5 is not a whole number"),
    (lambda d: d.update(devices="2"), r"devices: expected a number, got a string"),
    (lambda d: d.pop("devices"), r"devices: missing"),
    (lambda d: d["stages"][1].update(device=1.5), r"stages\[1\]\.device: 1\.5 is not a whole number"),
    (lambda d: d["stages"][0].update(fwd_start=None), r"stages\[0\]\.fwd_start: expected a number, got null"),
    (lambda d: d["stages"][0].update(layers=[0]), r"stages\[0\]\.layers: expected \[first, last\]"),
    (lambda d: d["stages"].append(3), r"stages\[2\]: a stage is a JSON object, got a number"),
    (lambda d: d.update(assignment=[0, 0, True, 1]), r"assignment\[2\]: expected a number, got a boolean"),
    (lambda d: d.update(stages={}), r"stages: expected a list, got an object"),
    (lambda d: d.update(status="great"), r"status: 'great' is not one of"),
    (lambda d: d.update(micro_batches=0), r"micro_batches: 0 is out of range"),
    (lambda d: d.update(extra=[]), r"extra: expected a JSON object"),
])
def test_from_dict_names_the_bad_field(edit, pattern):
    d = _dict()
    edit(d)
    with pytest.raises(ValueError, match=pattern):
        Plan.from_dict(d)


@pytest.mark.parametrize("value", ["[1, 2]", '"plan"', "3", "null"])
def test_non_object_json_is_refused(tmp_path, value):
    f = tmp_path / "p.json"
    f.write_text(value)
    with pytest.raises(ValueError, match=r"p\.json: a plan is a JSON object, got "):
        Plan.from_json(f)


@pytest.mark.parametrize("field,value", [("period", "NaN"), ("period", "Infinity"), ("lower_bound", "-Infinity")])
def test_non_finite_numbers_are_refused(tmp_path, field, value):
    text = _plan().to_json().replace(f'"{field}": ', f'"{field}": {value}, "_old_{field}": ', 1)
    f = tmp_path / "p.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=rf"p\.json: non-finite number {value}"):
        Plan.from_json(f)


def test_absurd_device_count_is_refused_before_anything_is_allocated(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_dict() | {"devices": 10**9}))   # check() used to build lists of 1e9 entries
    with pytest.raises(ValueError, match="out of range"):
        Plan.from_json(f)
    assert Plan.from_dict(_dict() | {"devices": MAX_DEVICES}).devices == MAX_DEVICES


def test_missing_file_folder_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such plan file"):
        Plan.from_json(tmp_path / "none.json")
    with pytest.raises(FileNotFoundError, match="no such plan file"):
        Plan.from_json(str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match="is a folder"):
        Plan.from_json(tmp_path)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        Plan.from_json(tmp_path / "bad.json")


def _json_table_keys() -> set[str]:
    """The keys docs/model.md's "JSON" section names in the first column of its tables."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "model.md").read_text()
    section = text.split("\n## JSON\n", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {key for cell in first_cells for key in cell.replace("`", "").replace(" ", "").split(",")}


def test_docs_json_tables_name_every_key_a_plan_writes():
    """Every key of the plan JSON, of ``memory_setup`` (both memory models, with the offload link, a GPU and
    nodes) and of ``extra`` has a row in docs/model.md's contract, and no row names a key the code lacks."""
    from workbench.model.plan import memory_setup
    from workbench.model.plan_extra import PlanExtra
    from workbench.planners import plan as plan_with

    chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    platform = Target.of(4, devices_per_node=2, gpu="h100-sxm", host_bandwidth="10GB/s")
    made = plan_with(chain, platform, "dp", activations="offload")
    written = set(made.to_dict()) | {"micro_batches", "chain_order", "notes", "extra"}
    setups = set(made.setup) | set(memory_setup(chain, Target.of(2, memory_model="paper"))) \
        | set(memory_setup(chain, Target.of(2, dp=2, zero=1)))       # a layout's pipeline ranks
    assert {"dp", "zero"} <= setups
    documented = _json_table_keys()
    assert {"host_bandwidth", "gpu", "devices_per_node", "weight_factor"} <= setups   # the cases were reached
    assert written <= documented, written - documented
    assert setups <= documented, setups - documented
    assert set(PlanExtra.__annotations__) <= documented, set(PlanExtra.__annotations__) - documented
    assert documented <= written | setups | set(PlanExtra.__annotations__), "a row names a key no plan writes"
