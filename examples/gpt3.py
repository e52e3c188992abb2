"""GPT-3-shaped decoders (1.3B, 6.7B, 13B) from the GPT-3 paper's Table 2.1, random weights.

Brown et al., "Language Models are Few-Shot Learners" (2020), Table 2.1: layers, d_model and heads
of GPT-3 XL (1.3B), 6.7B and 13B, context 2048, GPT-2's 50257-token vocabulary. Built as Hugging
Face GPT-2 models (dense attention throughout, where GPT-3 alternates dense and locally banded
sparse layers; the token embedding and the LM head are tied, as in GPT-2). The 13B model's
d_model is 5120 (40 heads of 128): the table prints 5140, which 40 heads of 128 do not make.
Each function returns ``(model, example_inputs, example_targets, loss_fn)`` for ``--module``:
one sequence of 2048 tokens, bf16 weights (built with torch's default dtype set, which fake
tensors need), the loss in float32.

    python -m workbench profile --module examples/gpt3.py:gpt3_6_7b --fake --gpu a100-80gb --out build/gpt3-6.7b.csv
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from workbench.profiles.fake import default_dtype  # noqa: E402

SEQUENCE = 2048
VOCAB = 50257
#: name -> (layers, d_model, heads)
SHAPES = {"1.3b": (24, 2048, 16), "6.7b": (32, 4096, 32), "13b": (40, 5120, 40)}


def lm_loss(out, targets):
    """Next-token cross-entropy of the logits, computed in float32."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def gpt3(size, sequence=SEQUENCE, batch=1):
    layers, width, heads = SHAPES[size]
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=SEQUENCE, vocab_size=VOCAB,
                        bos_token_id=50256, eos_token_id=50256, use_cache=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with default_dtype(torch.bfloat16):
        model = GPT2LMHeadModel(config)
    ids = torch.randint(0, VOCAB, (batch, sequence))
    return model, ids, ids.roll(-1, 1), lm_loss


def gpt3_1_3b():
    return gpt3("1.3b")


def gpt3_6_7b():
    return gpt3("6.7b")


def gpt3_13b():
    return gpt3("13b")
