"""Your own model end to end: ``profile --module`` -> ``plan`` (dp, general ILP) -> ``run --module`` on 2 and 4
ranks (gloo, CPU), for Hugging Face GPT-2 (tied embedding and LM head), BERT and a Llama-style decoder built
from small configs with random weights, and a small CNN written here. The user's functions below only build a
model and a batch; the workbench finds the layers. No weights are downloaded (HF_HUB_OFFLINE).

The gradients of every run must equal those of the whole model in one process (tied weights tied) within
the dtype's tolerance; no timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from workbench.front.cli import main  # noqa: E402

HERE = Path(__file__).resolve()
SEQ, BATCH, VOCAB = 16, 4, 97


# ---------------------------------------------------------------------------------------------
# the user's side: FUNC() -> (model, example_inputs, example_targets, loss_fn)
# ---------------------------------------------------------------------------------------------
def _lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def _cls_loss(out, y):
    return F.cross_entropy(out.logits, y)


def gpt2(use_cache: bool = False):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, use_cache=use_cache, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return GPT2LMHeadModel(cfg), ids, ids.roll(-1, 1), _lm_loss


def gpt2_with_cache():
    return gpt2(use_cache=True)


def _padded(ids: torch.Tensor) -> torch.Tensor:
    """An attention mask with padding at the end of two rows."""
    mask = torch.ones_like(ids)
    mask[1, SEQ - 5:] = 0
    mask[3, SEQ // 2:] = 0
    return mask


def gpt2_padded():
    """GPT-2 as its default config builds it (use_cache on) and a padded batch given as a dict."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return GPT2LMHeadModel(cfg), {"input_ids": ids, "attention_mask": _padded(ids)}, ids.roll(-1, 1), _lm_loss


def bert_padded():
    """BERT for masked LM (its head tied to the embedding): ids, a padding mask and token types in a dict."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                     vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ))
    types = torch.zeros_like(ids)
    types[:, SEQ // 2:] = 1
    inputs = {"input_ids": ids, "attention_mask": _padded(ids), "token_type_ids": types}
    return BertForMaskedLM(cfg), inputs, ids, _lm_loss


class Residual(nn.Module):
    """Blocks in a ModuleList with a skip from the stem across three of them, a functional mean before the
    head, and a dict as output: discovery traces the code between the blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(12, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU()) for _ in range(6))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> dict:
        h = self.stem(x)
        skip = h
        for i, block in enumerate(self.blocks):
            h = h + block(h)
            if i == 2:
                h = h + skip
        return {"logits": self.head(h.mean(1))}


def residual():
    return Residual(), torch.randn(BATCH, 6, 12), torch.randint(0, 10, (BATCH,)), \
        lambda out, y: F.cross_entropy(out["logits"], y)


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                     vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=3, pad_token_id=0)
    return BertForSequenceClassification(cfg), torch.randint(1, VOCAB, (BATCH, SEQ)), torch.randint(0, 3, (BATCH,)), \
        _cls_loss


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=SEQ, use_cache=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return LlamaForCausalLM(cfg), ids, ids.roll(-1, 1), _lm_loss


class SmallCNN(nn.Module):
    """Convolutions with batch norm and a residual connection, written as a user would: no Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)) + x)
        x = F.relu(self.conv3(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def cnn():
    return SmallCNN(), torch.randn(BATCH, 3, 16, 16), torch.randint(0, 10, (BATCH,)), F.cross_entropy


class Branchy(nn.Module):
    """Two inputs' worth of work in one forward, no blocks, and Python control flow on values: not splittable."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:
            h = h * 2
        return self.b(h)


def branchy():
    return Branchy(), torch.randn(3, 4), torch.randint(0, 2, (3,)), F.cross_entropy


