"""workbench.parallel.run.rank: a GPT-2 whose head is tied to its embedding, the two on different pipeline
ranks, keeps the copies tied (Megatron's embedding group) under DDP and FSDP2, and both equal one process."""

import pytest
import torch

from layout_runs import layout_config, sgd_reference, tiny_gpt2
from workbench.model.layout import Layout
from workbench.parallel.run.launch import layout_gradient_errors, run_layout
from workbench.parallel.run.summary import tied_copies_equal
from workbench.parallel.run.tensor import tensor_parallel_plan
from workbench.parallel.run.workloads import hf_workload

TIED = "transformer.wte.weight"


@pytest.mark.parametrize("zero", [0, 3])
def test_tied_embedding_and_head_on_two_pipeline_ranks_stay_tied(zero):
    lr = 0.5
    cfg = layout_config(tiny_gpt2(), Layout(pp=2, dp=2, zero=zero), cuts=[2], optimizer="sgd", lr=lr, extra_steps=1)
    parts = run_layout(cfg)
    holders = [p for p in parts if TIED in p["tied"]]
    assert sorted(p["coords"][:2] for p in holders) == [(0, 0), (0, 1), (1, 0), (1, 1)]    # every copy, every replica
    assert tied_copies_equal(parts) == {TIED: True}
    # the first step's gradients (at the initial weights) against one process
    _, rel = layout_gradient_errors(parts, cfg.workload, cfg.layout, cfg.micro_batches, say=lambda *a, **k: None)
    assert rel < 1e-4
    # the weights after every step against one process's SGD on the same mini-batches
    steps = parts[0]["optimizer_steps"]
    assert steps == (4 if zero == 0 else 3)        # DDP: one more step before the measured one
    ref = sgd_reference(cfg.workload, dp=2, micro_batches=cfg.micro_batches, steps=steps, lr=lr)
    for p in holders:
        w = p["tied"][TIED]["weight"]
        assert not torch.equal(w, cfg.workload.build().get_parameter(TIED).detach())    # it did move
        torch.testing.assert_close(w, ref[TIED], rtol=1e-5, atol=1e-6)


needs_tp = pytest.mark.skipif(tensor_parallel_plan() is None, reason="this build has no tensor-parallel sharding plan")


def _tied_llama():
    return hf_workload("llama", batch_size=2, sequence=8, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, tied=True)


@needs_tp
@pytest.mark.parametrize("layout", [Layout(tp=2, pp=2), Layout(tp=2, dp=2, zero=1)], ids=["tp2-pp2", "tp2-dp2-zero1"])
def test_tensor_parallel_layouts_train_as_one_process(layout):
    """Vocabulary-parallel embedding and head tied (on two pipeline ranks, or on one with ZeRO-1 over the local
    shards): gradients at the first step and weights after every SGD step equal one process's."""
    lr, name = 0.5, "model.embed_tokens.weight"
    cfg = layout_config(_tied_llama(), layout, optimizer="sgd", lr=lr, extra_steps=1)
    parts = run_layout(cfg)
    _, rel = layout_gradient_errors(parts, cfg.workload, layout, cfg.micro_batches, say=lambda *a, **k: None)
    assert rel < 1e-4
    ref = sgd_reference(cfg.workload, dp=layout.dp, micro_batches=cfg.micro_batches,
                        steps=parts[0]["optimizer_steps"], lr=lr)
    copies = [p["tied"][name]["weight"] for p in parts if name in p["tied"]]
    assert len(copies) == (layout.devices if layout.pp > 1 else 0) and tied_copies_equal(parts) in ({name: True}, {})
    for w in copies:
        torch.testing.assert_close(w, ref[name], rtol=1e-5, atol=1e-6)
    grads = {n: g for p in parts for n, g in p["grads"].items()}
    assert set(grads) == set(ref)


@needs_tp
@pytest.mark.parametrize("layout", [Layout(tp=2, pp=2), Layout(tp=2, dp=2, zero=3), Layout(tp=2, pp=2, dp=2, zero=1)],
                         ids=["tp2-pp2", "tp2-dp2-zero3", "tp2-pp2-dp2-zero1"])
def test_gpt2_tensor_parallel_layouts_train_as_one_process(layout):
    """GPT-2 split as Megatron's GPT (its fused query/key/value by heads, its tied embedding and head over the
    vocabulary, on two pipeline ranks where pp = 2): the first step's gradients, the fused projection's in the
    model's order column by column, and the tied weights after every SGD step equal one process's."""
    from workbench.runtime.gradients import reference_gradients

    lr = 0.5
    cfg = layout_config(tiny_gpt2(), layout, optimizer="sgd", lr=lr, extra_steps=1)
    parts = run_layout(cfg)
    _, rel = layout_gradient_errors(parts, cfg.workload, layout, cfg.micro_batches, say=lambda *a, **k: None)
    assert rel < 1e-4
    grads = {n: g for p in parts for n, g in p["grads"].items()}
    ref = reference_gradients(cfg.workload, layout.dp * cfg.micro_batches)
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.attn.c_attn.bias"):
        torch.testing.assert_close(grads[name] * layout.dp, ref[name], rtol=1e-4, atol=1e-6)
    weights = sgd_reference(cfg.workload, dp=layout.dp, micro_batches=cfg.micro_batches,
                            steps=parts[0]["optimizer_steps"], lr=lr)
    copies = [p["tied"][TIED]["weight"] for p in parts if TIED in p["tied"]]
    assert len(copies) == (layout.devices if layout.pp > 1 else 0)
    assert tied_copies_equal(parts) == ({TIED: True} if layout.pp > 1 else {})
    for w in copies:
        torch.testing.assert_close(w, weights[TIED], rtol=1e-5, atol=1e-6)


@needs_tp
@pytest.mark.parametrize("model,layout", [("llama", Layout(tp=2, loss_parallel=True)),
                                          ("llama", Layout(tp=2, pp=2, loss_parallel=True)),
                                          ("gpt2", Layout(tp=2, pp=2, loss_parallel=True))],
                         ids=["llama-tp2-lp", "llama-tp2-pp2-lp", "gpt2-tp2-pp2-lp"])
def test_the_vocabulary_parallel_loss_trains_as_one_process(model, layout):
    """lp=1: the head's logits stay sharded over the vocabulary and the model's own cross-entropy runs under
    torch's loss_parallel on the last stage (one stage: torchtitan's loop; two: torch's 1F1B); the first step's
    gradients equal one process's (measured: 2.3e-7 relative), GPT-2's tied copies stay equal."""
    wl = tiny_gpt2() if model == "gpt2" else hf_workload("llama", batch_size=2, sequence=8, layers=2, hidden=32,
                                                          heads=4, kv_heads=2, vocab=64)
    cfg = layout_config(wl, layout)
    parts = run_layout(cfg)
    _, rel = layout_gradient_errors(parts, cfg.workload, layout, cfg.micro_batches, say=lambda *a, **k: None)
    assert rel < 1e-5
    assert all(tied_copies_equal(parts).values())
