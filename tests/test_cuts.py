"""Cutting a model at module names (profiles/cuts.py, ``profile --split-at``): what crosses a cut is sent (packed),
what depends on neither the input nor a parameter stays a constant, the loss gets the output tensors it reads,
and each refusal is one line. Hugging Face families the other routes refuse (examples/hf_families.py: Qwen2 with
its own loss from ``labels=``, Gemma 2, T5, ViTForImageClassification, Mixtral with its router's loss) split,
real and fake, with the model's gradients; a --split-at profile plans and runs on 2 ranks.

Every test here fails on the main branch before --split-at (no workbench.profiles.cuts; the families were refused:
"the chain's input appears 2 times", "'NoneType' object has no attribute 'detach'", "none of the model's outputs is
the output of its last module", "argument 3 carries a gradient", "module 'classifier' after the last block is not
fed the previous module's output alone")."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from workbench.front.cli import main  # noqa: E402
from workbench.paths import REPO_ROOT  # noqa: E402
from workbench.profiles.discover import DiscoveryError, discover_layers  # noqa: E402
from workbench.profiles.usermodel import load_user_model  # noqa: E402

FAMILIES = str(REPO_ROOT / "examples" / "hf_families.py")


def _grads(found, target):
    """The chain run layer after layer and its loss's backward: gradients under the model's parameter names."""
    h = found.input
    for m in found.modules:
        h = m(h)
    found.loss(h, target).backward()
    grads = {}
    for m, names in zip(found.modules, found.parameter_names):
        for n, p in m.named_parameters():
            grads[names[n]] = p.grad.clone()
    for m in found.modules:
        m.zero_grad(set_to_none=True)
    return grads


def _model_grads(model, inputs, target, loss):
    model.zero_grad(set_to_none=True)
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    loss(out, target).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _same_grads(got, want):
    assert set(got) == set(want)
    bad = [n for n in want if not torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-6)]
    assert not bad, bad


# ---------------------------------------------------------------------------------------------
# small models written here
# ---------------------------------------------------------------------------------------------
class Masked(nn.Module):
    """Blocks that read a mask made from the batch's other input, and a skip from the stem to the head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        skip = h
        mask = keep.float()[..., None] * 2 - 1        # from the other input only: a constant
        for b in self.blocks:
            h = torch.tanh(b(h)) * mask
        return self.head(h + skip).mean(1)


def test_a_skip_is_sent_packed_a_mask_stays_constant_and_gradients_are_the_models():
    torch.manual_seed(0)
    model = Masked()
    x, keep, y = torch.randn(2, 5, 6), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]), torch.tensor([0, 2])
    inputs = {"x": x, "keep": keep}
    found = discover_layers(model, inputs, F.cross_entropy, y, split_at=("blocks.0", "blocks.2", "head"))
    assert found.how.startswith("exported graph cut before 3 modules")
    assert found.names == ("stem", "blocks.0", "blocks.2", "head")
    sizes, h = [], found.input
    for m in found.modules:
        h = m(h)
        sizes.append(h.numel())
    hidden = 2 * 5 * 8
    assert sizes[:3] == [hidden, 2 * hidden, hidden]    # the skip beside the hidden state; the mask is never sent
    assert any(n.startswith("_constant_") or n.startswith("_input_") for n, _ in found.modules[1].named_buffers())
    _same_grads(_grads(found, y), _model_grads(model, inputs, y, F.cross_entropy))


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.a(x)))


