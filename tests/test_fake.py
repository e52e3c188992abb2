"""Fake-tensor profiles: the same memory columns as a real profile, nothing allocated, clear refusals."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.front.cli import main
from workbench.model.chain import MEMORY_COLUMNS
from workbench.profiles import read_profile
from workbench.profiles.fake import FakeProfileError, fake_profile, fake_zoo, for_gpu, unpacked_sequences
from workbench.profiles.profiler import profile_model, profile_zoo

COLUMNS = ("weight_bytes", "activation_bytes", "saved_bytes") + MEMORY_COLUMNS


@pytest.mark.parametrize("name,kw,dtype", [
    ("mlp", {}, None), ("tiny-resnet", {}, None), ("tiny-gpt", {}, None), ("tiny-gpt", {}, "bfloat16"),
])
def test_fake_columns_equal_the_real_ones(name, kw, dtype):
    real = profile_zoo(name, 4, repeats=1, warmup=0, dtype=dtype, **kw)
    fake = fake_zoo(name, 4, "h100-sxm", dtype=dtype, **kw)
    assert [l.name for l in fake.layers] == [l.name for l in real.layers]
    for a, b in zip(real.layers, fake.layers):
        for c in COLUMNS:
            assert getattr(b, c) == getattr(a, c), (a.name, c)


def test_a_hugging_face_gpt2_with_its_tied_head():
    transformers = pytest.importorskip("transformers")

    def build():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=500,
                                      bos_token_id=0, eos_token_id=0, use_cache=False)
        ids = torch.randint(0, 500, (2, 32))
        return (transformers.GPT2LMHeadModel(cfg), ids, ids,
                lambda out, y: torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten()))

    model, x, y, loss = build()
    real = profile_model(model, x, loss=loss, target=y, repeats=1, warmup=0)
    fake = fake_profile(build, "h100-sxm")
    assert json.loads(fake.meta["tied"])[0]["layers"] == json.loads(real.meta["tied"])[0]["layers"]
    for a, b in zip(real.layers, fake.layers):
        for c in COLUMNS:
            ra, fb = getattr(a, c), getattr(b, c)
            assert abs(fb - ra) <= 0.01 * max(ra, 1.0), (a.name, c, ra, fb)


def test_a_model_too_large_for_this_machine_profiles_without_allocating():
    """40 GB of float32 weights (a 100k x 100k Linear): a real profile could not even build it."""
    def build():
        lin = torch.nn.Linear(100_000, 100_000, bias=False)
        return (torch.nn.Sequential(lin), torch.zeros(2, 100_000), torch.zeros(2, dtype=torch.long),
                torch.nn.functional.cross_entropy)

    chain = fake_profile(build, "h100-sxm")
    assert chain.layers[0].weight_bytes == 4e10 and chain.layers[0].grad_bytes == 4e10
    # batch 2: the forward reads the 40 GB of weights, memory-bound on an H100 (cuBLAS's share of the bandwidth),
    # after the layer's start-up and its launch
    from workbench.profiles.kernel_time import H100_CALIBRATION as C
    from workbench.profiles.kernel_time import M_GEMM, T_GEMM
    start = C.overhead + C.launch[0] + T_GEMM
    assert chain.layers[0].forward == pytest.approx(start + 4e10 / (3.35e12 * M_GEMM), rel=0.01)


def test_the_profile_says_its_times_are_estimates():
    chain = fake_zoo("tiny-gpt", 2, "a100-40gb")
    m = chain.meta
    assert m["times"] == "estimated" and m["gpu"] == "a100-40gb" and m["device"].startswith("cuda (NVIDIA A100")
    assert "estimated, not measured" in m["timing"] and "FakeTensorMode" in m["memory_columns"]


def test_one_fake_run_serves_every_gpu():
    chain, times = fake_zoo("tiny-gpt", 4, "h100-sxm", return_work=True)
    a100, h200 = for_gpu(chain, times, "a100-40gb"), for_gpu(chain, times, "h200")
    assert a100.total_compute > chain.total_compute >= h200.total_compute
    assert [l.saved_bytes for l in a100.layers] == [l.saved_bytes for l in chain.layers]
    assert a100.meta["gpu"] == "a100-40gb" and "A100" in a100.meta["timing"]


class _Item(torch.nn.Module):
    def forward(self, x):
        return x / max(x.abs().max().item(), 1.0)


class _Nonzero(torch.nn.Module):
    def forward(self, x):
        return x + x[x > 0].sum()


@pytest.mark.parametrize("layer,op", [(_Item(), "aten._local_scalar_dense"), (_Nonzero(), "aten.nonzero")])
def test_a_model_that_needs_values_is_refused_naming_the_operation(layer, op):
    def build():
        return (torch.nn.Sequential(torch.nn.Linear(4, 4), layer), torch.zeros(2, 4), torch.zeros(2, 4),
                torch.nn.functional.mse_loss)

    with pytest.raises(FakeProfileError, match=f"operation {op}.*profile it for real"):
        fake_profile(build, "h100-sxm")


def test_unpacked_sequences_restores_hugging_face():
    mu = pytest.importorskip("transformers.masking_utils")
    before = mu.find_packed_sequence_indices
    real = torch.tensor([[0, 1, 2, 0, 1]])               # two sequences packed in one row
    with unpacked_sequences():
        assert mu.find_packed_sequence_indices is not before
        assert torch.equal(mu.find_packed_sequence_indices(real), before(real))    # real ids: read as usual
    assert mu.find_packed_sequence_indices is before


def test_cli_fake_profile_and_its_refusals(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", "tiny-gpt", "--batch-size", "2", "--fake", "--gpu", "h200",
                 "--out", str(out)]) == 0
    assert read_profile(out).meta["gpu"] == "h200" and "times: estimated" in capsys.readouterr().out
    for argv, pattern in [
        (["--model", "tiny-gpt", "--fake", "--out", str(out)], "--fake needs --gpu NAME.*known: a100-40gb"),
        (["--model", "tiny-gpt", "--fake", "--gpu", "v100", "--out", str(out)], "unknown GPU 'v100'; known:"),
        (["--model", "tiny-gpt", "--gpu", "h200", "--out", str(out)], "--gpu goes with --fake"),
        (["--fake", "--gpu", "h200", "--out", str(out)], "give --model NAME or --module"),
    ]:
        assert main(["profile"] + argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
        assert __import__("re").search(pattern, err), err
    assert main(["profile", "--list-gpus"]) == 0
    assert "mi300x" in capsys.readouterr().out


def test_a_profile_its_loader_would_refuse_is_not_written(tmp_path, capsys):
    # a huge batch: main wrote a profile with times above 1e7 ms, which its own loader then refused
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", "tiny-gpt", "--batch-size", "100000000000", "--fake", "--gpu", "h100-sxm",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().split("\n")[-1]
    assert err.startswith("error: the profile, layer ")     # a time above 1e7 ms or bytes above 1 PiB
    assert __import__("re").search(r"is above (1e\+07 ms|1\.1259e\+15 bytes); not a measurement", err), err
    assert f"nothing written to {out}" in err and not out.exists()


MODEL_TO = '''import torch
from torch.nn import functional as F


def build():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10)).to(torch.bfloat16)
    ids = torch.randint(0, 10, (2, 3))
    return model, ids, ids, lambda out, y: F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
'''


def test_model_to_a_dtype_under_fake_names_the_default_dtype_fix(tmp_path, capsys):
    (tmp_path / "cast.py").write_text(MODEL_TO)
    assert main(["profile", "--module", f"{tmp_path}/cast.py:build", "--fake", "--gpu", "h100-sxm",
                 "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().split("\n")[-1]
    assert "Couldn't swap" in err and "torch.set_default_dtype" in err and "instead of model.to(dtype)" in err


def test_fused_kernels_are_recorded_in_the_metadata_and_an_unknown_setting_refused():
    from workbench.profiles.fake import fake_zoo

    eager, fused = fake_zoo("tiny-gpt", 2, "h100-sxm"), fake_zoo("tiny-gpt", 2, "h100-sxm", kernels="fused")
    assert "kernels" not in eager.meta and fused.meta["kernels"] == "fused"
    assert [l.weight_bytes for l in eager.layers] == [l.weight_bytes for l in fused.layers]
    assert fused.total_compute < eager.total_compute
    with pytest.raises(ValueError, match="known: eager, fused"):
        fake_zoo("tiny-gpt", 2, "h100-sxm", kernels="compiled")
