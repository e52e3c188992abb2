"""Sequence-parallel collectives as Megatron-Core runs them (workbench.parallel.tensor.sequence_first): under
fused kernels, no reorder copy around torch's dim-1 all-gather and reduce-scatter; the same collectives."""

import contextlib
import os

import pytest
import torch

import workbench.parallel.tensor.profile as tp_profile
import workbench.profiles.fused as fused
from workbench.parallel.tensor.sequence_first import is_sequence_dim, sequence_first_collectives
from workbench.parallel.tensor.tiny import lm_loss
from workbench.profiles.fake import default_dtype
from workbench.profiles.kernel_time import KINDS
from workbench.profiles.memtrace import AllocationTracker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

B, S, H, INTER, VOCAB = 2, 64, 256, 512, 512


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, use_cache=False))


def _nemotron():
    return transformers.NemotronForCausalLM(transformers.NemotronConfig(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, use_cache=False))


def _profile(model_of, kernels, monkeypatch):
    """(chain, per-layer LayerWork) of the model's fake TP 2 profile, sp=1 lp=1, bf16."""
    made = []

    class Times(tp_profile.TensorParallelTimes):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    def build():
        with default_dtype(torch.bfloat16):
            model = model_of()
        ids = torch.randint(0, VOCAB, (B, S))
        return model, ids, ids.roll(-1, 1), lm_loss

    with monkeypatch.context() as m:
        m.setattr(tp_profile, "TensorParallelTimes", Times)
        chain = tp_profile.fake_tensor_parallel(build, "h100-sxm", 2, sequence_parallel=True, loss_parallel=True,
                                                kernels=kernels)
    return chain, made[-1].works


def _memory_bytes(work):
    return float(work.bytes[work.kind == KINDS.index("memory")].sum())


