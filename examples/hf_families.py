"""Hugging Face families whose forward does more than hand one tensor from block to block, from their default
configurations made small (random weights, nothing is downloaded), each trained with what users train it with:

* ``qwen2_own_loss``: Qwen2 with Hugging Face's own loss (``labels=`` in the batch, ``out.loss``);
* ``gemma2``: Gemma 2 (its logits soft-capped after the head, its head tied to the embedding);
* ``t5``: T5, an encoder-decoder (the decoder attends to the encoder's output; a position bias computed
  from parameters reaches every block), with its own loss from ``labels=``;
* ``vit``: ``ViTForImageClassification`` as shipped (the class token picked between the final norm and
  the classifier);
* ``mixtral_router_loss``: Mixtral with its router's auxiliary loss (``output_router_logits``), added to
  its own loss; ``mixtral_router_loss_bf16`` builds it in bfloat16 (fake tensors need that for its
  grouped matrix products).

The workbench's first routes refuse each (docs/model.md, "Your own model"); it then cuts the model before
every block and every module after them (``torch.export``), and ``--split-at`` says where to cut instead:

    python -m workbench profile --module examples/hf_families.py:qwen2_own_loss --out build/qwen2.csv
    python -m workbench profile --module examples/hf_families.py:t5 --split-at encoder.block.1,decoder.block.0 \\
        --out build/t5.csv
    python -m workbench profile --module examples/hf_families.py:mixtral_router_loss_bf16 --fake --gpu h100-sxm \\
        --out build/mixtral.csv

Each function returns ``(model, example_inputs, example_targets, loss_fn)`` for ``--module``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers as tr  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from workbench.profiles.fake import default_dtype  # noqa: E402

BATCH, SEQUENCE, VOCAB = 2, 16, 512
#: the default configurations made small: 4 blocks of width 64 (T5: 2 + 2), each family's other defaults kept
DECODER = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=VOCAB, max_position_embeddings=64, use_cache=False)


def own_loss(out, targets):
    """The loss the model computed itself from ``labels=`` (with Mixtral: its router's auxiliary loss added)."""
    return out.loss


def lm_loss(out, targets):
    """Next-token cross-entropy of the logits, in float32."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def _tokens():
    return torch.randint(0, VOCAB, (BATCH, SEQUENCE))


def qwen2_own_loss():
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(**DECODER))
    ids = _tokens()
    return model, {"input_ids": ids, "labels": ids}, ids, own_loss


def gemma2():
    model = tr.Gemma2ForCausalLM(tr.Gemma2Config(**DECODER, head_dim=16))
    ids = _tokens()
    return model, ids, ids.roll(-1, 1), lm_loss


def t5():
    # decoder_start_token_id: 0, as in the published t5-small config.json (the default config has none)
    config = tr.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                         vocab_size=VOCAB, dropout_rate=0.0, use_cache=False, decoder_start_token_id=0)
    model = tr.T5ForConditionalGeneration(config)
    labels = torch.randint(0, VOCAB, (BATCH, SEQUENCE // 2))
    return model, {"input_ids": _tokens(), "labels": labels}, labels, own_loss


def vit():
    config = tr.ViTConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                          image_size=32, patch_size=8, num_labels=10)
    model = tr.ViTForImageClassification(config)
    images = torch.randn(BATCH, 3, 32, 32)
    return model, images, torch.randint(0, 10, (BATCH,)), lambda out, y: F.cross_entropy(out.logits, y)


def mixtral_router_loss():
    config = tr.MixtralConfig(**DECODER, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)
    model = tr.MixtralForCausalLM(config)
    ids = _tokens()
    return model, {"input_ids": ids, "labels": ids}, ids, own_loss


def mixtral_router_loss_bf16():
    with default_dtype(torch.bfloat16):
        return mixtral_router_loss()
