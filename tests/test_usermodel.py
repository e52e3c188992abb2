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


# ---------------------------------------------------------------------------------------------
# failures inside the user's code: one error line with their frame, exit 2
# ---------------------------------------------------------------------------------------------
FAILING = '''import torch
from torch import nn
from torch.nn import functional as F
from helpers import make_net


def raises():
    raise RuntimeError("the config file is missing")


class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(5, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def bad_forward():
    return Bad(), torch.randn(3, 4), torch.randint(0, 3, (3,)), F.cross_entropy


class Dict(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return {"logits": self.b(torch.relu(self.a(x)))}


def bad_loss():
    return Dict(), torch.randn(3, 4), torch.randint(0, 3, (3,)), lambda out, y: F.cross_entropy(out[0], y)


def sibling():
    return make_net(), torch.randn(3, 4), torch.randint(0, 3, (3,)), F.cross_entropy


def bad_sequential():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(16, 3))
    return net, torch.randn(3, 4), torch.randint(0, 3, (3,)), F.cross_entropy


def exits():
    import sys
    sys.exit(3)


def per_row_loss():
    return Dict(), torch.randn(3, 4), torch.randint(0, 3, (3,)), \
        lambda out, y: F.cross_entropy(out["logits"], y, reduction="none")


def per_row_loss_sequential():
    return make_net(), torch.randn(3, 4), torch.randint(0, 3, (3,)), \
        lambda out, y: F.cross_entropy(out, y, reduction="none")
'''
HELPERS = '''import torch


def make_net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
'''


@pytest.fixture()
def user_dir(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "fails.py").write_text(FAILING)
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "syntax.py").write_text("import torch\ndef build(:\n    pass\n")
    (folder / "imports.py").write_text("import torch\nimport no_such_package_anywhere\n\ndef build():\n    pass\n")
    return folder


@pytest.mark.parametrize("spec,where,message", [
    ("fails.py:raises", "fails.py:8 in raises", "RuntimeError: the config file is missing"),
    ("fails.py:bad_forward", "the model's forward on the example inputs failed: {dir}/fails.py:17 in forward",
     "RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    ("fails.py:bad_loss", "the loss on the model's own output (a dict) failed: {dir}/fails.py:34 in <lambda>",
     "KeyError: 0"),
    ("syntax.py:build", "syntax.py:2", "SyntaxError: invalid syntax"),
    ("imports.py:build", "imports.py:2 in <module>", "ModuleNotFoundError: No module named 'no_such_package_anywhere'"),
    # sys.exit(3) in build(): main ended with exit status 3 and no message
    ("fails.py:exits", "fails.py:48 in exits", "the code called sys.exit(3); exits() must return (model, "),
])
@pytest.mark.parametrize("fake", [False, True])
def test_a_failure_in_the_users_code_is_one_line_with_their_frame(user_dir, capsys, spec, where, message, fake):
    from workbench.front.cli import main

    args = ["profile", "--module", f"{user_dir}/{spec}", "--out", str(user_dir / "p.csv"), "--repeats", "1"]
    code = main(args + (["--fake", "--gpu", "h100-sxm"] if fake else []))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"error: --module {user_dir}/{spec}: ") and where.format(dir=user_dir) in err
    if not (fake and "bad_forward" in spec):        # fake tensors word a shape mismatch their own way
        assert message in err


@pytest.mark.parametrize("fake", [False, True])
def test_a_bare_sequential_failing_in_torchs_modules_names_the_layer(user_dir, capsys, fake):
    from workbench.front.cli import main

    spec = f"{user_dir}/fails.py:bad_sequential"
    args = ["profile", "--module", spec, "--out", str(user_dir / "p.csv"), "--repeats", "1"]
    assert main(args + (["--fake", "--gpu", "h100-sxm"] if fake else [])) == 2
    err = capsys.readouterr().err
    # the time estimate runs the layers first; under --fake the profile's own first run does (its progress bar,
    # stopped at the layer, is the line before; the last layer's forward ends in the loss there)
    last = err.rstrip("\n").split("\n")[-1]
    assert "Traceback" not in err and err.count("error:") == 1 and err.endswith("\n"), err
    assert last.startswith(f"error: --module {spec}: layer 2 (Linear)'s forward on the previous layer's output")
    assert "torch/nn/modules/linear.py:" in last and " in forward: RuntimeError: " in last, last
    assert ("a and b must have same reduction dim" if fake else "mat1 and mat2 shapes cannot be multiplied") in last
    assert fake or err.count("\n") == 1


@pytest.mark.parametrize("spec", ["per_row_loss", "per_row_loss_sequential"])
@pytest.mark.parametrize("fake", [False, True])
def test_a_loss_that_is_no_scalar_is_one_line(user_dir, capsys, spec, fake):
    # main ended in torch's "grad can be implicitly created only for scalar outputs", with and without --fake
    from workbench.front.cli import main

    args = ["profile", "--module", f"{user_dir}/fails.py:{spec}", "--out", str(user_dir / "p.csv"), "--repeats", "1"]
    assert main(args + (["--fake", "--gpu", "h100-sxm"] if fake else [])) == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").split("\n")[-1]
    assert "Traceback" not in err and err.count("error:") == 1
    assert last.startswith("error: the loss returned a float32 tensor of shape (3,)") and "not one value" in last
    assert "(.mean() or .sum())" in last and not (user_dir / "p.csv").exists()


def test_run_says_it_too(user_dir, tmp_path, capsys):
    from workbench.front.cli import main

    plan = tmp_path / "plan.json"
    plan.write_text('{"period": 1.0, "devices": 1, "assignment": [0, 0, 0], "stages": [{"layers": [0, 2], '
                    '"device": 0, "fwd_start": 0, "bwd_start": 0.5, "in_flight": 1}]}')
    assert main(["run", str(plan), "--module", f"{user_dir}/fails.py:raises", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "fails.py:8 in raises: RuntimeError: the config file is missing" in err and "Traceback" not in err


def test_sibling_imports_and_the_module_recorded_relative_to_the_profile(user_dir, tmp_path, monkeypatch, capsys):
    from workbench.front.cli import main
    from workbench.profiles.csvio import read_profile

    out = tmp_path / "profiles"
    out.mkdir()
    monkeypatch.chdir(user_dir)             # as a user would: beside their model, a relative spec
    assert main(["profile", "--module", "fails.py:sibling", "--out", str(out / "p.csv"), "--repeats", "1"]) == 0
    assert read_profile(out / "p.csv").meta["module"] == "../models/fails.py:sibling"
    monkeypatch.chdir(tmp_path.parent)      # elsewhere: run finds the model from the profile's folder
    assert main(["plan", "--profile", str(out / "p.csv"), "--devices", "2", "--json", str(out / "plan.json")]) == 0
    assert main(["run", str(out / "plan.json"), "--profile", str(out / "p.csv"), "--steps", "2",
                 "--out", str(tmp_path / "run")]) == 0
    assert "fails:sibling" in capsys.readouterr().out
