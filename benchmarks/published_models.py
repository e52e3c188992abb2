"""The models of the published training rows of ``benchmarks/published_rows.py``, as ``--module`` builders.

Random weights, bf16 (torch's default dtype set, not ``model.to``: fake tensors), the model's next-token
cross-entropy in float32; each builder takes ``batch_size`` (the micro-batch) so ``plan --parallel`` and the
layout evaluator profile the rows' micro-batch sizes. This file holds builders only: the profiles of
``plan --parallel`` are cached by this file's bytes.

* ``llama31_8b_8192``: Llama-3.1-8B (Meta's published shapes: hidden 4096, MLP 14336, 32 layers, 32 heads, 8
  key/value heads, vocabulary 128256, RoPE theta 500000), 8192 tokens, and ``llama3_70b_8192`` (hidden 8192, MLP
  28672, 80 layers, 64 heads, 8 key/value heads): torchtitan's rows;
* ``mpt_<size>_<sequence>``: MosaicML's MPT models of llm-foundry's ``scripts/train/yamls/pretrain/mpt-<size>.yaml``
  (``d_model``, ``n_heads``, ``n_layers``, ``expansion_ratio`` 4, vocabulary 50368, the output tied to the
  embedding), built as Hugging Face's GPT-2: LayerNorm, a GELU MLP of 4 d, attention through
  ``scaled_dot_product_attention``, learned positions of the sequence length (the benchmark table's ``NumParams``
  grows with the sequence by ``d_model`` a position, so those runs learned theirs); MPT has no biases, GPT-2's
  are kept (a bias add per linear layer);
* ``nemotron4_15b_4096``: NVIDIA's Nemotron-4 15B as NeMo-Framework-Launcher's
  ``launcher_scripts/conf/training/nemotron/nemotron_15b.yaml`` has it (32 layers, hidden 6144, MLP 24576 with
  squared ReLU and no gate, 48 heads, 8 query groups, LayerNorm1p, rotary embedding on half of each head, no
  biases, untied output, vocabulary 256000), built as Hugging Face's ``NemotronForCausalLM`` (whose default
  config is this model but for its key/value heads), 4096 tokens;
* ``llama3_70b_4096``: Llama-3-70B's shapes at 4096 tokens (NeMo's fine-tuning rows).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from workbench.profiles.fake import default_dtype  # noqa: E402

#: llm-foundry's MPT shapes: size -> (d_model, n_heads, n_layers) (scripts/train/yamls/pretrain/mpt-<size>.yaml)
MPT = {"7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}
MPT_VOCAB = 50368


def lm_loss(out, targets):
    """Next-token cross-entropy of the logits, computed in float32."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def _inputs(vocab, batch, sequence):
    ids = torch.randint(0, vocab, (batch, sequence))
    return ids, ids.roll(-1, 1)


def llama31_8b(sequence, batch):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=sequence,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False)
    with default_dtype(torch.bfloat16):
        model = LlamaForCausalLM(config)
    return (model, *_inputs(128256, batch, sequence), lm_loss)


def mpt(size, sequence, batch):
    from transformers import GPT2Config, GPT2LMHeadModel

    d, heads, layers = MPT[size]
    config = GPT2Config(vocab_size=MPT_VOCAB, n_positions=sequence, n_embd=d, n_layer=layers, n_head=heads,
                        n_inner=4 * d, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        tie_word_embeddings=True, use_cache=False, attn_implementation="sdpa")
    with default_dtype(torch.bfloat16):
        model = GPT2LMHeadModel(config)
    return (model, *_inputs(MPT_VOCAB, batch, sequence), lm_loss)


def llama31_8b_8192(batch_size=2):
    return llama31_8b(8192, batch_size)


def mpt_7b_2048(batch_size=1):
    return mpt("7b", 2048, batch_size)


def mpt_13b_2048(batch_size=1):
    return mpt("13b", 2048, batch_size)


def mpt_30b_2048(batch_size=1):
    return mpt("30b", 2048, batch_size)


def mpt_70b_2048(batch_size=1):
    return mpt("70b", 2048, batch_size)


def llama3_70b(sequence, batch):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=sequence,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False)
    with default_dtype(torch.bfloat16):
        model = LlamaForCausalLM(config)
    return (model, *_inputs(128256, batch, sequence), lm_loss)


def llama3_70b_8192(batch_size=1):
    return llama3_70b(8192, batch_size)


def llama3_70b_4096(batch_size=1):
    return llama3_70b(4096, batch_size)


def nemotron4(sequence, batch):
    from transformers import NemotronConfig, NemotronForCausalLM

    config = NemotronConfig(vocab_size=256000, hidden_size=6144, intermediate_size=24576, num_hidden_layers=32,
                            num_attention_heads=48, num_key_value_heads=8, hidden_act="relu2",
                            max_position_embeddings=sequence, tie_word_embeddings=False, use_cache=False)
    with default_dtype(torch.bfloat16):
        model = NemotronForCausalLM(config)
    return (model, *_inputs(256000, batch, sequence), lm_loss)


def nemotron4_15b_4096(batch_size=1):
    return nemotron4(4096, batch_size)
