"""ViT-H/14 from its public configuration (Dosovitskiy et al., "An Image is Worth 16x16 Words", Table 1:
ViT-Huge, 32 layers, hidden size 1280, MLP 5120, 16 heads; patches of 14 pixels), random weights.

Built as a Hugging Face ``ViTForImageClassification`` at 224 x 224 pixels with 1000 classes, bf16
weights (torch's default dtype set while building, which fake tensors need); a batch of 32 images,
cross-entropy in float32. Returns ``(model, example_inputs, example_targets, loss_fn)`` for ``--module``.

    python -m workbench profile --module examples/vit.py:vit_h14 --fake --gpu h100-sxm --out vit-h14.csv
"""

import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import ViTConfig, ViTForImageClassification  # noqa: E402

BATCH = 32
IMAGE = 224
CLASSES = 1000


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def classification_loss(out, targets):
    """Cross-entropy of the logits, computed in float32."""
    return F.cross_entropy(out.logits.float(), targets)


def vit_h14(batch=BATCH):
    config = ViTConfig(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, intermediate_size=5120,
                       image_size=IMAGE, patch_size=14, num_labels=CLASSES, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    with default_dtype(torch.bfloat16):
        model = ViTForImageClassification(config)
        images = torch.randn(batch, 3, IMAGE, IMAGE)
    return model, images, torch.randint(0, CLASSES, (batch,)), classification_loss
