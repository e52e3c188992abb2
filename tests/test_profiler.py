"""Tests for the per-layer profiler (workbench.profiles.profiler) and the ``profile`` command."""

from __future__ import annotations

import datetime as dt

import pytest
import torch
from torch import nn

from workbench.front.cli import main
from workbench.profiles import zoo
from workbench.profiles.csvio import read_profile, write_profile
from workbench.profiles.profiler import (
    LayerTiming,
    profile_model,
    profile_zoo,
    saved_tensor_bytes,
    spread_summary,
)
from workbench.profiles.wrappers import ModelFailure

F32 = 4


def test_linear_relu_saved_bytes_match_hand_computation():
    # torch 2.13 autograd saves: Linear -> its input (and its weight, excluded: a parameter);
    # ReLU -> its output. Checked by hand, with b rows of float32.
    b, i, h, o = 3, 5, 7, 2
    model = nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o), nn.ReLU())
    chain = profile_model(model, torch.randn(b, i), repeats=2, warmup=0)
    assert [l.saved_bytes for l in chain.layers] == [b * i * F32, b * h * F32, b * h * F32, b * o * F32]
    assert [l.activation_bytes for l in chain.layers] == [b * h * F32, b * h * F32, b * o * F32, b * o * F32]
    assert [l.weight_bytes for l in chain.layers] == [(i * h + h) * F32, 0, (h * o + o) * F32, 0]
    assert chain.input_bytes == b * i * F32


def test_shared_storage_is_counted_once_and_parameters_are_excluded():
    class Square(nn.Module):  # mul saves both operands: the same tensor
        def forward(self, x):
            return x * x

    class Halves(nn.Module):  # two views of one storage
        def forward(self, x):
            return x[:, :2] * x[:, 2:]

    class Scale(nn.Module):  # saves x and the parameter w
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w

    x = torch.randn(3, 4)
    assert saved_tensor_bytes(Square(), x)[0] == 12 * F32
    assert saved_tensor_bytes(Halves(), x)[0] == 12 * F32  # the whole storage, once
    assert saved_tensor_bytes(Scale(), x)[0] == 12 * F32  # w excluded


def test_embedding_saves_its_indices():
    model = zoo.build_model("tiny-gpt")
    x, _ = zoo.sample_batch("tiny-gpt", 3)  # (3, 16) int64
    n, out = saved_tensor_bytes(model[0], x, input_requires_grad=False)
    assert n == 3 * 16 * 8 + 16 * 8  # token ids and position ids, int64
    assert out.shape == (3, 16, 32)


def test_profile_of_a_zoo_model_against_independent_computation():
    model = zoo.build_model("tiny-resnet")
    x, _ = zoo.sample_batch("tiny-resnet", 2)
    chain, stats = profile_model(model, x, repeats=3, warmup=1, return_stats=True, meta={"network": "tiny"})
    names = [n for n, _ in model.named_children()]
    assert [l.name for l in chain.layers] == names
    h = x
    for layer, (_, child) in zip(chain.layers, model.named_children()):
        assert layer.weight_bytes == sum(p.numel() * p.element_size() for p in child.parameters())
        h = child(h)
        assert layer.activation_bytes == h.numel() * h.element_size()
        assert layer.forward > 0 and layer.backward > 0
        assert layer.saved_bytes > 0
    assert [len(s.forward) for s in stats] == [3] * len(names)
    for layer, s in zip(chain.layers, stats):
        assert min(s.forward) <= layer.forward <= max(s.forward)
        assert min(s.backward) <= layer.backward <= max(s.backward)
    m = chain.meta
    assert m["network"] == "tiny" and m["batch_size"] == "2" and m["input_shape"] == "2x3x32x32"
    assert m["torch"] == torch.__version__ and m["source"] == "workbench profiler" and m["threads"] == "1"
    assert dt.datetime.fromisoformat(m["date"]).year >= 2024
    assert float(m["spread_forward"]) == pytest.approx(spread_summary(stats)["spread_forward"], abs=1e-4)


def test_threads_are_restored_and_the_sequence_form_works():
    before = torch.get_num_threads()
    chain = profile_model([nn.Linear(4, 4), nn.Tanh()], torch.zeros(2, 4), repeats=1, warmup=0, threads=1,
                          names=["lin", "tanh"])
    assert torch.get_num_threads() == before
    assert [l.name for l in chain.layers] == ["lin", "tanh"]
    assert chain.layers[1].saved_bytes == 2 * 4 * F32  # tanh saves its output


