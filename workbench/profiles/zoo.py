"""A small model zoo in plain ``torch.nn``: each model is a chain of layers.

Every model is a :class:`torch.nn.Sequential` whose children are the chain's
layers, in order, with readable names (``model.named_children()``). Each
child takes exactly one tensor and returns one tensor, so a runtime can cut
the sequence anywhere and pipe the pieces (``model[a:b]`` is again a
``Sequential``). Nothing is done in place on a layer's input and nothing is
shared between layers (no weight tying), so any slice is self-contained.

Models (``MODELS``): ``resnet50``, ``resnet101`` (stem, one layer per
bottleneck block, pool+fc head), ``vgg16`` (one layer per conv+relu[+pool],
then fc6, fc7, fc8), ``gpt`` (embedding, one layer per transformer block,
final norm+head), and tiny ones for tests: ``mlp``, ``tiny-resnet``,
``tiny-gpt``. Sizes are keyword arguments (see ``MODELS[name].defaults``);
the same keywords are accepted by :func:`build_model` and
:func:`sample_batch`, so one ``config`` dict can be passed to both.

Defaults are the published shapes (224x224 images, 1000 classes) but
dropout defaults to 0 so that runs are deterministic (pass ``dropout=0.5``
for the torchvision VGG classifier).

Precision: ``dtype`` (keyword of :func:`build_model` and :func:`sample_batch`,
a ``torch.dtype`` or a name such as ``"bfloat16"``/``"bf16"``; float32 by
default) makes a *pure* low-precision model: every parameter and buffer is
cast, and so are floating inputs; token ids stay integer and targets are
never cast. The same seed gives the float32 weights, rounded.

>>> import torch
>>> model = build_model("mlp")
>>> [n for n, _ in model.named_children()]
['fc1', 'relu1', 'fc2', 'relu2', 'fc3']
>>> x, y = sample_batch("mlp", 4)
>>> loss = loss_fn("mlp")(model(x), y)
>>> loss.dim()
0
>>> model[1:3](torch.zeros(4, 64)).shape      # any slice runs on its own
torch.Size([4, 64])
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "ModelSpec",
    "MODELS",
    "build_model",
    "sample_batch",
    "loss_fn",
    "model_config",
    "input_shape",
    "count_parameters",
    "as_dtype",
    "dtype_name",
    "Bottleneck",
    "TransformerBlock",
]


# --------------------------------------------------------------------------
# building blocks (each one tensor in, one tensor out)
# --------------------------------------------------------------------------
class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1, 3x3 (stride here), 1x1 convs with BN; identity or projection shortcut."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class _Head(nn.Module):
    """Global average pool, flatten, fully connected."""

    def __init__(self, in_ch: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TransformerBlock(nn.Module):
    """Pre-LN GPT block: causal self-attention and a 4x GELU MLP, both residual."""

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, t, d)), p, self.training)
        h = self.fc_out(F.gelu(self.fc(self.ln2(x))))
        return x + F.dropout(h, p, self.training)


class _Embedding(nn.Module):
    """Token + learned position embeddings: (B, T) int64 -> (B, T, D)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.pos.num_embeddings:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.pos.num_embeddings}")
        return self.tok(idx) + self.pos(torch.arange(t, device=idx.device))