# ---------------------------------------------------------------------------------------------
# profile -> plan -> run
# ---------------------------------------------------------------------------------------------
MODELS = {
    # name: (layers found, route)
    "gpt2": (5, "blocks at transformer.h"),
    "bert": (6, "blocks at bert.encoder.layer"),
    "llama": (5, "blocks at model.layers"),
    "cnn": (6, "traced graph"),
    "gpt2_padded": (5, "blocks at transformer.h"),
    "bert_padded": (4, "blocks at bert.encoder.layer"),
    "residual": (8, "traced graph"),
}


def _spec(func: str) -> str:
    return f"{HERE}:{func}"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    out = {}
    for name in MODELS:
        path = root / f"{name}.csv"
        assert main(["profile", "--module", _spec(name), "--repeats", "1", "--warmup", "0", "--out", str(path)]) == 0
        out[name] = path
    return root, out


@pytest.mark.parametrize("name", list(MODELS))
def test_profile_finds_the_layers_and_counts_ties_once(profiles, name):
    from workbench.profiles import read_profile

    chain = read_profile(profiles[1][name])
    layers, how = MODELS[name]
    from workbench.profiles.usermodel import resolve_spec

    assert len(chain) == layers and chain.meta["layers_found"] == how
    folder = profiles[1][name].parent      # the module is recorded relative to the profile's folder
    assert not chain.meta["module"].startswith("/") and resolve_spec(chain.meta["module"], folder).endswith(
        f"tests/test_own_model.py:{name}")
    model = globals()[name]()[0]
    unique = sum(p.numel() * p.element_size() for p in model.parameters())   # each shared parameter once
    assert chain.weights.sum() == unique
    tied = json.loads(chain.meta.get("tied", "[]"))
    if name in ("gpt2", "gpt2_padded"):   # the token embedding is the LM head's weight: counted at the embedding
        assert [t["parameter"] for t in tied] == ["transformer.wte.weight"]
        assert tied[0]["owner"] == chain.layers[0].name and tied[0]["layers"][-1] == "lm_head"
        assert tied[0]["bytes"] == VOCAB * 32 * 4 and chain.layers[-1].weight_bytes == 0
    elif name == "bert_padded":
        assert [t["parameter"] for t in tied] == ["bert.embeddings.word_embeddings.weight"]
    else:
        assert tied == []


def _plan(root: Path, profile: Path, name: str, devices: int, method: str, weights: str = "stash") -> Path:
    plan = root / f"{name}-{method}-P{devices}-{weights}.json"
    args = ["plan", "--profile", str(profile), "--devices", str(devices), "--json", str(plan), "--method", method,
            "--weights", weights]
    if method == "ilp":
        args += ["--allocation", "general", "--time-limit", "20"]
    assert main(args) == 0
    return plan


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("devices,method,weights", [(2, "dp", "single"), (4, "dp", "stash"),
                                                    (2, "ilp", "stash"), (4, "ilp", "single")])
def test_run_on_ranks_matches_one_process(profiles, name, devices, method, weights):
    """dp and general ILP plans on 2 and 4 ranks; torch's engine (one weight version) and the PipeDream
    fallback (stash) both; gradients equal the single process's, tied weights tied."""
    root, paths = profiles
    plan = _plan(root, paths[name], name, devices, method, weights)
    out = root / f"run-{name}-{method}-P{devices}"
    assert main(["run", str(plan), "--module", _spec(name), "--profile", str(paths[name]), "--steps", "4",
                 "--out", str(out)]) == 0      # the plan's weights: run takes its set-up from the plan
    s = json.loads((out / "summary.json").read_text())
    assert s["engine"] == ("torch" if weights == "single" else "pipedream") and s["optimizer"] == "adam"
    assert s["max_grad_error"] <= s["grad_tolerance"]
    assert len(s["memory_measured"]) == devices == len(s["memory_predicted"])
    for k in ("predicted_period", "measured_period", "memory_predicted", "memory_measured", "max_grad_error"):
        assert s[k] is not None
    if name in ("gpt2", "gpt2_padded"):
        assert [t["parameter"] for t in s["tied"]] == ["transformer.wte.weight"]


