"""Small Hugging Face decoders to run layouts on: a Llama (head tied or not) and a GPT-2 with its head tied.

:func:`hf_workload` builds ``LlamaForCausalLM`` or ``GPT2LMHeadModel`` from a shrunk default config
(nothing is downloaded) with dropout 0 and no key/value cache, and gives a fresh batch of random tokens per
mini-batch index (seeded by it), so that the ``dp`` replicas of a layout train on different data and the
gradient check against one process sees whether their gradients were reduced. The loss is the model's own
next-token cross-entropy on its logits.

>>> wl = hf_workload("gpt2", batch_size=2, sequence=8, layers=2, hidden=16, heads=2, vocab=32)
>>> wl.name, tuple(wl.batch(0)[0].shape), bool((wl.batch(0)[0] != wl.batch(1)[0]).any())
('gpt2', (2, 8), True)
>>> [t.parameter for t in wl.layers().tied]
['transformer.wte.weight']

:func:`workload_example` gives a workload as a ``--module`` build function returns it (the model, the first
mini-batch, the loss), for the per-rank profiles of :mod:`workbench.parallel.tensor`
(``partial(workload_example, wl)`` is picklable).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from torch.nn import functional as F

from workbench.profiles.workload import Workload

__all__ = ["hf_workload", "workload_example", "HF_KINDS"]

HF_KINDS = ("llama", "gpt2")


def _config(kind: str, sequence: int, layers: int, hidden: int, heads: int, kv_heads: int | None, vocab: int,
            mlp: int | None, tied: bool = False) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if kind == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp or 4 * hidden,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                           max_position_embeddings=sequence, tie_word_embeddings=tied, use_cache=False,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if kind == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(vocab_size=vocab, n_positions=sequence, n_embd=hidden, n_layer=layers, n_head=heads,
                          n_inner=mlp, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                          tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    raise ValueError(f"unknown decoder {kind!r}; known: {', '.join(HF_KINDS)}")


def _build(kind: str, seed: int, cfg: dict[str, Any]) -> torch.nn.Module:
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(seed)
    cls = LlamaForCausalLM if kind == "llama" else GPT2LMHeadModel
    return cls(_config(kind, **cfg)).train()


def _batch(batch_size: int, sequence: int, vocab: int, seed: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100003 + i + 1)
    ids = torch.randint(0, vocab, (batch_size, sequence + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _lm_loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def hf_workload(kind: str, batch_size: int = 2, sequence: int = 16, *, layers: int = 2, hidden: int = 64,
                heads: int = 4, kv_heads: int | None = None, vocab: int = 256, mlp: int | None = None,
                tied: bool = False, seed: int = 0) -> Workload:
    """A :class:`~workbench.profiles.workload.Workload` of a small ``kind`` decoder (see the module docstring);
    ``tied``: a Llama whose head is its embedding (GPT-2's always is)."""
    cfg = {"sequence": sequence, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
           "vocab": vocab, "mlp": mlp, **({"tied": True} if tied and kind == "llama" else {})}
    _config(kind, **cfg)           # refuses an unknown kind here, not in the ranks
    return Workload(partial(_build, kind, seed, cfg), partial(_batch, batch_size, sequence, vocab, seed), _lm_loss,
                    name=kind, batch_size=batch_size, config={"kind": kind, **cfg})


def workload_example(workload: Workload) -> tuple[torch.nn.Module, Any, Any, Any]:
    """(model, the first mini-batch's inputs and targets, loss) of ``workload`` (the module docstring)."""
    inputs, targets = workload.batch(0)
    return workload.build(), inputs, targets, workload.loss
