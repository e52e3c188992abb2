"""workbench.parallel.tensor.profile: one rank's profile, measured under fake tensors with a fake group.

Checked against independent counts: each sharded linear's parameters divided by tp (from the unsharded
model's own shapes), Megatron's collectives (two all-reduces of b x s x h per block in the forward, two in
the backward), and the plain fake profile at tp=1; for a Llama-style decoder and for GPT-2 (its fused
query/key/value projection split by heads, its head tied).
"""

from __future__ import annotations

import dataclasses

import pytest

from workbench.model.chain import MEMORY_COLUMNS
from workbench.parallel.tensor.profile import tensor_parallel_profile
from workbench.parallel.tensor.tiny import tiny_gpt2, tiny_llama
from workbench.profiles.csvio import read_profile, write_profile

B, S, H, V, FP32 = 2, 16, 64, 256, 4
SHARDED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def tp2():
    return tensor_parallel_profile(tiny_llama, "h100-sxm", 2, cache=False)


def _block_weights(tp: int, **sizes) -> float:
    """Bytes of one block's parameters on a rank: the sharded linears' whole counts divided by tp."""
    model = tiny_llama(**sizes)[0]
    total = 0
    for name, p in model.model.layers[0].named_parameters():
        total += p.numel() // tp if any(s in name for s in SHARDED) else p.numel()
    return total * FP32


def test_blocks_hold_their_shard_and_issue_megatrons_collectives(tp2):
    blocks = [l for l in tp2.layers if l.name.startswith("model.layers.")]
    assert len(blocks) == 2 and blocks[0] == dataclasses.replace(blocks[1], name=blocks[0].name)   # alike
    megatron = 2 * B * S * H * FP32                 # two all-reduces of the hidden state, forward and backward
    for block in blocks:
        assert block.weight_bytes == block.grad_bytes == _block_weights(2)
        assert block.comm_forward_bytes == megatron and block.comm_backward_bytes == megatron
    embed, head = tp2[0], tp2[len(tp2) - 1]
    assert embed.weight_bytes == V // 2 * H * FP32 and embed.comm_forward_bytes == B * S * H * FP32
    assert head.comm_forward_bytes == B * S * V * FP32 and head.comm_backward_bytes == B * S * H * FP32
    assert tp2.meta["tp"] == "2" and tp2.meta["tp_rank"].startswith("0")
    assert tp2.meta["tp_collectives"] == ("forward: 5 all_reduce (40960 B), 1 all_gather (32768 B); "
                                          "backward: 5 all_reduce (40960 B)")


def test_tp1_is_the_plain_fake_profile(tp2):
    from workbench.profiles.fake import fake_profile

    one = tensor_parallel_profile(tiny_llama, "h100-sxm", 1, cache=False)
    plain = fake_profile(tiny_llama, "h100-sxm")
    columns = ("weight_bytes", "activation_bytes", "saved_bytes", "forward", "backward") + MEMORY_COLUMNS
    for a, b in zip(one.layers, plain.layers):
        assert [getattr(a, c) for c in columns] == [getattr(b, c) for c in columns]
    assert one.meta["tp"] == "1" and one[1].comm_forward_bytes is None
    assert tp2[1].weight_bytes < one[1].weight_bytes and tp2[1].saved_bytes < one[1].saved_bytes
    # the rank's own work is no more than the whole layer's (equal here: a layer this small is launch-bound), and
    # its all-reduces come on top, priced on the H100's NVLink
    from workbench.parallel.collectives import ring_seconds

    wire = ring_seconds("all_reduce", tp2[1].comm_forward_bytes, ranks=2, bandwidth=450e9)
    assert wire > 0 and tp2[1].forward - wire <= one[1].forward * (1 + 1e-9)


def test_four_ranks_divide_the_weights_by_four():
    sizes = dict(kv_heads=4)
    four = tensor_parallel_profile(lambda: tiny_llama(**sizes), "h100-sxm", 4, cache=False)
    assert four[1].weight_bytes == _block_weights(4, **sizes)
    assert four[1].comm_forward_bytes == 2 * B * S * H * FP32     # the same bytes, whatever tp


def test_sequence_parallelism_gathers_and_scatters_the_same_bytes():
    sp = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, sequence_parallel=True, cache=False)
    block = sp[1]
    assert block.activation_bytes == B * S * H * FP32 / 2          # between blocks: half the sequence
    assert block.comm_forward_bytes == 4 * B * S * H * FP32        # 2 all-gathers + 2 reduce-scatters
    assert block.comm_backward_bytes == 4 * B * S * H * FP32
    assert "reduce_scatter" in sp.meta["tp_collectives"] and sp.meta["sequence_parallel"] == "true"


def test_loss_parallel_keeps_the_logits_split(tp2):
    lp = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, loss_parallel=True, cache=False)
    head = lp[len(lp) - 1]
    assert head.activation_bytes == B * S * V * FP32 / 2 == tp2[len(tp2) - 1].activation_bytes / 2
    assert "all_gather" not in lp.meta["tp_collectives"]
    assert head.comm_forward_bytes < B * S * FP32 * 4            # max, sum of exponentials, target logit


