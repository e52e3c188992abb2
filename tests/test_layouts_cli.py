"""``plan --parallel`` (workbench.front.layouts) as users run it: a search's plan file, a frontier entry evaluated
again with ``--parallel``, ``check`` and ``simulate`` of the file, and bad input refused in one line (exit 2)."""

from __future__ import annotations

import json
import textwrap

import pytest

from workbench.front.cli import main
from workbench.model.plan import Plan

BUILDER = '''
import torch
from torch.nn import functional as F


def build(batch_size=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, use_cache=False)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 256, (batch_size, 32))
    return model, ids, ids.roll(-1, 1), lambda out, y: F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
'''


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A small Llama's module, its fake profile (tp 1, batch 2), and a search's plan file for 4 GPUs."""
    tmp = tmp_path_factory.mktemp("layouts")
    module = tmp / "net.py"
    module.write_text(textwrap.dedent(BUILDER))
    profile = tmp / "net.csv"
    assert main(["profile", "--module", f"{module}:build", "--fake", "--gpu", "h100-sxm", "--out", str(profile)]) == 0
    out = tmp / "auto.json"
    # sp and lp pinned off: 12 profiles, not 36 (the search of both is tested on 2 GPUs below)
    argv = ["plan", "--module", f"{module}:build", "--fake", "--gpu", "h100-sxm", "--devices", "4",
            "--global-batch", "16", "--parallel", "auto,sp=0,lp=0", "--optimizer", "adamw", "--profile-cache",
            str(tmp / "cache"), "--json", str(out), "-q"]
    assert main(argv) == 0
    return {"module": module, "profile": profile, "auto": out, "tmp": tmp, "argv": argv}


def test_search_writes_the_layout_and_its_frontier(made):
    data = json.loads(made["auto"].read_text())
    par = data["parallel"]
    assert par["tp"] * par["pp"] * par["dp"] == 4 == data["devices"] == len(data["memory"])
    assert data["tokens_per_second"] == pytest.approx(16 * 32 / data["step_seconds"])
    assert 0 < data["mfu"] < 1 and data["frontier"]
    fitting = [f for f in data["frontier"] if f["status"] == "fits"]
    assert data["tokens_per_second"] >= max(f["tokens_per_second"] for f in fitting) * (1 - 1e-9)
    plan = Plan.from_json(made["auto"])                 # read back as one replica's pipeline
    assert plan.devices == par["pp"] and plan.parallel["parallel"] == par
    assert plan.memory == tuple(data["pipeline_memory"])


def test_a_frontier_entry_evaluates_the_same_with_parallel(made, capsys):
    data = json.loads(made["auto"].read_text())
    entry = next(f for f in data["frontier"] if f["status"] == "fits" and f["parallel"]["pp"] > 1)
    p = entry["parallel"]
    text = (f"tp={p['tp']},pp={p['pp']},dp={p['dp']},zero={p['zero']},mbs={p['micro_batch_size']},"
            f"schedule={p['schedule']},chunks={p['chunks']},sp={int(p['sequence_parallel'])},"
            f"lp={int(p['loss_parallel'])}")
    out = made["tmp"] / "one.json"
    argv = [a for a in made["argv"] if a != "auto,sp=0,lp=0"]
    argv[argv.index("--parallel") + 1:argv.index("--parallel") + 1] = [text]
    argv[argv.index("--json") + 1] = str(out)
    assert main(argv + ["--activations", entry["activations"]]) == 0
    one = json.loads(out.read_text())
    assert one["tokens_per_second"] == pytest.approx(entry["tokens_per_second"], rel=1e-12)
    assert max(one["memory"]) == pytest.approx(entry["peak_memory"], rel=1e-12)


def test_check_and_simulate_read_the_plan(made, capsys):
    out = made["tmp"] / "from_profile.json"
    assert main(["plan", "--profile", str(made["profile"]), "--devices", "4", "--global-batch", "16",
                 "--parallel", "pp=2,dp=2,zero=1,schedule=1f1b", "--gpu", "h100-sxm", "--json", str(out), "-q"]) == 0
    assert main(["check", str(out), "--profile", str(made["profile"])]) == 0
    assert main(["check", str(out), "--profile", str(made["profile"]), "--devices", "4"]) == 0
    assert main(["simulate", str(out), "--profile", str(made["profile"]), "--batches", "8",
                 "--out", str(made["tmp"] / "t.csv")]) == 0


@pytest.mark.parametrize("extra,message", [
    (["--parallel", "tp=1,pp=2,dp=1"], "uses 2 GPUs, not the 4 of --devices"),
    (["--parallel", "tp=4,pp=1,dp=1", "--devices-per-node", "2"], "tp=4 must divide the 2 GPUs of a node"),
    (["--parallel", "pp=1,dp=4,mbs=3"], "global batch 16 is not a multiple of dp=4 x micro-batch size 3"),
    (["--parallel", "pp=2,dp=2,zero=2", "--method", "dp"], "zero=2 with 'dp': a periodic plan stashes"),
    (["--parallel", "pp=4,dp=1,zero=1"], "zero=1 shards over the data-parallel group, but dp=1"),
    (["--parallel", "auto", "--memory", "1MB"],
     "no layout of 4 GPUs fits in 976.56 KiB per GPU: the least any needs on its fullest rank is"),
    (["--parallel", "pp=1,dp=4", "--memory", "1MB"], "does not fit: its fullest ranks (pipeline rank 0) need"),
])
def test_bad_input_is_one_line_exit_2(made, capsys, extra, message):
    argv = ["plan", "--profile", str(made["profile"]), "--devices", "4", "--global-batch", "16", "--gpu",
            "h100-sxm"] + extra
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_missing_pieces_are_named(made, capsys):
    assert main(["plan", "--module", f"{made['module']}:build", "--devices", "4", "--parallel", "auto"]) == 2
    assert "--parallel needs --global-batch G" in capsys.readouterr().err
    assert main(["plan", "--module", f"{made['module']}:build", "--devices", "4", "--global-batch", "8"]) == 2
    assert "give --parallel auto" in capsys.readouterr().err
    assert main(["plan", "--profile", str(made["profile"]), "--devices", "4", "--global-batch", "8",
                 "--parallel", "tp=2,pp=1,dp=2"]) == 2
    assert "needs --module FILE.py:FUNC" in capsys.readouterr().err


def test_sequence_parallel_and_split_loss_are_planned_on_their_profiles(made):
    from workbench.front.cli import build_parser
    from workbench.front.layouts import job_from_args
    from workbench.model.layout import Layout
    from workbench.parallel.evaluate import evaluate
    from workbench.parallel.tensor.profile import tensor_parallel_profile

    def planned(switches: str) -> dict:
        out = made["tmp"] / f"tp2{switches.replace(',', '_').replace('=', '')}.json"
        argv = made["argv"][:made["argv"].index("--parallel")] + [
            "--parallel", f"tp=2,pp=1,dp=2,mbs=2{switches}", "--profile-cache", str(made["tmp"] / "cache"),
            "--json", str(out), "-q"]
        assert main(argv) == 0
        return json.loads(out.read_text())

    plain, sp, both = planned(""), planned(",sp=1"), planned(",sp=1,lp=1")
    assert (plain["parallel"]["sequence_parallel"], plain["parallel"]["loss_parallel"]) == (False, False)
    assert (sp["parallel"]["sequence_parallel"], sp["parallel"]["loss_parallel"]) == (True, False)
    assert (both["parallel"]["sequence_parallel"], both["parallel"]["loss_parallel"]) == (True, True)
    assert max(both["memory"]) < max(sp["memory"]) < max(plain["memory"])
    # the plan's memory is the layout evaluated on the sequence-parallel profile made directly, uncached
    direct = tensor_parallel_profile(f"{made['module']}:build", "h100-sxm", 2, sequence_parallel=True,
                                     micro_batch_size=2, cache=False)
    args = build_parser().parse_args(made["argv"])
    e = evaluate(job_from_args(args, direct), Layout.parse("tp=2,pp=1,dp=2,mbs=2,sp=1"),
                 lambda tp, mbs, **kw: direct, "keep")
    assert max(sp["memory"]) == pytest.approx(e.peak)
    assert Plan.from_json(json.dumps(sp)).parallel["parallel"]["sequence_parallel"] is True


def test_check_and_simulate_a_tensor_parallel_plan_from_its_module(made, capsys, monkeypatch):
    """A tp=2 plan made from --module is checked and simulated on its rank's chain (re-made from the module the
    plan records, as plan made it) without --profile; a --profile of tp=1 is refused in one line, not read as
    the rank's chain (which gave a period and memory that were not the plan's)."""
    monkeypatch.chdir(made["tmp"])                 # the rank's chains are cached under build/profiles here
    out = made["tmp"] / "tp2.json"
    argv = list(made["argv"])
    argv[argv.index("auto,sp=0,lp=0")] = "tp=2,pp=2,dp=1"
    argv[argv.index("--json") + 1] = str(out)
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    assert f"{out}: valid (2 stages" in capsys.readouterr().out
    assert main(["simulate", str(out), "--batches", "8", "--out", str(made["tmp"] / "tp2.csv")]) == 0
    period = Plan.from_json(out).period
    assert f"(plan: {period * 1e3:.2f} ms)" in capsys.readouterr().out
    assert main(["check", str(out), "--profile", str(made["profile"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is the chain of a rank of tp=1, but the plan's layout has tp=2" in err[0], err


def test_a_plan_from_a_profile_names_its_model_from_the_working_folder(made, tmp_path, monkeypatch):
    out = made["tmp"] / "from_profile_module.json"
    assert main(["plan", "--profile", str(made["profile"]), "--devices", "4", "--global-batch", "16",
                 "--parallel", "pp=2,dp=2,zero=1,schedule=1f1b", "--gpu", "h100-sxm", "--json", str(out), "-q"]) == 0
    module = json.loads(out.read_text())["extra"]["module"]
    assert module.split(":")[0].endswith("net.py") and (made["tmp"] / "net.py").samefile(module.split(":")[0])
    monkeypatch.chdir(tmp_path)                     # elsewhere: check finds the model without --profile
    assert main(["check", str(out)]) == 0


def test_the_table_shows_each_layout_whole(made, capsys):
    """The frontier's layouts are printed whole (a long one, interleaved with its micro-batching, was cut)."""
    capsys.readouterr()
    argv = list(made["argv"])
    argv[argv.index("--json") + 1] = str(made["tmp"] / "again.json")
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads((made["tmp"] / "again.json").read_text())
    shown = [f for f in data["frontier"] if f["status"] in ("fits", "over")]
    rows = sorted(shown, key=lambda f: (not f["fits"], f["step_seconds"]))[:15]
    missing = [_describe(f["parallel"]) for f in rows if _describe(f["parallel"]) + " " not in printed]
    assert not missing, missing


