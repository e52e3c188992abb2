"""Fused kernels (workbench.profiles.fused): the same numbers as eager, one kernel each, the fused memory."""

import contextlib
import os

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from workbench.profiles.fake import default_dtype, fake_profile
from workbench.profiles.fused import fused_active, fused_apply, fused_kernels, is_suspended, patched_modules
from workbench.profiles.kernel_time import KINDS
from workbench.profiles.roofline import WorkCounter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _llama(layers=2):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    return transformers.LlamaForCausalLM(config)


def _nemotron():
    config = transformers.NemotronConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    return transformers.NemotronForCausalLM(config)        # LayerNorm1P, squared ReLU, rotary on half the head


def _gpt2():
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _step(model, ids, kernels):
    model.zero_grad()
    with fused_kernels(model, kernels):
        logits = model(ids).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.roll(-1, 1).flatten())
        loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("build", [_llama, _nemotron, _gpt2])
def test_fused_gives_eager_outputs_and_gradients(build):
    torch.manual_seed(0)
    model = build()
    ids = torch.randint(0, 100, (2, 16))
    eager, fused = _step(model, ids, "eager"), _step(model, ids, "fused")
    assert torch.allclose(eager[0], fused[0], atol=1e-5) and torch.allclose(eager[1], fused[1], atol=1e-5)
    assert eager[2].keys() == fused[2].keys()
    for name, g in eager[2].items():
        assert torch.allclose(g, fused[2][name], atol=1e-5), name


def test_patches_are_undone_and_cover_the_decoder():
    model = _llama()
    patched = patched_modules(model)
    kinds = sorted({type(obj).__name__ for obj, _, _ in patched})
    assert kinds == ["LlamaMLP", "LlamaRMSNorm", "module"]               # norms, gated MLPs, apply_rotary_pos_emb
    assert sum(type(obj).__name__ == "LlamaRMSNorm" for obj, _, _ in patched) == 5     # 2 blocks x 2 + the last
    original = F.cross_entropy
    with fused_kernels(model):
        assert F.cross_entropy is not original and fused_active()
    assert F.cross_entropy is original and not fused_active()
    assert "forward" not in model.model.norm.__dict__


def _block_work(kernels):
    torch.manual_seed(0)
    model = _llama(layers=1)
    block = model.model.layers[0]
    with fused_kernels(model, kernels):
        x = torch.randn(2, 16, 64, requires_grad=True)
        positions = torch.arange(16)[None]
        rope = model.model.rotary_emb(x, positions)
        counter = WorkCounter()
        with counter:
            y = block(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
            y = y[0] if isinstance(y, tuple) else y
            forward = counter.take()
            y.backward(torch.ones_like(y))
            backward = counter.take()
    return forward, backward


def test_a_block_runs_one_kernel_per_fused_operation():
    eager_f, eager_b = _block_work("eager")
    fused_f, fused_b = _block_work("fused")
    mem = KINDS.index("memory")
    # forward: 7 GEMMs (q, k, v, o, gate, up, down), attention, and 6 memory-bound kernels: 2 norms, rotary,
    # act(gate) * up, 2 residual adds
    assert int(np.sum(fused_f.kind == KINDS.index("matmul"))) == 7
    assert int(np.sum(fused_f.kind == KINDS.index("attention_fused"))) == 1
    assert int(np.sum(fused_f.kind == KINDS.index("attention"))) == 0
    assert int(np.sum(fused_f.kind == mem)) == 6
    assert int(np.sum(eager_f.kind == mem)) > 20          # the norms' 6 kernels each, rotary's a dozen, ...
    assert fused_f.kernels < eager_f.kernels / 2 and fused_b.kernels < eager_b.kernels / 2
    # the GEMMs are the same ones
    assert np.array_equal(np.sort(fused_f.flops[fused_f.kind == 1]), np.sort(eager_f.flops[eager_f.kind == 1]))


def test_fake_profile_saves_the_fused_kernels_tensors():
    """One Llama block in bf16, T tokens, hidden h, MLP I: eager RMSNorm saves x in float32 (4 T h), its bf16
    normalised copy (2 T h) and rstd, and the linears save the scaled output (2 T h); the fused one saves its
    input (2 T h), rstd and its output: 4 T h less per norm. SwiGLU's eager act(gate) (2 T I) is not saved fused."""
    from workbench.parallel.tensor.tiny import tiny_llama

    def build():
        with default_dtype(torch.bfloat16):
            return tiny_llama(batch_size=2, sequence=64, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=512)

    eager, fused = fake_profile(build, "h100-sxm"), fake_profile(build, "h100-sxm", kernels="fused")
    tokens, h, inter = 2 * 64, 256, 512
    block = [l.name for l in eager.layers].index("model.layers.0")
    assert eager[block].saved_bytes - fused[block].saved_bytes == 2 * 4 * tokens * h + 2 * tokens * inter
    norm = [l.name for l in eager.layers].index("model.norm")
    assert eager[norm].saved_bytes == 4 * tokens * h + 2 * tokens * h + 4 * tokens
    assert fused[norm].saved_bytes == 2 * tokens * h + 4 * tokens
    assert fused.meta["kernels"] == "fused" and "kernels" not in eager.meta
    assert fused.total_compute < eager.total_compute


def test_fused_apply_records_one_kernel_and_adopts_its_outputs():
    from workbench.profiles.memtrace import AllocationTracker

    x = torch.randn(8, 16, requires_grad=True)
    counter, tracker = WorkCounter(), AllocationTracker([x])
    with tracker, counter:
        y = fused_apply("silu", F.silu, (x,), save=(0,))
    work = counter.take()
    assert len(work) == 1 and work.bytes[0] == 2 * 8 * 16 * 4          # read x, write y
    assert tracker.current == 8 * 16 * 4 and not is_suspended()        # y only: the temporaries are not counted
    y.sum().backward()
    assert torch.allclose(x.grad, torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))), atol=1e-6)


