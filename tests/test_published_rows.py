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
