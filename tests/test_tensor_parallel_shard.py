"""workbench.parallel.tensor.shard: each rank's parameters are its shard, local head counts, ties kept."""

from __future__ import annotations

import pytest
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.parallel.tensor.mesh import tp_mesh
from workbench.parallel.tensor.plan import plan_model
from workbench.parallel.tensor.shard import shard_model


def _llama(tie=False):
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tp", [1, 2])
def test_each_parameter_is_its_shard(tp):
    model = _llama()
    whole = {n: tuple(p.shape) for n, p in model.named_parameters()}
    with tp_mesh(tp) as mesh:
        shard_model(model, mesh, plan_model(model, tp))
        local = {n: tuple(p.to_local().shape) if isinstance(p, DTensor) else tuple(p.shape)
                 for n, p in model.named_parameters()}
    for name, shape in whole.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                          "embed_tokens.weight", "lm_head.weight")):
            assert local[name] == (shape[0] // tp, shape[1]), name         # rows: output features, vocabulary
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert local[name] == (shape[0], shape[1] // tp), name         # columns: input features
        else:
            assert local[name] == shape, name                               # norms: whole on every rank


def test_tied_head_stays_one_parameter():
    model = _llama(tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with tp_mesh(2) as mesh:
        shard_model(model, mesh, plan_model(model, 2))
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert tuple(model.lm_head.weight.to_local().shape) == (128, 64)


def test_attention_head_counts_become_local():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads, self.n_kv_heads, self.hidden_size, self.dropout = 4, 2, 8, 3
            self.wq, self.wk, self.wv, self.wo = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4), nn.Linear(8, 8)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Module(), nn.Module()])
            for block in self.layers:
                block.attention = Attention()
                block.feed_forward = nn.Module()
                block.feed_forward.w1, block.feed_forward.w3 = nn.Linear(8, 16), nn.Linear(8, 16)
                block.feed_forward.w2 = nn.Linear(16, 8)

    model = Model()
    with tp_mesh(2) as mesh:
        shard_model(model, mesh, plan_model(model, 2))
    attention = model.layers[1].attention
    assert (attention.n_heads, attention.n_kv_heads, attention.hidden_size, attention.dropout) == (2, 1, 4, 3)


def test_gpt2_holds_its_heads_and_keeps_its_head_tied():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=32))
    whole = {n: tuple(p.shape) for n, p in model.named_parameters()}
    with tp_mesh(2) as mesh:
        shard_model(model, mesh, plan_model(model, 2))
        local = {n: tuple(p.to_local().shape) if isinstance(p, DTensor) else tuple(p.shape)
                 for n, p in model.named_parameters()}
        assert model.lm_head.weight is model.transformer.wte.weight
    for name, shape in whole.items():
        if name.endswith(("c_attn.weight", "c_fc.weight")):                    # Conv1D [in, out]: columns
            assert local[name] == (shape[0], shape[1] // 2), name
        elif name.endswith(("c_attn.bias", "c_fc.bias", "wte.weight")):
            assert local[name] == (shape[0] // 2, *shape[1:]), name
        elif name.endswith("c_proj.weight"):                                  # rows: input features
            assert local[name] == (shape[0] // 2, shape[1]), name
        else:                                                                   # wpe, norms, row-wise biases
            assert local[name] == shape, name
    attention = model.transformer.h[1].attn
    assert (attention.num_heads, attention.split_size, attention.embed_dim, attention.head_dim) == (2, 32, 32, 16)
