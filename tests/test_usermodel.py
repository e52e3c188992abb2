"""``--module FILE.py:FUNC`` (profiles/usermodel.py): loading, seeding, and the messages for bad specs."""

from __future__ import annotations

import pytest
import torch

from workbench.profiles.usermodel import load_user_model, parse_spec

GOOD = """import torch
def build():
    return torch.nn.Linear(4, 2), torch.randn(3, 4), torch.zeros(3, dtype=torch.long), torch.nn.functional.cross_entropy
def three():
    return 1, 2, 3
def not_a_model():
    return "m", 1, 2, len
"""


@pytest.fixture()
def src(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(GOOD)
    return path


def test_every_call_builds_the_same_weights_and_batch(src):
    a, b = load_user_model(f"{src}:build"), load_user_model(f"{src}:build")
    assert torch.equal(a.model.weight, b.model.weight) and torch.equal(a.inputs, b.inputs)
    assert a.model.training and a.name == "net:build"
    assert not torch.equal(load_user_model(f"{src}:build", seed=1).model.weight, a.model.weight)


@pytest.mark.parametrize("spec,message", [
    ("net.py", "expected FILE.py:FUNC"),
    ("{src}:", "expected FILE.py:FUNC"),
    ("{src}:missing", "has no function 'missing'"),
    ("{src}:three", r"must return \(model, example_inputs, example_targets, loss_fn\), got tuple of 3"),
    ("{src}:not_a_model", "is a str, not a torch.nn.Module"),
    ("{dir}/nope.py:build", "no such file"),
])
def test_bad_specs_say_what_is_wrong(src, spec, message):
    with pytest.raises(ValueError, match=message):
        load_user_model(spec.format(src=src, dir=src.parent))


def test_parse_spec_keeps_colons_in_paths():
    assert parse_spec("C:/models/net.py:build") == ("C:/models/net.py", "build")