def test_spread_summary():
    s = [LayerTiming("a", (1.0, 2.0, 3.0), (1.0, 1.0, 1.0)), LayerTiming("b", (2.0, 2.0, 2.0), (1.0, 1.5, 2.0))]
    out = spread_summary(s)
    assert out["spread_forward"] == pytest.approx(0.5)  # median of 1.0 and 0.0
    assert out["spread_forward_max"] == pytest.approx(1.0)
    assert out["spread_backward_max"] == pytest.approx(1.0 / 1.5)


def test_the_loss_is_part_of_the_last_layer():
    with_loss = profile_zoo("tiny-gpt", 2, repeats=1, warmup=0)
    without = profile_zoo("tiny-gpt", 2, repeats=1, warmup=0, include_loss=False)
    head, head0 = with_loss.layers[-1], without.layers[-1]
    # cross-entropy saves the log-softmax of the logits: as many bytes as the head's output, and more
    assert head.saved_bytes - head0.saved_bytes >= head0.activation_bytes
    assert head.activation_bytes == head0.activation_bytes and head.weight_bytes == head0.weight_bytes
    assert [l.saved_bytes for l in with_loss.layers[:-1]] == [l.saved_bytes for l in without.layers[:-1]]
    assert with_loss.meta["loss"].startswith("in the last layer") and without.meta["loss"] == "not included"
    # by hand: a Linear to 3 classes, then the mean cross-entropy of 2 rows
    lin = nn.Linear(4, 3)
    chain = profile_model([lin], torch.ones(2, 4), repeats=1, warmup=0, loss=nn.functional.cross_entropy,
                          target=torch.tensor([0, 2]))
    # input (2x4) + log-softmax (2x3) in float32, the int64 target (2) and nll_loss's total weight (a scalar)
    assert chain.layers[0].saved_bytes == 2 * 4 * F32 + 2 * 3 * F32 + 2 * 8 + F32


