"""The small decoders tensor parallelism is checked on: Hugging Face's Llama and GPT-2, 2 blocks of hidden 64.

Issue 37's fake-against-real check profiles it under fake tensors and on real gloo ranks
(:mod:`~workbench.parallel.tensor.real`): a ``LlamaForCausalLM`` from a config (random weights, nothing
downloaded), 4 query heads and 2 key/value heads (grouped-query attention, as Llama 3), MLP 128, vocabulary
256, a batch of 2 sequences of 16 tokens, next-token cross-entropy; ``build(**sizes)`` returns what
``--module`` functions return. :func:`tiny_gpt2` is a ``GPT2LMHeadModel`` of the same sizes (4 heads, MLP 256
as GPT-2's 4 x hidden, vocabulary 128, learned positions), its head tied to its token embedding as GPT-2's
always is, dropout 0.

>>> model, ids, targets, loss = tiny_llama()
>>> sum(p.numel() for p in model.parameters()), tuple(ids.shape)
(106816, (2, 16))
>>> model, ids, targets, loss = tiny_gpt2()
>>> sum(p.numel() for p in model.parameters()), model.lm_head.weight is model.transformer.wte.weight
(116480, True)
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
from torch.nn import functional as F

__all__ = ["tiny_llama", "tiny_gpt2", "lm_loss"]


def lm_loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a causal LM's logits, in float32."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def tiny_llama(batch_size: int = 2, sequence: int = 16, *, layers: int = 2, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, intermediate: int = 128, vocab: int = 256,
               tie: bool = False) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    """(model, token ids, targets, loss) of the small Llama (module docstring); ``tie`` ties its head."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max(sequence, 128), use_cache=False, tie_word_embeddings=tie)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, vocab, (batch_size, sequence))
    return model, ids, ids.roll(-1, 1), lm_loss


def tiny_gpt2(batch_size: int = 2, sequence: int = 16, *, layers: int = 2, hidden: int = 64, heads: int = 4,
              vocab: int = 128) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    """(model, token ids, targets, loss) of the small GPT-2 (module docstring), its head tied."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab, n_positions=max(sequence, 128), n_embd=hidden, n_layer=layers,
                        n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, vocab, (batch_size, sequence))
    return model, ids, ids.roll(-1, 1), lm_loss
