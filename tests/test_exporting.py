"""Tests for workbench.front.exporting: ``export`` of a layout plan to torchtitan's TOML or Megatron-LM's flags."""

from __future__ import annotations

import json
import tomllib

import pytest

from tests.export_plans import layout_plan
from workbench.front.cli import build_parser
from workbench.front.exporting import export_command, export_text


@pytest.fixture()
def plan_file(tmp_path):
    """TP 2 x PP 2 x DP 2: two stages of two blocks each, 1F1B, micro-batch 1, 4 micro-batches."""
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout_plan([2, 2], pp=2, tp=2, dp=2)))
    return path


def test_torchtitan_toml_holds_the_layout(plan_file):
    text = export_text(str(plan_file), "torchtitan", 1024)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[0].endswith(f"python -m workbench export {plan_file} --to torchtitan")
    assert header[1] == "# world size 8 = TP 2 x PP 2 x DP 2"
    toml = tomllib.loads(text)                       # the header is comments: the rest is valid TOML
    par = toml["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["data_parallel_replicate_degree"]) \
        == (2, 2, 2)
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["pipeline_parallel_microbatch_size"] == 1
    assert par["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0", "layers.1"],
                                                 ["layers.2", "layers.3", "norm", "output"]]
    # 4 micro-batches of 1 per replica, 2 replicas
    assert (toml["training"]["seq_len"], toml["training"]["local_batch_size"],
            toml["training"]["global_batch_size"]) == (1024, 4, 8)


def test_megatron_flags(plan_file):
    text = export_text(str(plan_file), "megatron", 512)
    flags = [line.rstrip(" \\") for line in text.splitlines() if line.startswith("--")]
    assert "--tensor-model-parallel-size 2" in flags and "--pipeline-model-parallel-size 2" in flags
    assert "--num-layers 4" in flags and "--seq-length 512" in flags
    assert "--micro-batch-size 1" in flags and "--global-batch-size 8" in flags
    assert text.splitlines()[1] == "# world size 8 = TP 2 x PP 2 x DP 2"


def test_export_command_writes_the_file_or_standard_output(plan_file, tmp_path, capsys):
    out = tmp_path / "job.toml"
    args = build_parser().parse_args(["export", str(plan_file), "--to", "torchtitan", "--seq-len", "1024",
                                      "--out", str(out)])
    assert export_command(args) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == f"wrote {out}"
    assert out.read_text() == export_text(str(plan_file), "torchtitan", 1024)
    args = build_parser().parse_args(["export", str(plan_file), "--to", "megatron", "--seq-len", "1024"])
    assert export_command(args) == 0
    assert capsys.readouterr().out == export_text(str(plan_file), "megatron", 1024)


def test_a_plan_without_layout_is_refused_naming_the_file(tmp_path):
    data = layout_plan([2, 2], pp=2)
    data.pop("parallel")
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match='no "parallel" layout') as e:
        export_text(str(path), "torchtitan", 128)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
