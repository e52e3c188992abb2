"""workbench.model.plan_json: a bad plan file is refused in one line that names the field that is wrong."""

from __future__ import annotations

import json

import pytest

from workbench.front.cli import main
from workbench.model.chain import Chain, Layer
from workbench.model.plan import Plan, make_plan
from workbench.model.target import Target
from workbench.profiles import write_profile


def _plan() -> Plan:
    chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    return make_plan(chain, Target.of(2, memory_model="paper"), 0.006, [0, 0, 1, 1], [0.0, 0.002], [0.008, 0.004],
                     method="hand")


def _full() -> dict:
    """A plan with every field: activations and a full-model set-up with links."""
    d = json.loads(_plan().to_json())
    d["activations"] = ["keep", "recompute", "keep", "keep"]
    d["memory_setup"] = {"memory_model": "full", "optimizer": "adam", "precision": "fp32", "weights": "stash",
                         "zero_grad": "none", "estimated": [], "bandwidth": 12e9, "gpu": "h100-sxm"}
    return d


#: each: what is spoiled, and the start of the message (on the day it was written the first six were checked as
#: valid or blamed another field: a wrong-length assignment as a wrong number of activations; activations as a
#: number a TypeError traceback; a bad set-up named no field of the plan)
BAD = [
    (lambda d: d.update(allocation="weird"), "allocation: 'weird' is not one of contiguous, general"),
    (lambda d: d.update(assignment=[0]), "assignment: 1 entries, but the stages cover 4 layers"),
    (lambda d: d.update(assignment=[]), "assignment: 0 entries, but the stages cover 4 layers"),
    (lambda d: d.update(activations=3), "activations: expected a list, got a number"),
    (lambda d: d.update(activations=["keep"]), "activations: 1 policies for an assignment of 4 layers"),
    (lambda d: d["activations"].__setitem__(1, "fast"),
     "activations[1]: 'fast' is not an activation policy: one of keep, recompute"),
    (lambda d: d["memory_setup"].update(optimizer="abc"), "memory_setup.optimizer: 'abc' is not one of none, sgd"),
    (lambda d: d["memory_setup"].update(memory_model=3), "memory_setup.memory_model: 3 is not one of full, paper"),
    (lambda d: d["memory_setup"].update(zero_grad="sometimes"), "memory_setup.zero_grad: 'sometimes' is not one"),
    (lambda d: d["memory_setup"].update(weights="two"), "memory_setup.weights: 'two' is not one of stash, single"),
    (lambda d: d["memory_setup"].update(bandwidth=-1), "memory_setup.bandwidth: -1 is not a positive bandwidth"),
    (lambda d: d["memory_setup"].update(devices_per_node=0), "memory_setup.devices_per_node: 0 is out of range"),
    (lambda d: d["memory_setup"].update(dp=0), "memory_setup.dp: 0 is out of range 1.."),
    (lambda d: d["memory_setup"].update(zero=4), "memory_setup.zero: 4 is out of range 0..3"),
    (lambda d: d.update(parallel=[2]), "parallel: expected an object with tp, pp, dp, zero, got list"),
    (lambda d: d.update(parallel={"tp": 1, "pp": 1, "dp": 3}), "devices: 2 is neither the layout's 3 GPUs"),
    (lambda d: d["memory_setup"].update(gpu=7), "memory_setup.gpu: expected a GPU's name, got a number"),
    (lambda d: d["memory_setup"].update(estimated="all"), "memory_setup.estimated: expected a list of profile"),
    (lambda d: d.update(memory_setup=[]), "memory_setup: expected a JSON object, got a list"),
    (lambda d: d.update(memory_limit=-1), "memory_limit: -1 is below 0"),
    (lambda d: d.update(lower_bound=-2.0), "lower_bound: -2.0 is below 0"),
    (lambda d: d.update(gap=1.5), "gap: 1.5 is not in 0..1"),
    (lambda d: d["stages"][0].update(layers=[-1, 1]), "stages[0].layers[0]: -1 is out of range 0.."),
    (lambda d: d.update(status="great"), "status: 'great' is not one of optimal, feasible, infeasible, timeout"),
]


@pytest.mark.parametrize("spoil,says", BAD)
def test_a_bad_plan_names_the_field_that_is_wrong(spoil, says):
    d = _full()
    Plan.from_dict(d)                      # the plan as written is fine
    spoil(d)
    with pytest.raises(ValueError) as e:
        Plan.from_dict(d)
    assert str(e.value).startswith(says)


@pytest.mark.parametrize("spoil,says", BAD[:4])
def test_check_refuses_a_bad_plan_file_in_one_line(tmp_path, capsys, spoil, says):
    chain = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    write_profile(chain, tmp_path / "p.csv")
    d = json.loads(_plan().to_json())
    spoil(d)
    (tmp_path / "plan.json").write_text(json.dumps(d))
    assert main(["check", str(tmp_path / "plan.json"), "--profile", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: {tmp_path / 'plan.json'}: " + err[0].split(": ", 2)[2]
    assert says in err[0]


def test_an_infinite_link_is_written_as_null_and_read_back_as_infinite():
    """A platform with an infinite link (the API allows one; the CLI refuses it) writes null, not Infinity, which
    check refused."""
    plan = _plan().with_(setup={"memory_model": "paper", "weight_factor": 1.0, "bandwidth": float("inf")})
    text = plan.to_json()
    assert "Infinity" not in text and json.loads(text)["memory_setup"]["bandwidth"] is None
    assert Plan.from_json(text).setup["bandwidth"] is None