def test_a_model_tp_does_not_divide_is_refused():
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's key/value heads \(2\)"):
        tensor_parallel_profile(tiny_llama, "h100-sxm", 4, cache=False)


def test_micro_batch_size_calls_the_build_with_it(tp2):
    four = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, micro_batch_size=4, cache=False)
    assert four[1].activation_bytes == 2 * tp2[1].activation_bytes
    with pytest.raises(ValueError, match="takes no batch_size argument"):
        tensor_parallel_profile(lambda: tiny_llama(), "h100-sxm", 2, micro_batch_size=4, cache=False)


def test_csv_round_trip_keeps_the_collective_columns(tp2, tmp_path):
    write_profile(tp2, tmp_path / "p.csv")
    back = read_profile(tmp_path / "p.csv")
    assert [(l.comm_forward_bytes, l.comm_backward_bytes) for l in back.layers] == \
        [(l.comm_forward_bytes, l.comm_backward_bytes) for l in tp2.layers]
    merged = back.coarsen([(0, 2), (3, len(back) - 1)])
    assert merged[0].comm_forward_bytes == sum(l.comm_forward_bytes for l in back.layers[:3])


def test_results_are_cached_by_content(tmp_path, monkeypatch):
    module = tmp_path / "tiny.py"
    module.write_text("from workbench.parallel.tensor.tiny import tiny_llama\n\n\ndef build():\n"
                      "    return tiny_llama()\n")
    import workbench.parallel.tensor.profile as profile

    calls = []
    real = profile.fake_tensor_parallel
    monkeypatch.setattr(profile, "fake_tensor_parallel", lambda *a, **k: calls.append(a) or real(*a, **k))
    spec, cache = f"{module}:build", tmp_path / "cache"
    first = tensor_parallel_profile(spec, "h100-sxm", 2, cache=cache)
    again = tensor_parallel_profile(spec, "h100-sxm", 2, cache=cache)
    assert len(calls) == 1 and [l.saved_bytes for l in again.layers] == [l.saved_bytes for l in first.layers]
    tensor_parallel_profile(spec, "a100-80gb", 2, cache=cache)                   # another GPU: another key
    module.write_text(module.read_text() + "\n# changed\n")
    tensor_parallel_profile(spec, "h100-sxm", 2, cache=cache)                    # another file: another key
    assert len(calls) == 3 and len(list(cache.glob("*.csv"))) == 3