@pytest.mark.parametrize("model_of", [_llama, _nemotron], ids=["llama", "nemotron"])
def test_fused_block_moves_the_reorder_copies_less_and_the_same_collectives(model_of, monkeypatch):
    """A block issues 2 all-gathers and 2 reduce-scatters over the sequence in each phase (the backward's are
    the forward's transposes); torch's reorder around each reads and writes b x s x h bf16 elements. Fused
    kernels (sequence first) move exactly those bytes less per phase; the collectives' bytes are the same; the
    saved tensors are the same; the forward's peak is one b x s x h buffer lower (the gather's reordered copy
    beside the gathered buffer)."""
    torch.manual_seed(0)
    seq_first, seq_first_work = _profile(model_of, "fused", monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(fused, "_sequence_first", contextlib.nullcontext)        # torch's collectives, reorders and all
        torch_way, torch_way_work = _profile(model_of, "fused", monkeypatch)
    copy = 2 * B * S * H * 2                                                   # read + write, bf16
    blocks = [i for i, layer in enumerate(seq_first.layers) if ".layers." in layer.name]
    assert len(blocks) == 2
    for i in blocks:
        ours, theirs = seq_first_work[i], torch_way_work[i]
        assert _memory_bytes(theirs.forward) - _memory_bytes(ours.forward) == 4 * copy
        assert _memory_bytes(theirs.backward) - _memory_bytes(ours.backward) == 4 * copy
        assert int((theirs.forward.kind == KINDS.index("memory")).sum()) - int(
            (ours.forward.kind == KINDS.index("memory")).sum()) == 4
        a, b = seq_first[i], torch_way[i]
        assert a.comm_forward_bytes == b.comm_forward_bytes > 0
        assert a.comm_backward_bytes == b.comm_backward_bytes > 0
        assert a.saved_bytes == b.saved_bytes and a.backward_peak_bytes == b.backward_peak_bytes
        assert b.forward_peak_bytes - a.forward_peak_bytes == B * S * H * 2
    assert seq_first.meta["tp_collectives"] == torch_way.meta["tp_collectives"]


def test_eager_kernels_never_enter_it(monkeypatch):
    """Eager profiles run torch's collectives as before: the sequence-first wrapper is never entered."""
    import workbench.parallel.tensor.sequence_first as sf

    def refuse():
        raise AssertionError("entered under eager kernels")

    monkeypatch.setattr(sf, "sequence_first_collectives", refuse)
    chain, _ = _profile(_llama, "eager", monkeypatch)
    assert chain[1].comm_forward_bytes > 0
    with pytest.raises(AssertionError, match="entered"):
        with fused.fused_kernels(None, "fused"):
            pass


def test_is_sequence_dim_only_the_second_of_three_or_more():
    assert is_sequence_dim(torch.zeros(2, 4, 8), 1) and is_sequence_dim(torch.zeros(2, 4, 8, 2), -3)
    assert not is_sequence_dim(torch.zeros(4, 8), 1) and not is_sequence_dim(torch.zeros(2, 4, 8), 2)
    assert not is_sequence_dim(torch.zeros(2, 4, 8), 0)


def test_carry_over_passes_the_bytes_to_the_reordered_tensor():
    tracker = AllocationTracker()
    with tracker:
        gathered = torch.zeros(4, 3, 8)
        with fused.suspended():
            reordered = torch.cat(torch.chunk(gathered, 2, dim=0), dim=1)
        tracker.carry_over(gathered, reordered)
        assert tracker.current == 4 * 3 * 8 * 4
        del gathered
        assert tracker.current == 4 * 3 * 8 * 4                  # the reordered result holds them now
        del reordered
    assert tracker.current == 0 and tracker.peak == 4 * 3 * 8 * 4


def _block_forward_peaks(collectives):
    """(MemTracker's activation peak, the allocation tracker's peak) of a sharded Llama block's forward (TP 2
    on a fake group, sp=1, bf16, fake tensors) inside ``collectives()``; the block runs once before (torch's
    first redistributions allocate what later ones do not)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.distributed.tensor import DTensor, Shard

    from workbench.parallel.tensor.comm import waited_collectives
    from workbench.parallel.tensor.mesh import tp_mesh
    from workbench.parallel.tensor.plan import plan_model
    from workbench.parallel.tensor.shard import shard_model
    from workbench.profiles.fake import value_free_init

    with tp_mesh(2) as mesh, FakeTensorMode():
        with value_free_init(), default_dtype(torch.bfloat16):
            model = _llama()
            cos_sin = model.model.rotary_emb(torch.zeros(B, S, H), torch.arange(S)[None].expand(B, S))
        shard_model(model, mesh, plan_model(model, 2, sequence_parallel=True, sequence=S))
        block = model.model.layers[0]
        peaks = []
        for _ in range(2):
            x = DTensor.from_local(torch.randn(B, S // 2, H, dtype=torch.bfloat16), mesh, [Shard(1)])
            x = x.detach().requires_grad_()
            tracker, mem_tracker = AllocationTracker([x, *model.parameters()]), MemTracker()
            mem_tracker.track_external(model, x)
            with waited_collectives(), collectives(), mem_tracker, tracker:
                y = block(x, position_embeddings=cos_sin)
            snapshot = mem_tracker.get_tracker_snapshot("peak")
            peaks.append((snapshot[next(iter(snapshot))][_MemRefType.ACT], tracker.peak))
            del y
    return peaks[-1]


def test_block_forward_peak_against_memtracker():
    """torch's MemTracker sees what torch allocates, reorder copies included: with torch's collectives the
    allocation tracker reads the same peak; with the sequence-first ones the same MemTracker peak (the copies
    still run, unrecorded) and the allocation tracker exactly one b x s x h bf16 buffer lower (the gather's
    reordered copy beside the gathered buffer, which Megatron does not hold)."""
    torch_mt, torch_ours = _block_forward_peaks(contextlib.nullcontext)
    first_mt, first_ours = _block_forward_peaks(sequence_first_collectives)
    assert torch_mt == torch_ours > 0
    assert first_mt == torch_mt
    assert first_ours == torch_ours - B * S * H * 2


def _gloo_rank(rank, init, out):
    """One of 2 gloo ranks: torch's functional all-gather and reduce-scatter along dimension 1 (and 2, passed
    through), plain and inside sequence_first_collectives; the results saved."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        group = dist.group.WORLD
        torch.manual_seed(rank)
        shard, whole = torch.randn(3, 4, 5), torch.randn(3, 8, 6)
        def done(t):
            return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t

        results = {}
        for name, ctx in (("torch", contextlib.nullcontext()), ("seq_first", sequence_first_collectives())):
            with ctx:
                results[name] = [done(funcol.all_gather_single(shard, 1, group)),
                                 done(funcol.reduce_scatter_single(whole, "sum", 1, group)),
                                 done(funcol.all_gather_single(shard, 2, group)),
                                 done(funcol.reduce_scatter_single(whole, "sum", 2, group))]
        torch.save(results, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_same_values_as_torch_on_gloo_ranks(tmp_path, gloo_ranks):
    gloo_ranks(_gloo_rank)
    for r in range(2):
        res = torch.load(tmp_path / f"rank{r}.pt")
        shapes = [tuple(t.shape) for t in res["seq_first"]]
        assert shapes == [(3, 8, 5), (3, 4, 6), (3, 4, 10), (3, 8, 3)]
        for a, b in zip(res["torch"], res["seq_first"]):
            assert torch.equal(a, b)
