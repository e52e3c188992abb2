"""benchmarks/published_rows.py's pure pieces: a published row's command line, its checkpointing policy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import published_rows as pr  # noqa: E402

from workbench.front.cli import build_parser  # noqa: E402
from workbench.model.accelerators import accelerator  # noqa: E402
from workbench.model.layout import Layout  # noqa: E402
from workbench.profiles.kernel_time import KINDS  # noqa: E402


@pytest.mark.parametrize("row", pr.ROWS, ids=lambda r: f"{r.name}-{r.gpu}")
def test_every_row_parses_as_plan_parallel_and_its_layout_covers_its_gpus(row):
    args = build_parser().parse_args(pr.plan_argv(row))
    layout = Layout.parse(args.parallel)
    assert args.module.endswith(f"published_models.py:{row.model}") and args.fake and args.gpu == row.gpu
    assert layout.tp * layout.pp * layout.dp == row.gpus == args.devices
    assert layout.micro_batch_size == row.micro_batch
    # the global batch is whole micro-batches on every data-parallel rank
    assert row.global_batch % (layout.dp * row.micro_batch) == 0
    assert args.activations == {"none": "keep", "full": "recompute", "selective-op": "keep"}[row.checkpointing]
    accelerator(row.gpu)                                      # a GPU the workbench knows
    assert row.source and row.tokens_per_gpu > 0


def test_only_torchtitans_8b_h100_row_is_calibration():
    assert [r.name for r in pr.ROWS if r.calibration] == ["torchtitan Llama-3.1-8B FSDP"]
    assert pr.ROWS[0].calibration and pr.ROWS[0].gpu == "h100-96gb-500w"


def test_node_bandwidth_only_when_given():
    argv = pr.plan_argv(pr.ROWS[0])
    assert "--node-bandwidth" not in argv
    foundry_a100_70b = next(r for r in pr.ROWS if r.model == "mpt_70b_2048" and r.gpu == "a100-80gb")
    argv = pr.plan_argv(foundry_a100_70b)
    assert argv[argv.index("--node-bandwidth") + 1] == "25GB/s"


def test_an_unknown_checkpointing_is_refused_naming_the_row():
    bad = pr.Row("x", "s", "mpt_7b_2048", "h100-sxm", 8, "tp=1,pp=1,dp=8,zero=3", 1, 8, 2048, "some", 1.0)
    with pytest.raises(ValueError, match="x: checkpointing 'some'"):
        pr.plan_argv(bad)


def test_selective_op_recomputes_all_but_attention_and_every_other_matmul():
    m, a, x = KINDS.index("matmul"), KINDS.index("attention"), KINDS.index("memory")
    # a Llama block's forward: norm, q k v o projections with attention between, norm, gate up down
    kinds = np.array([x, m, m, m, x, a, m, x, x, m, m, x, m, x])
    out = pr.selective_op_recomputed(kinds)
    matmuls = np.flatnonzero(kinds == m)
    assert out[matmuls].tolist() == [False, True, False, True, False, True, False]   # 1st, 3rd, ... saved
    assert not out[kinds == a].any() and out[kinds == x].all()
    assert not pr.selective_op_recomputed(np.array([], dtype=int)).any()


@pytest.mark.parametrize("name, block", [("model.layers.0", True), ("model.layers.31", True),
                                         ("transformer.h.7", True), ("model.embed_tokens", False),
                                         ("lm_head", False), ("transformer.ln_f", False), ("model.norm", False)])
def test_blocks_are_found_by_name(name, block):
    assert bool(pr.BLOCK.search(name)) is block


def test_selective_op_lengthens_only_the_blocks_backward():
    from workbench.parallel.tensor.tiny import tiny_llama
    from workbench.profiles.fake import fake_profile

    chain = fake_profile(tiny_llama, "h100-sxm")
    row = pr.ROWS[0]
    eff = pr.priced(row, chain)
    for before, after in zip(chain.layers, eff.layers):
        assert after.forward == before.forward
        if pr.BLOCK.search(before.name):
            assert after.backward > before.backward
        else:
            assert after.backward == before.backward
    assert any(pr.BLOCK.search(l.name) for l in chain.layers)


def test_verdict_bands():
    assert pr.verdict(1.15) == "within 15 %" and pr.verdict(0.86) == "within 15 %"
    assert pr.verdict(1.2) == "within 25 %" and pr.verdict(0.74) == "MISSES 25 %"


TP_PP_ROWS = [r for r in pr.ROWS if pr.row_tp(r) > 1 or Layout.parse(r.layout).pp > 1]


def test_the_tensor_and_pipeline_parallel_rows_are_held_out_and_say_where_they_come_from():
    assert len(TP_PP_ROWS) >= 4
    for row in TP_PP_ROWS:
        assert not row.calibration
        assert "dgxc-benchmarking" in row.source and "commit" in row.source
        assert row.gpu == "h100-sxm" and row.checkpointing == "none" and row.precision == "bf16-mixed"


@pytest.mark.parametrize("row", TP_PP_ROWS, ids=lambda r: f"{r.name}-{r.gpus}")
def test_a_tp_pp_rows_layout_is_the_published_one(row):
    # the published tokens/s of the whole job over its GPUs, the step as the source states it
    args = build_parser().parse_args(pr.plan_argv(row))
    lay = Layout.parse(args.parallel)
    published = {  # name, GPUs -> (tp, pp, vp, dp, mbs, gbs, seq, step seconds)
        ("NeMo Nemotron-4 15B TP 4", 16): (4, 1, 1, 4, 4, 64, 4096, 2.812),
        ("NeMo Nemotron-4 15B TP 4", 64): (4, 1, 1, 16, 4, 256, 4096, 2.845),
        ("NeMo Nemotron-4 15B TP 2", 16): (2, 1, 1, 8, 2, 64, 4096, 2.746),
        ("NeMo Llama-3-70B SFT TP 4 PP 4 VP 5", 32): (4, 4, 5, 2, 1, 32, 4096, 3.36),
    }[(row.name, row.gpus)]
    tp, pp, vp, dp, mbs, gbs, seq, step = published
    assert (lay.tp, lay.pp, lay.chunks, lay.dp, lay.micro_batch_size) == (tp, pp, vp, dp, mbs)
    assert (row.global_batch, row.sequence) == (gbs, seq)
    # tokens/s per GPU agrees with the step time the source gives (its own rounding: within 0.1 %)
    assert row.tokens_per_gpu == pytest.approx(gbs * seq / step / row.gpus, rel=1e-3)
    assert lay.zero == 1                                      # Megatron's distributed optimizer
    if pp > 1:
        assert lay.schedule == "interleaved-1f1b"
        assert (gbs // (dp * mbs)) % pp == 0                  # Megatron's interleaving needs whole rounds


def test_row_tp_and_layout_labels():
    assert pr.row_tp(pr.ROWS[0]) == 1 and pr.layout_label(pr.ROWS[0]) == "FSDP 8"
    labels = {pr.layout_label(r) for r in TP_PP_ROWS}
    assert labels == {"TP 4 DP 4", "TP 4 DP 16", "TP 2 DP 8", "TP 4 PP 4x5 DP 2"}


def test_a_calibration_is_refused_for_a_tensor_parallel_row():
    from workbench.profiles.kernel_time import H100_CALIBRATION

    with pytest.raises(ValueError, match="tp=1 chains only"):
        pr.evaluate_row(TP_PP_ROWS[0], H100_CALIBRATION, chain=object())


def test_nemotron4_15b_is_the_launchers_shape():
    import published_models as pm
    import torch

    with torch.device("meta"):
        model, ids, targets, _ = pm.nemotron4_15b_4096(1)
    block = model.model.layers[0]
    # nemotron_15b.yaml: 32 layers, hidden 6144, ffn 24576 (squared ReLU, no gate), 48 heads, 8 query groups
    assert len(model.model.layers) == 32 and ids.shape == (1, 4096)
    assert block.self_attn.q_proj.weight.shape == (6144, 6144) and block.self_attn.k_proj.weight.shape == (1024, 6144)
    assert block.mlp.up_proj.weight.shape == (24576, 6144) and not hasattr(block.mlp, "gate_proj")
    assert model.lm_head.weight.shape == (256000, 6144) and model.lm_head.weight is not model.model.embed_tokens.weight
    assert block.self_attn.q_proj.bias is None
    # 12 l h^2 (1 + kv/heads) ... : 15.6 B parameters with both embeddings
    n = sum(p.numel() for p in model.parameters())
    attn = 6144 * 6144 * 2 + 6144 * 1024 * 2
    assert n == pytest.approx(32 * (attn + 2 * 6144 * 24576) + 2 * 256000 * 6144, rel=1e-3)


def test_the_nemo_rows_overlap_their_tp_communication_as_their_sources_run():
    for row in TP_PP_ROWS:
        lay = Layout.parse(row.layout)
        assert lay.tp_overlap and lay.sequence_parallel
        assert ("tp_comm_overlap" in row.note and "True" in row.note) or row.note.startswith("as above")
        plain = pr.without_overlap(row)
        assert not Layout.parse(plain.layout).tp_overlap and plain.tokens_per_gpu == row.tokens_per_gpu


def test_the_nemo_rows_run_megatrons_overlapped_distributed_optimizer_as_their_sources_run():
    for row in TP_PP_ROWS:
        lay = Layout.parse(row.layout)
        assert lay.zero == 1 and lay.dp_overlap
        assert "distributed optimizer overlapped" in row.note
        sources = ("overlap_param_sync: true", "overlap_param_gather=True", "CommOverlapConfig")
        assert any(k in row.note for k in sources)
        plain = pr.without_dp_overlap(row)
        assert not Layout.parse(plain.layout).dp_overlap and Layout.parse(plain.layout).tp_overlap
    assert all(pr.without_dp_overlap(r) is None for r in pr.ROWS if r not in TP_PP_ROWS)


def test_nemo_rows_run_fused_kernels_and_the_fsdp_rows_eager():
    for row in pr.ROWS:
        argv = pr.plan_argv(row)
        if row.name.startswith("NeMo"):
            assert row.kernels == "fused" and argv[argv.index("--kernels") + 1] == "fused"
            assert "default_layer_spec" in row.note
        else:
            assert row.kernels == "eager" and "--kernels" not in argv


def test_selective_op_keeps_the_fused_attention_too():
    a, f, m = KINDS.index("attention"), KINDS.index("attention_fused"), KINDS.index("matmul")
    assert pr.selective_op_recomputed(np.array([m, a, f, m])).tolist() == [False, False, False, True]