class IntsAcross(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = x.argmax(-1)                       # an integer tensor computed from the input, read after the cut
        return self.b(self.a(x)) + top[:, None]


class Branch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:                          # control flow on values: torch.export cannot capture it
            h = -h
        return self.b(h)


class TwoDtypes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        total = h.double().sum()                 # a float64 tensor computed before the cut, read after it
        return self.b(h) + total


@pytest.mark.parametrize("model,names,message", [
    (Twice(), ("b", "c"), r"--split-at: Twice has no module 'c' \(nearest: a, b"),
    (Twice(), ("a",), r"--split-at a: the forward calls it 2 times; cut at a module it calls once"),
    (IntsAcross(), ("b",), r"--split-at b: .*a int64 tensor of shape \(3,\) computed from the input before 'b' is "
                           r"read after it; only floating tensors are sent: move the cut"),
    (TwoDtypes(), ("b",), r"--split-at b: .*tensors of several dtypes cross it"),
    (Branch(), ("b",), r"--split-at b: torch.export could not capture Branch's forward"),
])
def test_refusals_are_one_line(model, names, message):
    with pytest.raises(ValueError, match=message) as e:
        discover_layers(model, torch.randn(3, 4), F.cross_entropy, torch.zeros(3, dtype=torch.long), split_at=names)
    assert "\n" not in str(e.value) and str(e.value).count("--split-at") == 1


# ---------------------------------------------------------------------------------------------
# Hugging Face families, as users train them
# ---------------------------------------------------------------------------------------------
#: function of examples/hf_families.py -> the layers discovery finds by itself
EXPECTED = {
    "qwen2_own_loss": ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3",
                       "model.norm", "lm_head"),
    "gemma2": ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3",
               "model.norm", "lm_head"),
    "t5": ("encoder.embed_tokens", "encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1",
           "decoder.final_layer_norm", "lm_head"),
    "vit": ("vit.embeddings", "vit.layers.0", "vit.layers.1", "vit.layers.2", "vit.layers.3", "vit.layernorm",
            "classifier"),
    "mixtral_router_loss": ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                            "model.layers.3", "model.norm", "lm_head"),
}


@pytest.mark.parametrize("func", sorted(EXPECTED))
def test_families_the_other_routes_refuse_split_with_the_models_gradients(func):
    um = load_user_model(f"{FAMILIES}:{func}")
    found = discover_layers(um.model, um.inputs, um.loss, um.targets)
    assert found.how.startswith("exported graph cut before") and found.names == EXPECTED[func]
    _same_grads(_grads(found, um.targets), _model_grads(um.model, um.inputs, um.targets, um.loss))


def test_what_crosses_the_cuts_of_t5_and_mixtral():
    # T5: between decoder blocks, the hidden state, the encoder's output and the self-attention's position bias
    # (computed from parameters) are sent, packed; the cross-attention's bias (zeros and the mask) is a constant.
    # Mixtral: each block adds its router's logits, which its own loss reads
    um = load_user_model(f"{FAMILIES}:t5")
    found = discover_layers(um.model, um.inputs, um.loss, um.targets)
    h = found.input
    for m in found.modules[:4]:            # up to the output of decoder.block.0
        h = m(h)
    enc, dec, heads = 2 * 16 * 64, 2 * 8 * 64, 4
    assert h.numel() == dec + enc + heads * 8 * 8
    um = load_user_model(f"{FAMILIES}:mixtral_router_loss")
    assert um.model.config.output_router_logits
    found = discover_layers(um.model, um.inputs, um.loss, um.targets)
    h, sizes = found.input, []
    for m in found.modules[:5]:
        h = m(h)
        sizes.append(h.numel())
    hidden, router = 2 * 16 * 64, 2 * 16 * 4
    assert sizes == [hidden, hidden + router, hidden + 2 * router, hidden + 3 * router, hidden + 4 * router]
    assert found.modules[-1](h).numel() == 1              # the last layer returns the model's own loss alone


def test_qwen2_labels_as_a_copy_no_longer_ends_in_a_traceback():
    # labels a copy of the ids: the blocks route used to hand the loss out.loss = None ('NoneType' ... 'detach')
    um = load_user_model(f"{FAMILIES}:qwen2_own_loss")
    inputs = {**um.inputs, "labels": um.inputs["labels"].clone()}
    found = discover_layers(um.model, inputs, um.loss, um.targets)
    assert found.names == EXPECTED["qwen2_own_loss"]


@pytest.mark.parametrize("func", ["qwen2_own_loss", "t5", "vit"])
def test_a_fake_profile_cuts_as_a_real_one_with_the_same_memory_columns(func):
    from workbench.profiles.fake import fake_module
    from workbench.profiles.profiler import profile_model

    fake = fake_module(f"{FAMILIES}:{func}", "h100-sxm")
    um = load_user_model(f"{FAMILIES}:{func}")
    real = profile_model(um.model, um.inputs, loss=um.loss, target=um.targets, warmup=0, repeats=1)
    assert fake.meta["layers_found"] == real.meta["layers_found"]
    assert [l.name for l in fake.layers] == [l.name for l in real.layers]
    for col in ("weight_bytes", "activation_bytes", "saved_bytes", "forward_peak_bytes"):
        f, r = (sum(getattr(l, col) for l in c.layers) for c in (fake, real))
        assert f == pytest.approx(r, rel=0.01), col