def test_cli_writes_one_ranks_profile_and_refuses_in_one_line(tmp_path, capsys):
    from workbench.front.cli import main

    module = tmp_path / "tiny.py"
    module.write_text("from workbench.parallel.tensor.tiny import tiny_llama\n\n\ndef build():\n"
                      "    return tiny_llama()\n")
    out = tmp_path / "p.csv"
    args = ["profile", "--module", f"{module}:build", "--out", str(out)]
    assert main(args + ["--fake", "--gpu", "h100-sxm", "--tp", "2"]) == 0
    chain = read_profile(out)
    assert chain.meta["tp"] == "2" and chain[1].comm_forward_bytes == 2 * B * S * H * FP32
    assert chain.meta["module"] == "tiny.py:build" and "tp=2, rank 0" in capsys.readouterr().out
    assert main(args + ["--fake", "--gpu", "h100-sxm", "--tp", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tp=4 does not divide the model's key/value heads (2)") and err.count("\n") == 1
    assert main(args + ["--tp", "2"]) == 2 and "add --fake --gpu NAME" in capsys.readouterr().err
    assert main(args + ["--fake", "--gpu", "h100-sxm", "--sequence-parallel"]) == 2
    assert "need --tp 2 or more" in capsys.readouterr().err


def test_a_tied_head_counts_its_shard_once():
    import json

    tied = tensor_parallel_profile(lambda: tiny_llama(tie=True), "h100-sxm", 2, cache=False)
    head = tied[len(tied) - 1]
    assert tied[0].weight_bytes == V // 2 * H * FP32 and head.weight_bytes == head.grad_bytes == 0.0
    (tie,) = json.loads(tied.meta["tied"])
    assert tie["bytes"] == V // 2 * H * FP32 and tie["parameter"] == "model.embed_tokens.weight"
    assert tie["layers"] == [tied[0].name, head.name]


GPT2_SHARDED = ("attn.c_attn.", "mlp.c_fc.", "c_proj.weight")     # column-wise weights and biases, row-wise weights


def _gpt2_block_weights(tp: int) -> float:
    """Bytes of one GPT-2 block on a rank, from the unsharded model's shapes: the column-wise weights and
    biases and the row-wise weights divided by tp; the row-wise biases (added after the all-reduce) and the
    norms whole."""
    model = tiny_gpt2()[0]
    return FP32 * sum(p.numel() // tp if any(s in name for s in GPT2_SHARDED) else p.numel()
                      for name, p in model.transformer.h[0].named_parameters())


@pytest.mark.parametrize("tp", [2, 4])
def test_gpt2_blocks_hold_their_heads_and_issue_megatrons_collectives(tp):
    import json

    chain = tensor_parallel_profile(tiny_gpt2, "h100-sxm", tp, cache=False)
    v = 128
    blocks = [l for l in chain.layers if l.name.startswith("transformer.h.")]
    assert len(blocks) == 2
    megatron = 2 * B * S * H * FP32                 # two all-reduces of the hidden state, forward and backward
    for block in blocks:
        assert block.weight_bytes == block.grad_bytes == _gpt2_block_weights(tp)
        assert block.comm_forward_bytes == megatron and block.comm_backward_bytes == megatron
    embed, head = chain[0], chain[len(chain) - 1]
    assert embed.weight_bytes == (v // tp * H + 128 * H) * FP32                # wte's shard, wpe whole
    assert embed.comm_forward_bytes == B * S * H * FP32 and head.weight_bytes == 0.0       # tied: counted once
    assert head.comm_forward_bytes == B * S * v * FP32 and head.comm_backward_bytes == B * S * H * FP32
    (tie,) = json.loads(chain.meta["tied"])
    assert tie["parameter"] == "transformer.wte.weight" and tie["bytes"] == v // tp * H * FP32
    one = tensor_parallel_profile(tiny_gpt2, "h100-sxm", 1, cache=False)
    assert blocks[0].saved_bytes < one[1].saved_bytes and "fused query/key/value" in chain.meta["tp_plan"]


def test_a_gpt2_tp_does_not_divide_is_refused_naming_its_sizes():
    with pytest.raises(ValueError, match=r"tp=8 does not divide the model's query heads \(4\), key/value heads "
                                         r"\(4\); sizes: query heads 4, key/value heads 4, hidden 64"):
        tensor_parallel_profile(tiny_gpt2, "h100-sxm", 8, cache=False)
    with pytest.raises(ValueError, match=r"tp=2 does not divide the model's vocabulary \(127\)"):
        tensor_parallel_profile(lambda: tiny_gpt2(vocab=127), "h100-sxm", 2, cache=False)


def test_gpt2_under_sequence_parallelism_scatters_after_the_positions():
    """Megatron's GPT with learned positions: the token embedding all-reduced whole, the positions added, then
    split over the sequence (a slice; an all-gather of its gradient in the backward); per block 2 all-gathers
    and 2 reduce-scatters of the hidden state each way."""
    sp = tensor_parallel_profile(tiny_gpt2, "h100-sxm", 2, sequence_parallel=True, cache=False)
    embed, block = sp[0], sp[1]
    assert embed.comm_forward_bytes == embed.comm_backward_bytes == B * S * H * FP32
    assert embed.activation_bytes == block.activation_bytes == B * S * H * FP32 / 2
    assert block.comm_forward_bytes == block.comm_backward_bytes == 4 * B * S * H * FP32
    assert sp.meta["tp_collectives"].startswith("forward: 1 all_reduce (8192 B), 6 all_gather")


def test_a_sequence_parallel_profile_keeps_its_collectives_seconds_for_the_overlap():
    from workbench.model.accelerators import accelerator
    from workbench.parallel.tensor.overlap import overlapped_chain
    from workbench.parallel.tensor.tiny import tiny_llama

    chain = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, sequence_parallel=True, cache=False)
    bw = accelerator("h100-sxm").link_bandwidth
    for layer in chain.layers:       # only all-gathers and reduce-scatters: each (tp - 1) / tp of its bytes
        assert layer.comm_forward == pytest.approx(layer.comm_forward_bytes / 2 / bw)
        assert layer.comm_backward == pytest.approx(layer.comm_backward_bytes / 2 / bw)
        assert layer.exposed_forward >= 0 and layer.exposed_backward >= 0
    over = overlapped_chain(chain)
    for a, b in zip(chain.layers, over.layers):
        assert b.forward >= a.forward - a.comm_forward - 1e-15
        assert b.forward == pytest.approx(a.forward - a.comm_forward + a.exposed_forward)


def test_fused_kernels_shard_like_eager_ones_and_save_less():
    """--kernels fused on DTensors (sp=1, lp=1): the same collectives a layer issues, less saved, less time."""
    eager = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, sequence_parallel=True, loss_parallel=True,
                                    cache=False)
    fused = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, sequence_parallel=True, loss_parallel=True,
                                    cache=False, kernels="fused")
    assert fused.meta["kernels"] == "fused" and fused.meta["tp_collectives"] == eager.meta["tp_collectives"]
    for e, f in zip(eager.layers, fused.layers):
        assert (e.comm_forward_bytes, e.comm_backward_bytes) == (f.comm_forward_bytes, f.comm_backward_bytes)
        assert f.saved_bytes <= e.saved_bytes
    assert fused[1].saved_bytes < eager[1].saved_bytes and fused.total_compute < eager.total_compute
    with pytest.raises(ValueError, match="fake tensors only"):
        tensor_parallel_profile(tiny_llama, "h100-sxm", 2, fake=False, kernels="fused")
