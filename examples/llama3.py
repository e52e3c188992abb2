"""Llama-3 8B and 70B from their public configurations, random weights (nothing is downloaded).

The numbers are those of Meta's published ``config.json`` files for Meta-Llama-3-8B and
Meta-Llama-3-70B (hidden size, MLP size, layers, heads, key/value heads, vocabulary, RoPE theta,
context). Each function returns ``(model, example_inputs, example_targets, loss_fn)`` for
``--module``: one sequence of 2048 tokens (``batch_size`` of them: ``plan --parallel auto`` profiles other
micro-batch sizes), next-token cross-entropy (in float32), bf16 weights.

    python -m workbench profile --module examples/llama3.py:llama3_8b --fake --gpu h100-sxm --out build/llama3-8b.csv

A 70B model does not fit in this machine's memory: profile it with ``--fake`` (fake tensors
allocate nothing). The model is built with torch's default dtype set to bfloat16, not with
``model.to(torch.bfloat16)``, which fails under fake tensors.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from workbench.profiles.fake import default_dtype  # noqa: E402

SEQUENCE = 2048
BATCH = 1
VOCAB = 128256
#: name -> (hidden size, MLP size, layers, attention heads, key/value heads)
SHAPES = {"8b": (4096, 14336, 32, 32, 8), "70b": (8192, 28672, 80, 64, 8)}


def lm_loss(out, targets):
    """Next-token cross-entropy of the logits, computed in float32."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def llama3(size, sequence=SEQUENCE, batch=BATCH, layers=None):
    hidden, mlp, n_layers, heads, kv_heads = SHAPES[size]
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp,
                         num_hidden_layers=layers or n_layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=8192, rope_theta=500000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False,
                         bos_token_id=128000, eos_token_id=128001)
    with default_dtype(torch.bfloat16):
        model = LlamaForCausalLM(config)
    ids = torch.randint(0, VOCAB, (batch, sequence))
    return model, ids, ids.roll(-1, 1), lm_loss


def llama3_8b(batch_size=BATCH):
    return llama3("8b", batch=batch_size)


def llama3_70b(batch_size=BATCH):
    return llama3("70b", batch=batch_size)


def llama3_8b_2_layers():
    """Llama-3-8B's widths and vocabulary with 2 of its 32 blocks: a quick look (notebook 09's quick setting)."""
    return llama3("8b", layers=2)


def llama3_70b_2_layers(batch_size=BATCH):
    """Llama-3-70B's widths and vocabulary with 2 of its 80 blocks (its blocks are identical: notebook 09 repeats
    the second to make the 80-block chain, ``workbench.parallel.profiles.repeat_blocks``)."""
    return llama3("70b", batch=batch_size, layers=2)


def llama3_70b_2_layers_8k(batch_size=BATCH):
    """As :func:`llama3_70b_2_layers` with sequences of 8192 tokens (torchtitan's Llama-3-70B runs)."""
    return llama3("70b", sequence=8192, batch=batch_size, layers=2)
