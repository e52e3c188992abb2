"""Small decoders to try layouts on this machine's CPU ranks in seconds: a Llama (untied head, grouped-query
attention) and a GPT-2 (its head tied to the token embedding), from Hugging Face configurations made small,
random weights (nothing is downloaded), float32, no dropout (so that a run's gradients equal one process's).
Their sizes are ones tensor parallelism divides for tp = 1, 2, 4 (heads, key/value heads, widths, vocabulary).

    python -m workbench plan --module examples/small.py:llama --fake --gpu h100-sxm --devices 4 --global-batch 8 \\
        --parallel tp=2,pp=2,dp=1 --json build/small.json
    python -m workbench run build/small.json --steps 4 --out build/small-run

Each function returns ``(model, example_inputs, example_targets, loss_fn)`` for ``--module``; ``batch_size`` lets
``plan --parallel auto`` try other micro-batch sizes.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

SEQUENCE, VOCAB = 32, 256


def lm_loss(out, targets):
    """Next-token cross-entropy of the logits."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def _tokens(batch_size):
    ids = torch.randint(0, VOCAB, (batch_size, SEQUENCE))
    return ids, ids.roll(-1, 1)


def llama(batch_size=2):
    """4 Llama blocks of width 64 (4 query heads, 4 key/value heads), MLP 128, vocabulary 256."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         tie_word_embeddings=False, use_cache=False)
    model = LlamaForCausalLM(config)
    ids, targets = _tokens(batch_size)
    return model, ids, targets, lm_loss


def gpt2(batch_size=2):
    """4 GPT-2 blocks of width 64 (4 heads), vocabulary 256, its head tied to the token embedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = GPT2LMHeadModel(config)
    ids, targets = _tokens(batch_size)
    return model, ids, targets, lm_loss