@pytest.mark.parametrize("func", ["gemma2", "mixtral_router_loss_bf16"])
def test_gemma2_and_mixtral_profile_fake(func):
    # Gemma 2: fake tensors have no values, and a shape alone took its soft-capped logits for the head's output
    # (the blocks route, leaving the cap out); Mixtral in bf16 (its grouped products need it under fake tensors)
    from workbench.profiles.fake import fake_module

    chain = fake_module(f"{FAMILIES}:{func}", "h100-sxm")
    assert chain.meta["layers_found"].startswith("exported graph cut")
    assert tuple(l.name for l in chain.layers) == EXPECTED[func.replace("_bf16", "")]


# ---------------------------------------------------------------------------------------------
# the command line: profile --split-at, plan, run
# ---------------------------------------------------------------------------------------------
def test_profile_split_at_records_the_cuts_and_plans(tmp_path, capsys):
    out = tmp_path / "t5.csv"
    assert main(["profile", "--module", f"{FAMILIES}:t5", "--split-at", "encoder.block.1,decoder.block.0",
                 "--repeats", "1", "--warmup", "0", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "layers found: exported graph cut before 2 modules (encoder.block.1, decoder.block.0)" in said
    from workbench.profiles import load_profile

    chain = load_profile(out)
    assert chain.meta["split_at"] == "encoder.block.1,decoder.block.0"
    assert [l.name for l in chain.layers] == ["encoder.embed_tokens+encoder.block.0", "encoder.block.1",
                                              "decoder.block.0"]
    assert main(["plan", "--profile", str(out), "--devices", "2", "--quiet"]) == 0
    assert main(["profile", "--module", f"{FAMILIES}:t5", "--fake", "--gpu", "h100-sxm", "--split-at",
                 "encoder.block.1,decoder.block.0", "--out", str(tmp_path / "fake.csv")]) == 0
    assert pd.read_csv(tmp_path / "fake.csv", comment="#")["name"].tolist() == [l.name for l in chain.layers]


def test_profile_split_at_refusals(tmp_path, capsys):
    out = str(tmp_path / "x.csv")
    assert main(["profile", "--model", "mlp", "--split-at", "fc1", "--out", out]) == 2
    assert "--split-at goes with --module" in capsys.readouterr().err
    assert main(["profile", "--module", f"{FAMILIES}:vit", "--split-at", "vit.layer.2", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no module 'vit.layer.2' (nearest: vit.layers.2" in err
    assert main(["profile", "--module", f"{FAMILIES}:vit", "--split-at", "vit.layers.1,,classifier",
                 "--out", out]) == 2
    assert "an empty module name" in capsys.readouterr().err


def test_a_model_no_route_splits_names_the_option():
    with pytest.raises(DiscoveryError, match=r"cannot split Branch into layers; .*name the modules to cut before: "
                                             r"--split-at NAME,NAME"):
        discover_layers(Branch(), torch.randn(3, 4), F.cross_entropy, torch.zeros(3, dtype=torch.long))


def test_run_takes_the_cuts_from_the_profile(tmp_path, capsys):
    import json

    prof, plan = tmp_path / "q.csv", tmp_path / "q-plan.json"
    assert main(["profile", "--module", f"{FAMILIES}:qwen2_own_loss", "--split-at", "model.layers.2,lm_head",
                 "--repeats", "1", "--warmup", "0", "--out", str(prof)]) == 0
    assert main(["plan", "--profile", str(prof), "--devices", "2", "--json", str(plan), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(plan), "--profile", str(prof), "--steps", "4", "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["max_grad_error"] <= summary["grad_tolerance"]


def test_a_router_loss_the_users_loss_computes_is_carried_to_it():
    # the user's loss adds Mixtral's load-balancing loss from out.router_logits itself (no labels= in the batch)
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    um = load_user_model(f"{FAMILIES}:mixtral_router_loss")
    ids = um.inputs["input_ids"]
    cfg = um.model.config

    def loss(out, y):
        aux = load_balancing_loss_func(out.router_logits, cfg.num_local_experts, cfg.num_experts_per_tok)
        return F.cross_entropy(out.logits.flatten(0, 1), y.flatten()) + cfg.router_aux_loss_coef * aux

    found = discover_layers(um.model, ids, loss, ids)
    assert found.how.startswith("exported graph cut before")
    out = found.input
    for m in found.modules:
        out = m(out)
    assert out.numel() == 2 * 16 * 512 + 4 * 2 * 16 * 4           # the logits and the 4 routers' logits, packed
    _same_grads(_grads(found, ids), _model_grads(um.model, ids, ids, loss))
