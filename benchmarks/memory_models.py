"""The Hugging Face models of ``benchmarks/memory.py --ranks``, built from their default configurations with
random weights (nothing is downloaded), at reduced sizes: GPT-2 and BERT with their LM heads tied to the
token embedding, and a Llama-style decoder with an untied head. Dropout is 0, so the runs' gradients are
checked against one process. Each function is a ``--module benchmarks/memory_models.py:NAME`` builder:
``(model, example_inputs, example_targets, loss_fn)``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

BATCH, SEQ = 4, 64


def lm_loss(out, targets):
    """Cross-entropy of the model's logits against the targets."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def gpt2_tied():
    """GPT-2 (its default configuration: tied LM head), 4 blocks of width 128, the full 50257-token vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=SEQ, use_cache=False,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    return GPT2LMHeadModel(cfg), ids, ids.roll(-1, 1), lm_loss


def bert_tied():
    """BERT for masked LM (its default configuration: decoder tied to the word embedding), 4 layers of width
    128, the full 30522-token vocabulary."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, intermediate_size=512,
                     max_position_embeddings=SEQ, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    return BertForMaskedLM(cfg), ids, ids, lm_loss


def llama_untied():
    """A Llama-style decoder (its default configuration: untied head), 4 layers of width 128, a 32000-token
    vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=4, hidden_size=128, intermediate_size=344, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=SEQ, use_cache=False)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    return LlamaForCausalLM(cfg), ids, ids.roll(-1, 1), lm_loss