def test_the_padding_reaches_the_gradients():
    """The gradient check has teeth for padded batches: the mask changes GPT-2's and BERT's gradients by far
    more than the rounding bound, so a run that lost the mask (or used another batch's) would fail it."""
    from workbench.runtime.engine import Workload, grad_error, reference_gradients

    for name in ("gpt2_padded", "bert_padded"):
        padded = reference_gradients(Workload.module(_spec(name)), 1)
        model, inputs, y, loss = globals()[name]()
        model.config.use_cache = False
        loss(model(**{**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])}), y).backward()
        unpadded = {n: p.grad for n, p in model.named_parameters()}
        assert grad_error(unpadded, padded)[1] > 1e-2, name


def test_a_skip_that_spans_stages_is_sent_forward():
    """Residual's skip leaves the stem on rank 0 and rejoins after blocks.2 on rank 1: packed beside the hidden
    state at every boundary it crosses; both engines, 4 ranks, gradients equal one process's."""

    from workbench.model.target import Target
    from workbench.profiles.profiler import profile_workload
    from workbench.runtime.engine import Workload, grad_error, reference_gradients, run_plan
    from workbench.schedules.builder import best_schedule

    wl = Workload.module(_spec("residual"))
    chain = profile_workload(wl, repeats=1, warmup=0)
    assert [l.activation_bytes for l in chain.layers[:4]] == [BATCH * 6 * 32 * 4 * k for k in (1, 2, 2, 1)]
    plan = best_schedule(chain, Target.of(4), [0, 0, 1, 1, 2, 2, 3, 3])
    ref = reference_gradients(wl, 3)
    for engine in ("torch", "pipedream"):
        res = run_plan(plan, wl, 3, weights="single", engine=engine, timeout=120)
        assert grad_error(res.grads, ref)[1] < 1e-5, engine


def test_the_plan_shows_the_tie_and_replay_takes_a_module(profiles, capsys):
    root, paths = profiles
    plan = _plan(root, paths["gpt2"], "gpt2", 2, "dp")
    assert "tied: transformer.wte.weight shared by" in capsys.readouterr().out
    extra = json.loads(plan.read_text())["extra"]
    assert extra["tied"][0]["parameter"] == "transformer.wte.weight" and extra["layer_names"][-1] == "lm_head"
    out = root / "replay-gpt2"
    assert main(["run", str(plan), "--profile", str(paths["gpt2"]), "--steps", "4", "--replay", "--out", str(out)]) == 0
    import pandas as pd

    rep = pd.read_csv(out / "replay.csv")                # the module came from the profile's metadata
    assert list(rep["device"]) == [0, 1]
    assert ((rep["measured_memory"] - rep["predicted_memory"]).abs() <= 0.05 * rep["predicted_memory"] + 8192).all()


def test_tied_gradient_needs_both_uses():
    """The check has teeth for ties: GPT-2's shared weight gets its gradient from the embedding and the LM
    head; a run that left out the head's share would differ from one process by far more than rounding."""

    from workbench.model.target import Target
    from workbench.profiles.profiler import profile_workload
    from workbench.runtime.engine import Workload, grad_error, reference_gradients, run_plan
    from workbench.schedules.builder import best_schedule

    wl = Workload.module(_spec("gpt2"))
    chain = profile_workload(wl, repeats=1, warmup=0)
    plan = best_schedule(chain, Target.of(2), [0, 0, 1, 1, 1])      # embedding on rank 0, LM head on rank 1
    ref = reference_gradients(wl, 3)
    for engine in ("torch", "pipedream"):
        res = run_plan(plan, wl, 3, weights="single", engine=engine, timeout=120)
        assert grad_error(res.grads, ref)[1] < 1e-5, engine
    model, ids, y, loss = gpt2()
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())     # untied: head's share apart
    for _ in range(3):
        loss(model(ids), y).backward()
    untied = model.transformer.wte.weight.grad
    tied = ref["transformer.wte.weight"]
    assert float((untied - tied).abs().max() / tied.abs().max()) > 1e-2


