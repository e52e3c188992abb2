"""Tests for workbench.front.profiling: ``profile`` and ``profile-info`` from parsed command lines."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from workbench.front.cli import build_parser
from workbench.front.profiling import (
    _parse_value,
    check_device,
    gpu_table,
    profile_command,
    profile_info_command,
    profile_info_text,
)
from workbench.model.accelerators import ACCELERATORS
from workbench.profiles import load_profile


def parse(*argv: str):
    return build_parser().parse_args(["profile", *argv])


def test_profile_writes_a_csv_with_the_models_own_sizes(tmp_path, capsys):
    out = tmp_path / "mlp.csv"
    assert profile_command(parse("--model", "mlp", "--out", str(out), "--repeats", "1", "--warmup", "0",
                                 "--batch-size", "4")) == 0
    chain = load_profile(out)
    assert [l.name for l in chain.layers] == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    # sizes 32-64-64-10 in float32: weights and biases, and each layer's output for a batch of 4
    assert [l.weight_bytes for l in chain.layers] == [(32 * 64 + 64) * 4, 0, (64 * 64 + 64) * 4, 0,
                                                      (64 * 10 + 10) * 4]
    assert [l.activation_bytes for l in chain.layers] == [4 * 64 * 4] * 4 + [4 * 10 * 4]
    assert f"wrote {out}" in capsys.readouterr().out


def test_fake_profile_for_a_gpu_estimates_its_times(tmp_path, capsys):
    out = tmp_path / "fake.csv"
    assert profile_command(parse("--model", "mlp", "--out", str(out), "--fake", "--gpu", "h100-sxm")) == 0
    chain = load_profile(out)
    assert chain.meta["times"] == "estimated" and chain.meta["gpu"] == "h100-sxm"
    assert chain.layers[0].weight_bytes == (32 * 64 + 64) * 4
    assert "times: " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    ((), "^profile: give --model NAME or --module FILE.py:FUNC"),
    (("--model", "mlp"), "^profile: --out FILE is required"),
    (("--model", "mlp", "--out", "x.csv", "--gpu", "h100-sxm"), "^--gpu goes with --fake"),
    (("--model", "mlp", "--out", "x.csv", "--fake"), "^--fake needs --gpu NAME, .*known: a100-40gb"),
    (("--model", "mlp", "--out", "x.csv", "--fake", "--gpu", "h100"), "^unknown GPU 'h100'"),
    (("--model", "mlp", "--out", "x.csv", "--fake", "--gpu", "h100-sxm", "--device", "cuda"),
     "^--device cuda does not go with --fake"),
    (("--model", "mlp", "--out", "x.csv", "--split-at", "fc2"), "^--split-at goes with --module"),
    (("--model", "mlp", "--out", "x.csv", "--clock", "cpu", "--threads", "2"), "use --threads 1, not 2$"),
    (("--model", "mlp", "--out", "x.csv", "--device", "tpu9"), "^--device tpu9: not a device to profile on"),
    (("--model", "mlp", "--out", "x.csv", "--tp", "2", "--fake", "--gpu", "h100-sxm"), "^--tp shards a Llama"),
    (("--module", "m.py:f", "--out", "x.csv", "--tp", "2"), "^--tp 2: a tensor-parallel profile is made under fake"),
    (("--module", "m.py:f", "--out", "x.csv", "--fake", "--gpu", "h100-sxm", "--sequence-parallel"),
     "^--sequence-parallel and --loss-parallel need --tp 2 or more$"),
    (("--model", "mlp", "--out", "x.csv", "--set", "sizes"), "^--set expects key=value, got 'sizes'$"),
    (("--model", "mlp", "--out", "x.csv", "--kernels", "fused"), "^--kernels fused goes with --fake"),
])
def test_profile_refuses_before_profiling(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message) as e:
        profile_command(parse(*argv))
    assert "\n" not in str(e.value) and not (tmp_path / "x.csv").exists()


def test_check_device():
    check_device("cpu")
    for bad in ("tpu9", "meta", "not a device"):
        with pytest.raises(ValueError, match=f"^--device {bad}: not a device to profile on; give cpu, cuda or cuda:N$"):
            check_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="^--device cuda:1: .*--fake --gpu NAME$"):
            check_device("cuda:1")


def test_list_gpus_prints_one_line_per_gpu(capsys):
    assert profile_command(parse("--list-gpus")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == gpu_table().splitlines() and len(lines) == 1 + len(ACCELERATORS)
    for line, acc in zip(lines[1:], ACCELERATORS.values()):
        name, memory = line.split()[:2]
        assert name == acc.name and memory == f"{acc.memory / 1e9:.0f}GB"


def test_set_values_are_python_literals_where_they_read_as_one():
    assert _parse_value("3") == 3 and _parse_value("0.5") == 0.5
    assert _parse_value("(32, 10)") == (32, 10) and _parse_value("True") is True
    assert _parse_value("gelu") == "gelu" and _parse_value("a b") == "a b"


@pytest.mark.parametrize("name", ["resnet50", "pipedream/alexnet"])
def test_profile_info_summarises_the_profile(name, capsys):
    chain = load_profile(name)
    text = profile_info_text(name)
    acts = [l.activation_bytes for l in chain.layers]
    lines = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line and not line.startswith(" "))
    assert lines["layers"] == str(len(chain))
    assert lines["parameters"].endswith(f"({sum(l.weight_bytes for l in chain.layers):.0f} bytes)")
    assert lines["largest activation"].endswith(f"({chain.layers[int(np.argmax(acts))].name})")
    assert ("linearisation:" in text) == (chain.graph is not None) == name.startswith("pipedream/")
    assert profile_info_command(argparse.Namespace(file=name, no_zero_input=False)) == 0
    assert capsys.readouterr().out.strip() == text


def test_profile_info_of_an_unknown_name():
    with pytest.raises(ValueError, match="^nosuch: no such profile file or name; known names: .*resnet50"):
        profile_info_text("nosuch")