class _LMHead(nn.Module):
    """Final LayerNorm and the vocabulary projection (not tied to the embedding)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


# --------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------
def _resnet(cfg: Mapping[str, Any]) -> nn.Sequential:
    w = int(cfg["width"])
    layers: dict[str, nn.Module] = {
        "stem": nn.Sequential(
            nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    }
    in_ch = w
    for stage, nblocks in enumerate(cfg["blocks"]):
        width = w * 2**stage
        for i in range(nblocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            layers[f"res{stage + 2}_{i + 1}"] = Bottleneck(in_ch, width, stride)
            in_ch = width * Bottleneck.expansion
    layers["head"] = _Head(in_ch, int(cfg["num_classes"]))
    return nn.Sequential(OrderedDict(layers))


_VGG16 = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]


def _vgg(cfg: Mapping[str, Any]) -> nn.Sequential:
    layers: dict[str, nn.Module] = {}
    in_ch = 3
    for s, stage in enumerate(cfg["channels"]):
        for i, ch in enumerate(stage):
            mods: list[nn.Module] = [nn.Conv2d(in_ch, ch, 3, padding=1), nn.ReLU()]
            if i == len(stage) - 1:
                mods.append(nn.MaxPool2d(2, 2))
            layers[f"conv{s + 1}_{i + 1}"] = nn.Sequential(*mods)
            in_ch = ch
    pool = int(cfg["pool"])
    hidden, p = int(cfg["hidden"]), float(cfg["dropout"])
    layers["fc6"] = nn.Sequential(nn.AdaptiveAvgPool2d(pool), nn.Flatten(), nn.Linear(in_ch * pool * pool, hidden),
                                  nn.ReLU(), nn.Dropout(p))
    layers["fc7"] = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(p))
    layers["fc8"] = nn.Linear(hidden, int(cfg["num_classes"]))
    return nn.Sequential(OrderedDict(layers))


def _gpt(cfg: Mapping[str, Any]) -> nn.Sequential:
    d, v, t = int(cfg["d_model"]), int(cfg["vocab"]), int(cfg["seq_len"])
    layers: dict[str, nn.Module] = {"embed": _Embedding(v, t, d)}
    for i in range(int(cfg["layers"])):
        layers[f"block{i}"] = TransformerBlock(d, int(cfg["heads"]), float(cfg["dropout"]))
    layers["head"] = _LMHead(d, v)
    model = nn.Sequential(OrderedDict(layers))
    for name, prm in model.named_parameters():  # GPT-2 style init
        if prm.dim() >= 2:
            nn.init.normal_(prm, 0.0, 0.02)
        elif name.endswith("bias"):
            nn.init.zeros_(prm)
    return model


def _mlp(cfg: Mapping[str, Any]) -> nn.Sequential:
    sizes = list(cfg["sizes"])
    layers: dict[str, nn.Module] = {}
    for i in range(len(sizes) - 1):
        layers[f"fc{i + 1}"] = nn.Linear(sizes[i], sizes[i + 1])
        if i < len(sizes) - 2:
            layers[f"relu{i + 1}"] = nn.ReLU()
    return nn.Sequential(OrderedDict(layers))


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------
def _image_batch(cfg: Mapping[str, Any], batch_size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    s = int(cfg["image_size"])
    return (torch.randn(batch_size, 3, s, s, generator=g),
            torch.randint(0, int(cfg["num_classes"]), (batch_size,), generator=g))


def _token_batch(cfg: Mapping[str, Any], batch_size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    v, t = int(cfg["vocab"]), int(cfg["seq_len"])
    seq = torch.randint(0, v, (batch_size, t + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def _vector_batch(cfg: Mapping[str, Any], batch_size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = list(cfg["sizes"])
    return torch.randn(batch_size, sizes[0], generator=g), torch.randint(0, sizes[-1], (batch_size,), generator=g)


def _ce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy; for sequence outputs (B, T, V) it is token-level over the vocabulary."""
    if output.dim() == 3:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def _image_shape(cfg: Mapping[str, Any]) -> tuple[int, ...]:
    return (3, int(cfg["image_size"]), int(cfg["image_size"]))


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: how to build the model, make a batch, and its loss.

    ``defaults`` lists every keyword the model accepts (``seed`` aside);
    ``input_shape(cfg)`` is the shape of one sample (no batch dimension).
    """

    name: str
    description: str
    builder: Callable[[Mapping[str, Any]], nn.Sequential] = field(repr=False)
    sampler: Callable[[Mapping[str, Any], int, torch.Generator], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    shape: Callable[[Mapping[str, Any]], tuple[int, ...]] = field(repr=False)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=_ce, repr=False)


_RESNET_DEFAULTS = {"image_size": 224, "num_classes": 1000, "width": 64}
_GPT_DEFAULTS = {"layers": 12, "d_model": 768, "heads": 12, "seq_len": 1024, "vocab": 50257, "dropout": 0.0}

MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec(
        "resnet50",
        "ResNet-50 (v1.5): stem, 16 bottleneck blocks, pool+fc head; 18 layers, 25.6M parameters at 1000 classes",
        _resnet, _image_batch, _image_shape, {**_RESNET_DEFAULTS, "blocks": (3, 4, 6, 3)}),
    "resnet101": ModelSpec(
        "resnet101",
        "ResNet-101 (v1.5): stem, 33 bottleneck blocks, pool+fc head; 35 layers, 44.5M parameters at 1000 classes",
        _resnet, _image_batch, _image_shape, {**_RESNET_DEFAULTS, "blocks": (3, 4, 23, 3)}),
    "vgg16": ModelSpec(
        "vgg16",
        "VGG-16: 13 conv+relu[+maxpool] layers, fc6 (adaptive pool to 7x7), fc7, fc8; "
        "138.4M parameters at 1000 classes",
        _vgg, _image_batch, _image_shape,
        {"image_size": 224, "num_classes": 1000, "channels": _VGG16, "hidden": 4096, "pool": 7, "dropout": 0.0}),
    "gpt": ModelSpec(
        "gpt",
        "GPT-style decoder (pre-LN, causal attention, 4x GELU MLP, untied head): embed, `layers` blocks, norm+head; "
        "defaults are GPT-2 small's shapes",
        _gpt, _token_batch, lambda c: (int(c["seq_len"]),), dict(_GPT_DEFAULTS)),
    "mlp": ModelSpec(
        "mlp", "tiny test model: Linear and ReLU as separate layers (sizes 32-64-64-10)",
        _mlp, _vector_batch, lambda c: (int(list(c["sizes"])[0]),), {"sizes": (32, 64, 64, 10)}),
    "tiny-resnet": ModelSpec(
        "tiny-resnet", "tiny test ResNet: width 8, one bottleneck per stage, 32x32 images, 10 classes",
        _resnet, _image_batch, _image_shape, {"image_size": 32, "num_classes": 10, "width": 8, "blocks": (1, 1, 1, 1)}),
    "tiny-gpt": ModelSpec(
        "tiny-gpt", "tiny test GPT: 2 blocks, width 32, 2 heads, 16 tokens, vocabulary 64",
        _gpt, _token_batch, lambda c: (int(c["seq_len"]),),
        {"layers": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 64, "dropout": 0.0}),
}


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}") from None


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
           "float64": torch.float64, "double": torch.float64}


def as_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """A floating ``torch.dtype`` from a dtype or its name (``"torch."`` prefix allowed); None is float32.

    >>> as_dtype("bf16"), as_dtype("torch.float32"), as_dtype(None)
    (torch.bfloat16, torch.float32, torch.float32)
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"{dtype} is not a floating dtype")
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    try:
        return _DTYPES[key]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(_DTYPES)}") from None