def test_a_plan_for_another_model_is_refused_before_any_rank(profiles, capsys):
    root, paths = profiles
    plan = _plan(root, paths["gpt2"], "gpt2", 2, "dp")
    t0 = time.perf_counter()
    assert main(["run", str(plan), "--module", _spec("bert"), "--steps", "4", "--out", str(root / "no")]) == 2
    said = capsys.readouterr()
    err = said.err
    assert "the plan has 5 layers but" in err and "bert" in err and "another model" in err
    assert "profiling" not in said.out and "running" not in said.out       # refused before anything long
    assert time.perf_counter() - t0 < 30 and not (root / "no" / "summary.json").exists()
    # same layer count, other names: llama's plan against gpt2
    plan = _plan(root, paths["llama"], "llama", 2, "dp")
    assert main(["run", str(plan), "--module", _spec("gpt2"), "--steps", "4", "--out", str(root / "no")]) == 2
    assert "model.embed_tokens" in capsys.readouterr().err


def test_models_that_cannot_be_split_say_why(tmp_path, capsys):
    # GPT-2 with use_cache on (its default): switched off for training, and said so
    assert main(["profile", "--module", _spec("gpt2_with_cache"), "--out", str(tmp_path / "x.csv"),
                 "--repeats", "1"]) == 0
    assert "note: GPT2LMHeadModel: config.use_cache switched off for training" in capsys.readouterr().out
    assert main(["profile", "--module", _spec("branchy"), "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert "cannot split Branchy" in err and "torch.fx could not trace Branchy.forward at test_own_model.py:" in err
    assert "('if h.sum() > 0:')" in err and "move that code into an nn.Module of its own" in err
    assert main(["profile", "--module", f"{HERE}:nothing", "--out", str(tmp_path / "x.csv")]) == 2
    assert "has no function 'nothing'" in capsys.readouterr().err
    assert main(["profile", "--module", "no_such_file.py:f", "--out", str(tmp_path / "x.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_torchrun_two_processes(profiles):
    """The documented multi-node entry on one node: torchrun with 2 processes on the CPU (gloo)."""
    from workbench.runtime.engine import Workload, grad_error, reference_gradients

    root, paths = profiles
    plan = _plan(root, paths["cnn"], "cnn", 2, "dp", "single")     # torchrun takes the plan's set-up
    out = root / "torchrun"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "workbench.runtime.engine", str(plan),
           "--module", _spec("cnn"), "--profile", str(paths["cnn"]), "--steps", "4",
           "--check-grads", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for attempt in range(2):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=HERE.parents[1])
        # a rank aborted by C++'s std::terminate as its process exits (seen once in a clean CI run, 0 of 6 reruns):
        # a gloo shutdown race, not this run's result; run once more, and say so
        if done.returncode == 0 or "terminate called without an active exception" not in done.stderr:
            break
        print(f"torchrun attempt {attempt + 1}: a rank aborted at exit (std::terminate); running again")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch engine" in done.stdout
    grads = torch.load(out / "grads.pt")
    assert grad_error(grads, reference_gradients(Workload.module(_spec("cnn")), 4))[1] < 1e-5
    # the summary `run` prints and writes: the prediction, every rank's memory, the gradient check
    for line in ("period     predicted", "device 0: memory (model -> allocator peak)", "device 1: memory",
                 "max gradient error (lr 0, vs one process)"):
        assert line in done.stdout, line
    import json

    s = json.loads((out / "summary.json").read_text())
    assert s["engine"] == "torch" and s["devices"] == 2 and len(s["memory_measured"]) == 2
    assert s["memory_plan"] == json.loads(plan.read_text())["memory"] and s["max_grad_error"] < 1e-5
    for name in ("measured.csv", "predicted.csv", "comparison.csv", "plan.json"):
        assert (out / name).exists(), name


def test_transformers_is_an_optional_extra_and_a_pinned_test_requirement():
    import tomllib

    root = HERE.parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("transformers") for d in extras["hf"])
    assert "transformers==" in (root / "requirements.txt").read_text()
    assert not any("transformers" in d for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]
                   .get("dependencies", []))
