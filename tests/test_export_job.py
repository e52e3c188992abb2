"""What the exporters read from a plan (workbench.parallel.export.job) and the export command's bad input."""

import json
from pathlib import Path

import pytest

from tests.export_plans import layout_plan, llama_names
from workbench.front.cli import main
from workbench.parallel.export.job import job_from_plan

ROOT = Path(__file__).resolve().parents[1]


def test_parts_count_blocks_and_recomputed_blocks_per_stage():
    acts = ["keep"] * 5 + ["recompute"] * 3 + ["offload"] + ["keep"] * 4
    job = job_from_plan(layout_plan([3, 4, 3], pp=3, activations=acts, tp=1, dp=1), seq_len=2048)
    # layers: 0 embedding, 1-10 blocks 0-9, 11 norm, 12 head; stages [0-3], [4-7], [8-12]
    assert [p.blocks for p in job.parts] == [3, 4, 3] and job.blocks == 10
    assert [p.recomputed for p in job.parts] == [0, 3, 1] and job.offloaded_blocks == 1
    assert [(p.embedding, p.head) for p in job.parts] == [(True, False), (False, False), (False, True)]
    assert job.fqns(0) == ["tok_embeddings", "layers.0", "layers.1", "layers.2"]
    assert job.fqns(2) == ["layers.7", "layers.8", "layers.9", "norm", "output"]


def test_the_plans_schedule_and_micro_batches_fill_an_open_layout():
    data = layout_plan([2, 2], pp=2, schedule="gpipe")
    data["parallel"].pop("schedule")
    data["parallel"].pop("micro_batches")
    job = job_from_plan(data, seq_len=128)
    assert job.schedule == "gpipe" and job.layout.micro_batches == 4 and job.layout.global_batch == 4
    data["sequence_length"] = 4096
    assert job_from_plan(data).seq_len == 4096


@pytest.mark.parametrize("change,words", [
    (lambda d: d.pop("parallel"), 'no "parallel" layout'),
    (lambda d: d["extra"].pop("layer_names"), "extra.layer_names missing"),
    (lambda d: d["parallel"].update(chunks=2), "the plan has 2 pipeline stages, its layout pp=2 x chunks=2 = 4"),
    (lambda d: d["parallel"].update(micro_batch_size=None), "no micro_batch_size"),
    (lambda d: d["parallel"].update(schedule="dp"), "periodic"),
    (lambda d: d["parallel"].update(schedule="nosuch"), "nosuch"),
    (lambda d: d["stages"][1]["layers"].__setitem__(0, 4), "do not cover layers"),
    (lambda d: d["extra"].update(layer_names=[f"x{i}" for i in range(7)]), "no decoder blocks"),
])
def test_bad_plans_are_refused_naming_what_is_wrong(change, words):
    data = layout_plan([2, 2], pp=2)
    change(data)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        job_from_plan(data, seq_len=128)


def test_a_periodic_plan_names_the_closest_schedule():
    data = layout_plan([2, 2], pp=2, schedule="pipedream")
    with pytest.raises(ValueError) as e:
        job_from_plan(data, seq_len=128)
    assert "re-plan with --method 1f1b" in str(e.value)
    data["parallel"].update(pp=1)                      # no pipeline: the schedule does not matter
    data["devices"] = 1                                # the plan of that layout counts its one GPU
    data["stages"] = [{"layers": [0, 6], "device": 0, "fwd_start": 0.0, "bwd_start": 0.0}]
    data["assignment"] = [0] * 7
    assert job_from_plan(data, seq_len=128).schedule is None


def _export(capsys, *args):
    """``python -m workbench export ARGS`` in this process: (exit status, stdout, stderr)."""
    try:
        rc = main(["export", *map(str, args)])
    except SystemExit as e:            # argparse's own refusals
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_export_without_a_layout_exits_2_with_one_line(tmp_path, capsys):
    plan = layout_plan([2, 2], pp=2)
    plan.pop("parallel")
    (tmp_path / "p.json").write_text(json.dumps(plan))
    rc, out, err = _export(capsys, tmp_path / "p.json", "--to", "megatron", "--seq-len", "2048")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and 'no "parallel" layout' in err
    rc, out, err = _export(capsys, tmp_path / "missing.json", "--to", "torchtitan", "--seq-len", "2048")
    assert rc == 2 and "no such plan file" in err
    rc, out, err = _export(capsys, tmp_path / "p.json", "--to", "deepspeed")
    assert rc == 2 and "invalid choice" in err


def test_export_of_a_real_plan_writes_both_files(tmp_path, capsys):
    """A plan made by ``plan`` (1F1B over 4 GPUs, every layer recomputed) with a layout added."""
    rc = main(["plan", "--profile", str(ROOT / "data/profiles/fake/llama3-8b-h100-sxm.csv"), "--devices", "4",
               "--gpu", "h100-sxm", "--method", "1f1b", "--micro-batches", "8", "--activations", "recompute",
               "--json", str(tmp_path / "p.json"), "-q"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["extra"]["layer_names"][1:-2] == llama_names(32)[1:-2]       # the profiler's names for the blocks
    data["parallel"] = {"tp": 2, "pp": 4, "dp": 2, "zero": 1, "micro_batch_size": 1, "micro_batches": 8}
    (tmp_path / "p.json").write_text(json.dumps(data))
    rc, _, err = _export(capsys, tmp_path / "p.json", "--to", "megatron", "--seq-len", "8192", "--out",
                         tmp_path / "m.sh")
    assert rc == 0, err
    text = (tmp_path / "m.sh").read_text()
    assert "--tensor-model-parallel-size 2 \\" in text and "--global-batch-size 16 \\" in text
    assert "--recompute-granularity full" in text and "--pipeline-model-parallel-layout" in text
    rc, out, _ = _export(capsys, tmp_path / "p.json", "--to", "torchtitan", "--seq-len", "8192")
    assert rc == 0 and 'mode = "full"' in out and "local_batch_size = 8" in out