def dtype_name(dtype: str | torch.dtype | None) -> str:
    """The name of :func:`as_dtype`'s dtype, without ``"torch."``: what metadata and workloads record.

    >>> dtype_name("bf16"), dtype_name(torch.float32), dtype_name(None)
    ('bfloat16', 'float32', 'float32')
    """
    return str(as_dtype(dtype)).removeprefix("torch.")


def model_config(name: str, **kwargs: Any) -> dict[str, Any]:
    """The model's full configuration: its defaults updated with ``kwargs`` (``seed`` is ignored).

    >>> model_config("tiny-gpt", layers=4)["layers"]
    4
    """
    spec = _spec(name)
    kw = {k: v for k, v in kwargs.items() if k != "seed"}
    unknown = sorted(set(kw) - set(spec.defaults))
    if unknown:
        raise ValueError(f"model {name!r} does not take {unknown}; it takes {sorted(spec.defaults)} and seed")
    for key, value in kw.items():
        _check_option(name, key, value, spec.defaults[key])
    return {**spec.defaults, **kw}


def _check_option(name: str, key: str, value: Any, default: Any) -> None:
    """An option like its default: sizes and counts whole numbers of at least 1 (nested in lists too), a
    dropout rate in [0, 1).

    >>> _check_option("gpt", "layers", -1, 12)
    Traceback (most recent call last):
    ValueError: model 'gpt': layers=-1 is not a whole number of at least 1
    """
    from numbers import Integral, Real

    if isinstance(default, float):
        ok = isinstance(value, Real) and not isinstance(value, bool) and 0 <= value < 1
        if not ok:
            raise ValueError(f"model {name!r}: {key}={value!r} is not a rate in [0, 1)")
        return
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"model {name!r}: {key}={value!r} is not a whole number of at least 1")
        return
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"model {name!r}: {key}={value!r} is not a list like {list(default)!r}")
        for item, like in zip(value, list(default) * len(value)):
            _check_option(name, key, item, like)


def build_model(name: str, *, seed: int = 0, dtype: str | torch.dtype | None = None, **kwargs: Any) -> nn.Sequential:
    """Build zoo model ``name``; parameters are initialised (in float32) after ``torch.manual_seed(seed)``,
    then every parameter and buffer is cast to ``dtype`` (default float32: no cast).

    >>> m = build_model("tiny-resnet")
    >>> [n for n, _ in m.named_children()][:3]
    ['stem', 'res2_1', 'res3_1']
    >>> next(build_model("mlp", dtype="bfloat16").parameters()).dtype
    torch.bfloat16
    """
    cfg = model_config(name, **kwargs)
    dt = as_dtype(dtype)
    torch.manual_seed(seed)
    model = _spec(name).builder(cfg)
    return model if dt == torch.float32 else model.to(dt)


def sample_batch(name: str, batch_size: int, *, seed: int = 0, dtype: str | torch.dtype | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A random ``(input, target)`` batch for model ``name`` (same keywords as :func:`build_model`).

    Images are ``(B, 3, S, S)`` float32 (or ``dtype``: the float32 values,
    rounded) with class targets ``(B,)``; GPT inputs are token ids ``(B, T)``
    with next-token targets ``(B, T)``, whatever ``dtype``.

    >>> x, y = sample_batch("tiny-gpt", 2, dtype="bfloat16")
    >>> tuple(x.shape), tuple(y.shape), x.dtype
    ((2, 16), (2, 16), torch.int64)
    >>> sample_batch("mlp", 2, dtype="bfloat16")[0].dtype
    torch.bfloat16
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cfg = model_config(name, **kwargs)
    dt = as_dtype(dtype)
    g = torch.Generator().manual_seed(seed)
    x, y = _spec(name).sampler(cfg, batch_size, g)
    return (x.to(dt) if x.is_floating_point() else x), y


def input_shape(name: str, batch_size: int, **kwargs: Any) -> tuple[int, ...]:
    """Shape of a model's input batch, without building anything.

    >>> input_shape("resnet50", 8, image_size=96)
    (8, 3, 96, 96)
    """
    return (batch_size, *_spec(name).shape(model_config(name, **kwargs)))


def loss_fn(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss of model ``name``: ``loss(output, target) -> scalar`` (cross-entropy)."""
    return _spec(name).loss


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements.

    >>> count_parameters(build_model("mlp"))
    6922
    """
    return sum(p.numel() for p in model.parameters())
