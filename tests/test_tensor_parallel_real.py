"""workbench.parallel.tensor.real: the fake profile against the same model measured on real gloo ranks.

Issue 37: a small Llama-style decoder (2 blocks, hidden 64, 4 heads, 2 key/value heads) and a small GPT-2 of
the same sizes (its fused query/key/value split by heads, its head tied) profiled under fake tensors with a
fake group of tp=2 give every rank's memory columns as measured on 2 gloo processes with real CPU tensors,
by the same allocator-level tracker (within 1 %; they agree to the byte here), with and without sequence
parallelism and the vocabulary-parallel loss. The gradients the ranks hold after a backward: the
vocabulary-parallel embedding's as its ``Shard(0)`` shard, as the profile's ``grad_bytes`` counts it (torch's
embedding backward gives it whole), and every gradient, gathered, equal to one process's.
"""

from __future__ import annotations

import pytest
import torch

from workbench.model.chain import COMM_FIELDS, MEMORY_COLUMNS
from workbench.parallel.tensor.plan import plan_model
from workbench.parallel.tensor.profile import tensor_parallel_profile
from workbench.parallel.tensor.real import gloo_held_gradients, gloo_tensor_parallel
from workbench.parallel.tensor.styles import model_order
from workbench.parallel.tensor.tiny import tiny_gpt2, tiny_llama

COLUMNS = ("weight_bytes", "activation_bytes", "saved_bytes") + MEMORY_COLUMNS + COMM_FIELDS


@pytest.mark.parametrize("build, sequence_parallel, loss_parallel", [
    (tiny_llama, False, False), (tiny_gpt2, False, False), (tiny_llama, False, True), (tiny_gpt2, False, True),
    pytest.param(tiny_llama, True, False, marks=pytest.mark.slow),
    pytest.param(tiny_gpt2, True, True, marks=pytest.mark.slow)],
    ids=["llama", "gpt2", "llama-lp", "gpt2-lp", "llama-sp", "gpt2-sp-lp"])
def test_fake_profile_matches_every_gloo_rank(build, sequence_parallel, loss_parallel):
    """With the split loss too (its head's forward and backward peaks were 66 % and 32 % over the gloo ranks' under
    fake tensors, which counted DTensor's propagation scratch: ``sharded.uncounted_propagation``)."""
    ranks = gloo_tensor_parallel(build, "h100-sxm", 2, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel)
    fake = tensor_parallel_profile(build, "h100-sxm", 2, sequence_parallel=sequence_parallel,
                                   loss_parallel=loss_parallel, cache=False)
    assert len(ranks) == 2
    for rank, real in enumerate(ranks):
        assert real.meta["tp_rank"] == str(rank) and [l.name for l in real.layers] == [l.name for l in fake.layers]
        for f, r in zip(fake.layers, real.layers):
            for column in COLUMNS:
                want, got = getattr(f, column), getattr(r, column)
                assert got == pytest.approx(want, rel=0.01, abs=0), (rank, f.name, column)
    assert sum(l.forward_peak_bytes for l in ranks[0].layers) > 0


def test_a_model_tp_does_not_divide_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's key/value heads \(2\)"):
        gloo_tensor_parallel(tiny_llama, "h100-sxm", 4)


def _one_process(build) -> tuple[dict[str, torch.Tensor], str, dict]:
    """Each parameter's gradient in one process (the same seed as the ranks), the embedding's parameter name
    and the parameters the plan permutes."""
    torch.manual_seed(0)
    model, ids, targets, loss = build()
    permuted = plan_model(model, 2).permuted()
    loss(model(ids), targets).backward()
    embedding = model.get_input_embeddings().weight
    name = next(n for n, p in model.named_parameters() if p is embedding)
    return {n: p.grad for n, p in model.named_parameters()}, name, permuted


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_the_embedding_gradient_is_held_as_its_shard_as_the_profile_counts(build):
    ranks = gloo_held_gradients(build, 2)
    first = tensor_parallel_profile(build, "h100-sxm", 2, cache=False).layers[0]     # the embedding's layer
    whole, embedding, permuted = _one_process(build)
    modules = first.name.split("+")
    for held in ranks:
        grad = held[embedding]
        assert grad.placements == ("Shard(dim=0)",)
        assert tuple(grad.local.shape) == (whole[embedding].shape[0] // 2, whole[embedding].shape[1])
        in_first = sum(h.local.numel() * h.local.element_size() for n, h in held.items()
                       if any(n.startswith(m + ".") for m in modules))
        assert in_first == first.grad_bytes
        assert set(held) == {n for n, g in whole.items() if g is not None}
        for name, h in held.items():
            got = model_order(h.whole, permuted[name][0], permuted[name][1], 2) if name in permuted else h.whole
            torch.testing.assert_close(got, whole[name], rtol=1e-4, atol=1e-6, msg=name)