def test_bad_arguments():
    with pytest.raises(ValueError, match="go together"):
        profile_model([nn.ReLU()], torch.zeros(1, 2), loss=nn.functional.mse_loss)
    with pytest.raises(ValueError, match="repeats"):
        profile_model([nn.ReLU()], torch.zeros(1, 2), repeats=0)
    with pytest.raises(ValueError, match="names"):
        profile_model([nn.ReLU()], torch.zeros(1, 2), names=["a", "b"])
    with pytest.raises(ValueError, match="empty"):
        profile_model([], torch.zeros(1, 2))

    class Two(nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(TypeError, match="one tensor"):
        profile_model([nn.Linear(2, 2), Two()], torch.zeros(1, 2), repeats=1)


def test_profile_zoo_round_trips_through_the_csv_format(tmp_path):
    chain = profile_zoo("tiny-gpt", 2, repeats=1, warmup=0, layers=3)
    assert len(chain) == 5 and chain.meta["network"] == "tiny-gpt" and '"layers":3' in chain.meta["model_config"]
    assert chain.meta["input_dtype"] == "int64" and chain.input_bytes == 2 * 16 * 8
    path = tmp_path / "p.csv"
    write_profile(chain, path)
    back = read_profile(path)
    assert [l.name for l in back.layers] == [l.name for l in chain.layers]
    assert list(back.saved_array) == list(chain.saved_array)
    assert back.layers[0].forward == pytest.approx(chain.layers[0].forward)
    assert back.meta["batch_size"] == "2" and back.input_bytes == chain.input_bytes


def test_profile_command(tmp_path, capsys):
    out = tmp_path / "mlp.csv"
    rc = main(["profile", "--model", "mlp", "--batch-size", "4", "--repeats", "2", "--warmup", "0",
               "--set", "sizes=(8, 16, 4)", "--out", str(out)])
    assert rc == 0
    chain = read_profile(out)
    assert [l.name for l in chain.layers] == ["fc1", "relu1", "fc2"]
    assert chain.layers[0].weight_bytes == (8 * 16 + 16) * F32
    assert chain.layers[1].saved_bytes == 4 * 16 * F32
    assert chain.meta["repeats"] == "2"
    text = capsys.readouterr().out
    assert "spread" in text and str(out) in text


def test_profile_command_refuses_bad_options(tmp_path, capsys):
    assert main(["profile", "--model", "mlp", "--set", "image_size=3", "--out", str(tmp_path / "x.csv")]) == 2
    assert "does not take" in capsys.readouterr().err
    assert main(["profile", "--model", "nope", "--out", str(tmp_path / "x.csv")]) == 2
    cpu = ["profile", "--model", "mlp", "--clock", "cpu"]
    assert main(cpu + ["--threads", "2", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--clock cpu" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()
    assert main(cpu + ["--repeats", "1", "--out", str(tmp_path / "c.csv")]) == 0
    assert "thread_time" in read_profile(tmp_path / "c.csv").meta["timing"]


# ---------------------------------------------------------------------------------------------
# precision: pure bf16
# ---------------------------------------------------------------------------------------------
BF16 = 2


def test_bf16_linear_relu_bytes_are_half_of_float32():
    b, i, h = 3, 5, 7
    model = nn.Sequential(nn.Linear(i, h), nn.ReLU())
    x = torch.randn(b, i)
    chain = profile_model(model, x, repeats=1, warmup=0, dtype="bfloat16")
    assert [l.saved_bytes for l in chain.layers] == [b * i * BF16, b * h * BF16]
    assert [l.activation_bytes for l in chain.layers] == [b * h * BF16, b * h * BF16]
    assert [l.weight_bytes for l in chain.layers] == [(i * h + h) * BF16, 0]
    assert chain.input_bytes == b * i * BF16
    assert chain.meta["dtype"] == "bfloat16" and chain.meta["input_dtype"] == "bfloat16"
    assert x.dtype == torch.float32                     # the caller's input is not cast in place
    # without dtype nothing is cast (the layers, cast above as modules are, run on a bf16 input)
    assert profile_model(model, x.bfloat16(), repeats=1, warmup=0).meta["dtype"] == "bfloat16"
    with pytest.raises(ModelFailure, match="layer 0 .Linear.'s forward") as e:   # ... a float32 input does not
        profile_model(model, x, repeats=1, warmup=0)                          # match them: torch says so
    assert isinstance(e.value.__cause__, RuntimeError) and "dtype" in str(e.value.__cause__)


def test_bf16_zoo_profile_halves_every_byte_column_but_token_ids():
    a = profile_zoo("tiny-gpt", 2, repeats=1, warmup=0)
    b = profile_zoo("tiny-gpt", 2, repeats=1, warmup=0, dtype=torch.bfloat16)
    assert a.meta["dtype"] == "float32" and b.meta["dtype"] == "bfloat16"
    assert b.meta["input_dtype"] == "int64" and b.input_bytes == a.input_bytes == 2 * 16 * 8
    for la, lb in zip(a.layers, b.layers):
        assert lb.weight_bytes * 2 == la.weight_bytes and lb.activation_bytes * 2 == la.activation_bytes, la.name
    # the embedding saves only its int64 ids; the blocks and the head save (about) half; the head's loss
    # saves float32 scalars (nll's total weight) whatever the dtype, so "about"
    assert b.layers[0].saved_bytes == a.layers[0].saved_bytes
    for la, lb in zip(a.layers[1:], b.layers[1:]):
        assert 0.5 <= lb.saved_bytes / la.saved_bytes < 0.52, la.name


def test_profile_command_dtype(tmp_path, capsys):
    out = tmp_path / "mlp-bf16.csv"
    assert main(["profile", "--model", "mlp", "--batch-size", "4", "--repeats", "1", "--warmup", "0",
                 "--set", "sizes=(8, 16, 4)", "--dtype", "bfloat16", "--out", str(out)]) == 0
    chain = read_profile(out)
    assert chain.meta["dtype"] == "bfloat16" and chain.layers[0].weight_bytes == (8 * 16 + 16) * BF16
    assert "bfloat16" in capsys.readouterr().out
    assert main(["profile", "--model", "mlp", "--dtype", "bf17", "--out", str(tmp_path / "x.csv")]) == 2


def test_a_profile_says_how_long_it_will_take_before_it_starts(tmp_path, capsys):
    """The estimate (one warm forward of the whole model times the runs the profile makes) comes first."""
    from workbench.front.cli import main

    assert main(["profile", "--model", "mlp", "--batch-size", "4", "--repeats", "3", "--warmup", "1",
                 "--out", str(tmp_path / "p.csv")]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("profiling 5 layers, 1 warm-up and 3 timed runs each, then their memory: about ")
    assert "one forward took" in first and out.index("about") < out.index("wrote")


def test_names_rename_the_shared_parameters_layers_too():
    import json

    lin = torch.nn.Linear(2, 2, bias=False)
    chain = profile_model([lin, lin], torch.zeros(1, 2), names=["first", "again"], repeats=1, warmup=0)
    assert json.loads(chain.meta["tied"])[0]["layers"] == ["first", "again"]
    assert [l.weight_bytes for l in chain.layers] == [16.0, 0.0]