def _describe(parallel: dict) -> str:
    from workbench.model.layout import Layout

    return Layout.from_dict(parallel).describe()


def _planned(made: dict, name: str, parallel: str) -> dict:
    """``plan`` of the fixture's model with ``--parallel parallel``, written to ``name``; its JSON and its path."""
    out = made["tmp"] / name
    argv = list(made["argv"])
    argv[argv.index("auto,sp=0,lp=0")] = parallel
    argv[argv.index("--json") + 1] = str(out)
    assert main(argv) == 0
    return {"json": json.loads(out.read_text()), "path": out}


def test_a_tp_overlap_plan_is_faster_and_checked_on_its_overlapped_chain(made, capsys, monkeypatch):
    monkeypatch.chdir(made["tmp"])
    plain = _planned(made, "tpo0.json", "tp=2,pp=2,dp=1,sp=1")["json"]
    overlapped_plan = _planned(made, "tpo1.json", "tp=2,pp=2,dp=1,sp=1,tpo=1")
    overlapped = overlapped_plan["json"]
    assert overlapped["parallel"]["tp_overlap"] is True and "tp_overlap" not in plain["parallel"]
    assert overlapped["step_seconds"] != plain["step_seconds"]
    capsys.readouterr()
    assert main(["check", str(overlapped_plan["path"])]) == 0             # its period is the overlapped chain's
    assert "valid (2 stages" in capsys.readouterr().out
    argv = list(made["argv"])
    argv[argv.index("auto,sp=0,lp=0")] = "auto,sp=0,tpo=1"
    assert main(argv) == 2
    assert "tpo=1 overlaps" in capsys.readouterr().err


