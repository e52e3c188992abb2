"""Shard a model by its plan: torch's ``parallelize_module``, the attention's local head counts, ties kept.

:func:`shard_model` applies a :class:`~workbench.parallel.tensor.plan.TensorPlan`'s styles on a device mesh
(the parameters become ``DTensor``\\ s, each rank holding its shard), then does what torchtitan does for its
own model after ``parallelize_module``: each attention module's head counts become the local ones
(``num_heads``, ``num_key_value_heads``, ``n_heads``, ``n_kv_heads`` and, where an attention keeps it, its
``hidden_size``, GPT-2's ``split_size`` and ``embed_dim``, divided by ``tp``), for forwards that reshape
with them (Hugging Face's current Llama, Qwen2 and Mistral reshape with ``-1`` and need none of it; GPT-2
splits its fused query/key/value output by ``split_size``, which must be the local width). An LM head tied to
the embedding (both split over the vocabulary, ``Shard(0)`` of the same weight) stays tied: one parameter, as
before sharding.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from workbench.parallel.tensor.mesh import tp_mesh
>>> from workbench.parallel.tensor.plan import plan_model
>>> cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
>>> with tp_mesh(2) as mesh:
...     model = shard_model(LlamaForCausalLM(cfg), mesh, plan_model(LlamaForCausalLM(cfg), 2))
...     q = model.model.layers[0].self_attn.q_proj.weight
...     tuple(q.shape), tuple(q.to_local().shape), model.lm_head.weight is model.model.embed_tokens.weight
((64, 64), (32, 64), True)
"""

from __future__ import annotations

from torch import nn

from workbench.parallel.tensor.plan import TensorPlan

__all__ = ["shard_model", "LOCAL_ATTRIBUTES"]

#: attributes of an attention module that count heads (or their width) and become the local count
LOCAL_ATTRIBUTES = ("num_heads", "num_key_value_heads", "n_heads", "n_kv_heads", "hidden_size", "split_size",
                    "embed_dim")


def _tied(model: nn.Module, plan: TensorPlan) -> bool:
    if not (plan.embedding and plan.head):
        return False
    mods = dict(model.named_modules())
    return mods[plan.embedding].weight is mods[plan.head].weight


def shard_model(model: nn.Module, mesh: object, plan: TensorPlan) -> nn.Module:
    """``model`` sharded in place by ``plan`` on ``mesh`` (module docstring); returns it."""
    from torch.distributed.tensor.parallel import parallelize_module

    tied = _tied(model, plan)
    parallelize_module(model, mesh, plan.styles())
    mods = dict(model.named_modules())
    if tied:                                 # both Shard(0) of one weight: keep one parameter
        mods[plan.head].weight = mods[plan.embedding].weight
    for path in plan.attention:
        attention = mods[path]
        for name in LOCAL_ATTRIBUTES:
            value = getattr(attention, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value % plan.tp == 0:
                setattr(attention, name, value // plan.tp)
    return model
