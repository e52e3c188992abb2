"""Tests for the model zoo (workbench.profiles.zoo)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from workbench.profiles import zoo

TINY = ["mlp", "tiny-resnet", "tiny-gpt"]


def test_registry_has_the_networks_and_descriptions():
    for name in ["resnet50", "resnet101", "vgg16", "gpt", *TINY]:
        assert name in zoo.MODELS
        assert zoo.MODELS[name].description
        assert zoo.MODELS[name].name == name


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_train_and_each_child_is_one_tensor_in_one_out(name):
    model = zoo.build_model(name)
    x, y = zoo.sample_batch(name, 3)
    assert tuple(x.shape) == zoo.input_shape(name, 3)
    h = x
    for child_name, child in model.named_children():
        assert child_name and not child_name.isdigit()
        h = child(h)
        assert isinstance(h, torch.Tensor), child_name
    loss = zoo.loss_fn(name)(h, y)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize("name", TINY)
def test_slices_compose_to_the_whole_model(name):
    model = zoo.build_model(name)
    x, _ = zoo.sample_batch(name, 4)
    whole = model(x)
    for k in range(1, len(model)):
        torch.testing.assert_close(model[k:](model[:k](x)), whole)


def test_initialisation_and_batches_are_deterministic():
    a, b, c = (zoo.build_model("tiny-gpt", seed=s) for s in (1, 1, 2))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))
    x1, y1 = zoo.sample_batch("tiny-resnet", 2, seed=5)
    x2, y2 = zoo.sample_batch("tiny-resnet", 2, seed=5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_parameter_counts_of_the_published_networks():
    # torchvision's counts at 1000 classes; no forward pass is run
    assert zoo.count_parameters(zoo.build_model("resnet50", num_classes=1000)) == 25_557_032
    assert zoo.count_parameters(zoo.build_model("resnet101", num_classes=1000)) == 44_549_160
    assert zoo.count_parameters(zoo.build_model("vgg16", num_classes=1000)) == 138_357_544


def test_layer_counts_and_names():
    r50 = [n for n, _ in zoo.build_model("resnet50").named_children()]
    assert len(r50) == 1 + 16 + 1 and r50[0] == "stem" and r50[-1] == "head" and "res5_3" in r50
    assert len(zoo.build_model("resnet101")) == 1 + 33 + 1
    vgg = [n for n, _ in zoo.build_model("vgg16", hidden=16, num_classes=10).named_children()]
    assert vgg[:2] == ["conv1_1", "conv1_2"] and vgg[-3:] == ["fc6", "fc7", "fc8"] and len(vgg) == 16


@pytest.mark.parametrize("layers,d,v,t", [(2, 32, 64, 16), (3, 48, 100, 8)])
def test_gpt_parameter_count_matches_formula(layers, d, v, t):
    model = zoo.build_model("gpt", layers=layers, d_model=d, heads=4 if d % 4 == 0 else 1, vocab=v, seq_len=t)
    per_block = 12 * d * d + 13 * d  # qkv 3d^2+3d, proj d^2+d, fc 4d^2+4d, fc_out 4d^2+d, two LayerNorms 4d
    expect = v * d + t * d + layers * per_block + 2 * d + d * v
    assert zoo.count_parameters(model) == expect
    assert len(model) == layers + 2


def test_gpt_loss_is_token_level_cross_entropy():
    model = zoo.build_model("tiny-gpt")
    x, y = zoo.sample_batch("tiny-gpt", 2)
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    out = model(x)
    assert out.shape == (2, 16, 64)
    manual = torch.stack([F.cross_entropy(out[b, i:i + 1], y[b, i:i + 1]) for b in range(2) for i in range(16)]).mean()
    torch.testing.assert_close(zoo.loss_fn("tiny-gpt")(out, y), manual)


def test_gpt_is_causal():
    model = zoo.build_model("tiny-gpt").eval()
    x, _ = zoo.sample_batch("tiny-gpt", 1)
    x2 = x.clone()
    x2[0, -1] = (x[0, -1] + 1) % 64
    torch.testing.assert_close(model(x)[0, :-1], model(x2)[0, :-1])


def test_small_images_for_the_big_networks():
    model = zoo.build_model("resnet50", num_classes=10)
    x, y = zoo.sample_batch("resnet50", 2, image_size=64, num_classes=10)
    assert model(x).shape == (2, 10) and int(y.max()) < 10
    vgg = zoo.build_model("vgg16", hidden=32, num_classes=10, pool=1)
    x, _ = zoo.sample_batch("vgg16", 2, image_size=32)
    assert vgg(x).shape == (2, 10)


def test_bad_names_and_options_are_refused():
    with pytest.raises(ValueError, match="unknown zoo model"):
        zoo.build_model("resnet9000")
    with pytest.raises(ValueError, match="does not take"):
        zoo.build_model("mlp", image_size=3)
    with pytest.raises(ValueError, match="does not take"):
        zoo.sample_batch("tiny-gpt", 2, image_size=3)
    with pytest.raises(ValueError, match="batch_size"):
        zoo.sample_batch("mlp", 0)
    with pytest.raises(ValueError, match="divisible"):
        zoo.build_model("gpt", layers=1, d_model=30, heads=4, vocab=10, seq_len=4)


# ---------------------------------------------------------------------------------------------
# precision (dtype)
# ---------------------------------------------------------------------------------------------
def test_as_dtype_names_and_refusals():
    assert zoo.as_dtype("bf16") is torch.bfloat16 and zoo.as_dtype("BFloat16") is torch.bfloat16
    assert zoo.as_dtype("torch.bfloat16") is torch.bfloat16 and zoo.as_dtype(torch.float16) is torch.float16
    assert zoo.as_dtype(None) is torch.float32 and zoo.as_dtype("fp32") is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        zoo.as_dtype("bfloat17")
    with pytest.raises(ValueError, match="not a floating"):
        zoo.as_dtype(torch.int64)


@pytest.mark.parametrize("name", TINY)
def test_bf16_models_are_the_float32_ones_rounded_and_token_ids_stay_integer(name):
    a, b = zoo.build_model(name, seed=3), zoo.build_model(name, seed=3, dtype="bfloat16")
    for (na, pa), (nb, pb) in zip(list(a.state_dict().items()), list(b.state_dict().items())):
        assert na == nb
        if pa.is_floating_point():
            assert pb.dtype == torch.bfloat16 and torch.equal(pb, pa.to(torch.bfloat16)), na
        else:                                   # e.g. BatchNorm's num_batches_tracked
            assert pb.dtype == pa.dtype
    (x, y), (xb, yb) = zoo.sample_batch(name, 3, seed=4), zoo.sample_batch(name, 3, seed=4, dtype=torch.bfloat16)
    assert torch.equal(y, yb) and yb.dtype == y.dtype     # targets are never cast
    if x.is_floating_point():
        assert xb.dtype == torch.bfloat16 and torch.equal(xb, x.to(torch.bfloat16))
    else:
        assert torch.equal(x, xb) and xb.dtype == torch.int64
    out = b(xb)
    assert out.dtype == torch.bfloat16 and torch.isfinite(zoo.loss_fn(name)(out, yb))
