"""ViT-H/14 from its public configuration (Dosovitskiy et al., "An Image is Worth 16x16 Words", Table 1:
ViT-Huge, 32 layers, hidden size 1280, MLP 5120, 16 heads; patches of 14 pixels), random weights.

Built from Hugging Face's ``ViTModel`` at 224 x 224 pixels with a 1000-class head over the class token,
bf16 weights (torch's default dtype set while building, which fake tensors need); a batch of 32 images,
cross-entropy in float32. Returns ``(model, example_inputs, example_targets, loss_fn)`` for ``--module``.
The head is one module that takes the class token itself (``ClassTokenHead``): Hugging Face's
``ViTForImageClassification`` indexes it between its final norm and its classifier, and the layer
discovery wants every module after the blocks fed the previous one's output.

    python -m workbench profile --module examples/vit.py:vit_h14 --fake --gpu h100-sxm --out build/vit-h14.csv
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import ViTConfig, ViTModel  # noqa: E402

from workbench.profiles.fake import default_dtype  # noqa: E402

BATCH = 32
IMAGE = 224
CLASSES = 1000


class ClassTokenHead(nn.Module):
    """The classifier over the class token (position 0) of the encoder's output."""

    def __init__(self, hidden, classes):
        super().__init__()
        self.fc = nn.Linear(hidden, classes)

    def forward(self, hidden_states):
        return self.fc(hidden_states[:, 0])


class ViTClassifier(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.vit = ViTModel(config, add_pooling_layer=False)
        self.head = ClassTokenHead(config.hidden_size, CLASSES)

    def forward(self, pixel_values):
        return self.head(self.vit(pixel_values).last_hidden_state)


def classification_loss(logits, targets):
    """Cross-entropy of the logits, computed in float32."""
    return F.cross_entropy(logits.float(), targets)


def vit_h14(batch=BATCH):
    config = ViTConfig(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, intermediate_size=5120,
                       image_size=IMAGE, patch_size=14, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with default_dtype(torch.bfloat16):
        model = ViTClassifier(config)
        images = torch.randn(batch, 3, IMAGE, IMAGE)
    return model, images, torch.randint(0, CLASSES, (batch,)), classification_loss
