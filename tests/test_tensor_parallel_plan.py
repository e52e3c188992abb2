"""workbench.parallel.tensor.plan: which modules Megatron's split shards how, and the models it refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from workbench.parallel.tensor.plan import Sizes, check_sizes, plan_model


def _meta(cls, config):
    with torch.device("meta"):
        return cls(config)


def _llama(**kw):
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)
    return _meta(LlamaForCausalLM, LlamaConfig(**{**cfg, **kw}))


def test_llama_plan_splits_every_projection_of_every_block():
    plan = plan_model(_llama(), 2)
    for i in range(2):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        for name in ("q_proj", "k_proj", "v_proj"):
            assert f"{attn}.{name}" in plan.colwise
        for name in ("gate_proj", "up_proj"):
            assert f"{mlp}.{name}" in plan.colwise
        assert f"{attn}.o_proj" in plan.rowwise and f"{mlp}.down_proj" in plan.rowwise
        assert attn in plan.attention and mlp in plan.mlp
    assert len(plan.colwise) == 10 and len(plan.rowwise) == 4
    assert (plan.embedding, plan.head) == ("model.embed_tokens", "lm_head")
    assert plan.sizes == Sizes(4, 2, 64, 128, 256)
    assert plan.norms == ("model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                          "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm")


def test_styles_follow_megatron_and_sequence_parallelism():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    from workbench.parallel.tensor.styles import PrepareHiddenState

    styles = plan_model(_llama(), 2).styles()
    assert isinstance(styles["model.layers.0.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(styles["model.layers.0.mlp.down_proj"], RowwiseParallel)
    assert isinstance(styles["model.layers.0.self_attn"], PrepareHiddenState)
    assert styles["lm_head"].output_layouts == (Replicate(),)
    assert not any(isinstance(s, SequenceParallel) for s in styles.values())
    sp = plan_model(_llama(), 2, sequence_parallel=True, sequence=16).styles()
    assert isinstance(sp["model.norm"], SequenceParallel)
    assert sp["model.layers.1.self_attn.o_proj"].output_layouts == (Shard(1),)
    assert sp["model.embed_tokens"].output_layouts == (Shard(1),)
    lp = plan_model(_llama(), 2, loss_parallel=True).styles()
    assert lp["lm_head"].output_layouts == (Shard(-1),) and not lp["lm_head"].use_local_output


def test_sizes_tp_does_not_divide_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's key/value heads \(2\)"):
        plan_model(_llama(), 4)
    with pytest.raises(ValueError, match=r"query heads \(3\), key/value heads \(3\), vocabulary \(255\); sizes: "
                                         r".*pad the vocabulary"):
        plan_model(_llama(num_attention_heads=3, num_key_value_heads=3, hidden_size=66, vocab_size=255), 2)
    with pytest.raises(ValueError, match=r"divide the model's hidden \(63\); sizes: query heads 4"):
        check_sizes(Sizes(4, 4, 63, 128, 256), 2)      # Hugging Face refuses such a config itself
    with pytest.raises(ValueError, match=r"sequence length \(15, split under sequence parallelism\)"):
        plan_model(_llama(), 2, sequence_parallel=True, sequence=15)
    plan_model(_llama(), 2, sequence=15)           # without sequence parallelism the sequence is not split
    with pytest.raises(ValueError, match="tp must be a whole number"):
        check_sizes(Sizes(4, 4, 4, 4, 4), 0)


def test_error_is_one_line():
    with pytest.raises(ValueError) as e:
        plan_model(_llama(), 8)
    assert "\n" not in str(e.value)


def _gpt2(**kw):
    return _meta(GPT2LMHeadModel, GPT2Config(**{**dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4), **kw}))


def test_gpt2_splits_as_megatrons_gpt():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    from workbench.parallel.tensor.styles import (
        Conv1DColwise,
        Conv1DRowwise,
        PrepareHiddenState,
        VocabParallelEmbedding,
    )

    plan = plan_model(_gpt2(), 2)
    blocks = [f"transformer.h.{i}" for i in range(2)]
    assert plan.colwise == tuple(f"{b}.{n}" for b in blocks for n in ("attn.c_attn", "mlp.c_fc"))
    assert plan.rowwise == tuple(f"{b}.{n}" for b in blocks for n in ("attn.c_proj", "mlp.c_proj"))
    assert plan.fused == tuple(f"{b}.attn.c_attn" for b in blocks)
    assert set(plan.conv1d) == set(plan.colwise + plan.rowwise)
    assert plan.attention == tuple(f"{b}.attn" for b in blocks) and plan.mlp == tuple(f"{b}.mlp" for b in blocks)
    assert (plan.embedding, plan.head) == ("transformer.wte", "lm_head")      # wpe: whole on every rank
    assert plan.sizes == Sizes(4, 4, 64, 256, 128)
    assert plan.permuted() == {f"{b}.attn.c_attn.{p}": (d, 3) for b in blocks
                               for p, d in (("weight", 1), ("bias", 0))}
    styles = plan.styles()
    qkv = styles["transformer.h.0.attn.c_attn"]
    assert isinstance(qkv, Conv1DColwise) and qkv.parts == 3 and styles["transformer.h.1.mlp.c_fc"].parts == 1
    assert isinstance(styles["transformer.h.1.mlp.c_proj"], Conv1DRowwise)
    assert isinstance(styles["transformer.h.0.attn"], PrepareHiddenState)
    assert type(styles["lm_head"]) is ColwiseParallel and type(styles["transformer.wte"]) is VocabParallelEmbedding
    assert "transformer.wpe" not in styles and "fused query/key/value" in plan.describe()
    sp = plan_model(_gpt2(), 2, sequence_parallel=True, sequence=16)
    assert sp.norms == tuple(f"{b}.{n}" for b in blocks for n in ("ln_1", "ln_2")) + ("transformer.ln_f",)
    assert sp.sequence_scatter == plan.sequence_scatter == "transformer.drop"      # after the learned positions
    sp_styles = sp.styles()
    assert sp_styles["transformer.wte"].output_layouts == (Replicate(),)
    assert sp_styles["transformer.drop"].desired_output_layouts == (Shard(1),)
    assert "transformer.drop" not in styles and _llama_plan_has_no_scatter()


def _llama_plan_has_no_scatter() -> bool:
    return plan_model(_llama(), 2, sequence_parallel=True, sequence=16).sequence_scatter is None


def test_gpt2_sizes_tp_does_not_divide_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"tp=2 does not divide the model's vocabulary \(50257\); sizes: query "
                                         r"heads 12, key/value heads 12, hidden 768, intermediate 3072, vocabulary "
                                         r"50257; pad"):
        plan_model(_meta(GPT2LMHeadModel, GPT2Config(n_layer=2)), 2)           # GPT-2's default config
    with pytest.raises(ValueError, match=r"tp=8 does not divide the model's query heads \(4\), key/value heads "
                                         r"\(4\)"):
        plan_model(_gpt2(), 8)
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's query heads \(6\), key/value heads "
                                         r"\(6\); sizes: query heads 6, key/value heads 6, hidden 96,"):
        plan_model(_gpt2(n_embd=96, n_head=6), 4)
    plan_model(_meta(GPT2LMHeadModel, GPT2Config(n_layer=2, vocab_size=50304)), 4)     # padded as Megatron pads it


def test_other_fused_projections_are_refused_clearly():
    with pytest.raises(ValueError, match=r"transformer.h.0.crossattention.c_attn \(Conv1D\) is a fused "
                                         r"projection"):
        plan_model(_gpt2(add_cross_attention=True), 2)

    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj, self.o_proj = nn.Linear(8, 24), nn.Linear(8, 8)

    with pytest.raises(ValueError, match=r"qkv_proj \(Linear\) is a fused projection"):
        plan_model(Fused(), 2)


def test_models_without_attention_or_with_other_layers_are_refused():
    with pytest.raises(ValueError, match="no attention projections"):
        plan_model(nn.Sequential(nn.Linear(4, 4)), 2)

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Conv1d(4, 4, 1)

    with pytest.raises(ValueError, match=r"q_proj is a Conv1d, not an nn.Linear"):
        plan_model(Odd(), 2)


@pytest.mark.parametrize("cls, config", [(Qwen2ForCausalLM, Qwen2Config), (MistralForCausalLM, MistralConfig)])
def test_default_configs_of_other_llama_style_models_plan(cls, config):
    model = _meta(cls, config(num_hidden_layers=2))
    cfg = model.config
    plan = plan_model(model, 8)
    assert plan.sizes == Sizes(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size,
                               cfg.intermediate_size, cfg.vocab_size)
    assert len(plan.colwise) == 10 and len(plan.rowwise) == 4


def test_torchtitan_names_and_attention_attributes():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads, self.n_kv_heads = 4, 2
            self.wq, self.wk, self.wv, self.wo = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4), nn.Linear(8, 8)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.feed_forward = nn.Module()
            self.feed_forward.w1, self.feed_forward.w3 = nn.Linear(8, 16), nn.Linear(8, 16)
            self.feed_forward.w2 = nn.Linear(16, 8)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(32, 8)
            self.layers = nn.ModuleList([Block(), Block()])
            self.output = nn.Linear(8, 32)

    plan = plan_model(Model(), 2)
    assert plan.sizes == Sizes(4, 2, 8, 16, 32)
    assert "layers.0.attention.wq" in plan.colwise and "layers.1.feed_forward.w2" in plan.rowwise
    assert (plan.embedding, plan.head) == ("tok_embeddings", "output")
    with pytest.raises(ValueError, match=r"key/value heads \(2\)"):
        plan_model(Model(), 4)