def test_fused_kernels_are_planned_on_their_profiles_and_recorded(made, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                    # check profiles the plan's rank again under build/profiles here
    out = tmp_path / "fused.json"
    base = ["plan", "--module", f"{made['module']}:build", "--fake", "--gpu", "h100-sxm", "--devices", "4",
            "--global-batch", "16", "--parallel", "tp=2,pp=1,dp=2,sp=1", "--optimizer", "adamw", "-q"]
    assert main(base + ["--kernels", "fused", "--json", str(out)]) == 0
    assert main(base + ["--json", str(tmp_path / "eager.json")]) == 0
    fused, eager = (json.loads(p.read_text()) for p in (out, tmp_path / "eager.json"))
    assert fused["extra"]["kernels"] == "fused" and "kernels" not in eager["extra"]
    assert fused["tokens_per_second"] > eager["tokens_per_second"]
    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    assert f"{out}: valid" in capsys.readouterr().out
    assert main(["plan", "--profile", str(made["profile"]), "--devices", "4", "--global-batch", "16",
                 "--parallel", "pp=1,dp=4", "--kernels", "fused"]) == 2
    assert "--kernels fused goes with --module and --fake" in capsys.readouterr().err


def test_a_dp_overlap_plan_is_written_checked_and_simulated_and_auto_asks_for_it(made, capsys, monkeypatch):
    monkeypatch.chdir(made["tmp"])
    plain = _planned(made, "dpo0.json", "tp=1,pp=2,dp=2,zero=1")["json"]
    overlapped_plan = _planned(made, "dpo1.json", "tp=1,pp=2,dp=2,zero=1,dpo=1")
    overlapped = overlapped_plan["json"]
    assert overlapped["parallel"]["dp_overlap"] is True and "dp_overlap" not in plain["parallel"]
    # a small model is one Megatron bucket (under 40 M parameters): its gather waits before the first forward as
    # long as torch's after the step; its reduce-scatter starts only when the backward ends (DDP's per-layer
    # all-reduces hide behind it)
    parts = plain["step_breakdown"], overlapped["step_breakdown"]
    assert parts[1]["post_step"] == pytest.approx(parts[0]["post_step"])
    assert parts[1]["data_parallel"] > parts[0]["data_parallel"] and parts[1]["pipeline"] == parts[0]["pipeline"]
    capsys.readouterr()
    assert main(["check", str(overlapped_plan["path"])]) == 0
    assert "valid (2 stages" in capsys.readouterr().out
    simulated = made["tmp"] / "dpo.csv"
    assert main(["simulate", str(overlapped_plan["path"]), "--batches", "8", "--out", str(simulated)]) == 0
    out = made["tmp"] / "auto-dpo.json"
    argv = list(made["argv"])
    argv[argv.index("auto,sp=0,lp=0")] = "auto,sp=0,lp=0,dpo=1"
    argv[argv.index("--json") + 1] = str(out)
    assert main(argv) == 0
    frontier = json.loads(out.read_text())["frontier"]
    assert any(f["parallel"].get("dp_overlap") for f in frontier)
    assert all(f["parallel"].get("dp_overlap", False) == (f["parallel"]["zero"] == 1) for f in frontier
               if f["parallel"]["schedule"] != "dp")
    argv[argv.index("auto,sp=0,lp=0,dpo=1")] = "tp=1,pp=1,dp=4,zero=2,dpo=1"
    assert main(argv) == 2
    assert "dpo=1 is ZeRO-1" in capsys.readouterr().err


TIGHT = '''
import torch
from torch.nn import functional as F


def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, use_cache=False)
    ids = torch.randint(0, 256, (4, 256))
    return LlamaForCausalLM(cfg), ids, ids.roll(-1, 1), lambda out, y: F.cross_entropy(out.logits.flatten(0, 1),
                                                                                      y.flatten())
'''


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """A small Llama with long sequences (activations dominate), its batch fixed (one micro-batch size), on 2
    GPUs: ``plan(memory, parallel, out)`` runs ``plan`` (activations kept, 1F1B) and returns its exit status."""
    tmp = tmp_path_factory.mktemp("tight")
    (tmp / "tight.py").write_text(TIGHT)

    def plan(memory: str, parallel: str, out: str | None = None, quiet: bool = True) -> int:
        return main(["plan", "--module", f"{tmp / 'tight.py'}:build", "--fake", "--gpu", "h100-sxm", "--devices",
                     "2", "--devices-per-node", "2", "--global-batch", "8", "--activations", "keep", "--method", "1f1b",
                     "--memory", memory, "--profile-cache", str(tmp / "cache"), "--parallel", parallel]
                    + ["-q"] * quiet + (["--json", str(tmp / out)] if out else []))

    plan.tmp = tmp
    return plan


def test_auto_picks_sequence_parallelism_when_only_it_fits(tight, capsys):
    """On 2 GPUs of 9.25 MiB every layout without sequence parallelism needs more (tp 2: 10.37 MiB, 9.40 with the
    split loss; pp 2 11.2; dp 2 13), tp 2 with it 9.11 (8.14 with the split loss): ``--parallel auto``, which
    tries sp and lp off and on for tp 2 (each its own profile), chooses sp=1; at 8.6 MiB, sp=1 with lp=1."""
    assert tight("9.25MiB", "auto", "a.json") == 0
    data = json.loads((tight.tmp / "a.json").read_text())
    assert (data["parallel"]["tp"], data["parallel"]["sequence_parallel"]) == (2, True), data["parallel"]
    assert (data["search"]["sequence_parallel"], data["search"]["loss_parallel"]) == ([False, True], [False, True])
    tried = {(f["parallel"]["sequence_parallel"], f["parallel"]["loss_parallel"]) for f in data["frontier"]
             if f["parallel"]["tp"] == 2}                     # evaluated or skipped by a bound
    assert tried == {(False, False), (False, True), (True, False), (True, True)}
    assert all(not (f["parallel"]["sequence_parallel"] or f["parallel"]["loss_parallel"]) for f in data["frontier"]
               if f["parallel"]["tp"] == 1)
    assert tight("8.6MiB", "auto", "b.json") == 0             # only sp=1 with the split loss fits
    leaner = json.loads((tight.tmp / "b.json").read_text())["parallel"]
    assert (leaner["tp"], leaner["sequence_parallel"], leaner["loss_parallel"]) == (2, True, True), leaner


def test_auto_with_sp_or_lp_pinned_searches_only_that_setting(tight, capsys):
    capsys.readouterr()
    assert tight("9.25MiB", "auto,sp=0", quiet=False) == 2    # the only layouts that fit are pinned out
    printed = capsys.readouterr()
    assert "searching tp x pp x dp, sp 0, lp 0/1 for tp > 1" in printed.err           # the progress line
    assert "(sp 0, lp 0/1 for tp > 1)" in printed.out                                   # the summary line
    assert "error: no layout of 2 GPUs fits in 9.25 MiB per GPU" in printed.err
    assert tight("9.25MiB", "auto,lp=1", "c.json") == 0
    data = json.loads((tight.tmp / "c.json").read_text())
    assert (data["search"]["sequence_parallel"], data["search"]["loss_parallel"]) == ([False, True], [True])
    assert all(f["parallel"]["loss_parallel"] for f in data["frontier"] if f["parallel"]["tp"] == 2)
    assert data["parallel"]["loss_parallel"] and data["parallel"]["sequence_parallel"]