def test_fused_apply_refuses_a_recompute_without_its_inputs():
    with pytest.raises(ValueError, match="every input saved"):
        fused_apply("mul", torch.mul, (torch.ones(2), torch.ones(2)), save=(0,))


def test_unknown_kernels_setting_is_refused():
    with pytest.raises(ValueError, match="known: eager, fused"):
        with fused_kernels(None, "compiled"):
            pass


def _gloo_rank(rank, init, out, parallel):
    """One of 2 gloo ranks: the small Llama sharded (with sequence parallelism and the vocabulary-parallel loss
    when ``parallel``), one step with eager kernels and one with fused; the loss and this rank's gradient shards
    of each saved."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from workbench.parallel.tensor.mesh import tp_mesh
    from workbench.parallel.tensor.plan import plan_model
    from workbench.parallel.tensor.shard import shard_model
    from workbench.parallel.tensor.tiny import tiny_llama

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model, ids, targets, loss_fn = tiny_llama()
        with tp_mesh(2) as mesh:
            shard_model(model, mesh, plan_model(model, 2, sequence_parallel=parallel, loss_parallel=parallel,
                                                sequence=16))
            results = {}
            for kernels in ("eager", "fused"):
                model.zero_grad()
                with (loss_parallel() if parallel else contextlib.nullcontext()), fused_kernels(model, kernels):
                    loss = loss_fn(model(ids), targets)
                    loss.backward()
                whole = loss.full_tensor() if isinstance(loss, DTensor) else loss
                grads = {n: (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).clone()
                         for n, p in model.named_parameters() if p.grad is not None}
                results[kernels] = (whole.detach().clone(), grads)
        torch.save(results, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("parallel", [False, True], ids=["sp0", "sp1-lp1"])
def test_fused_under_dtensor_gives_eager_loss_and_gradients_on_gloo_ranks(tmp_path, gloo_ranks, parallel):
    """DTensor (tensor parallelism; sp=0, or sp=1 with lp=1) runs the fused functions' math on each rank's
    shards: the same loss and gradient shards as the eager kernels, on 2 real gloo ranks."""
    gloo_ranks(_gloo_rank, parallel)
    for r in range(2):
        res = torch.load(tmp_path / f"rank{r}.pt")
        (le, ge), (lf, gf) = res["eager"], res["fused"]
        assert torch.allclose(le, lf, atol=1e-5)
        assert ge.keys() == gf.keys() and len(ge) > 10
        for name in ge:
            assert torch.allclose(ge[name], gf[name], atol=1e-5), (r, name)
