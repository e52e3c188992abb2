"""Published training throughput against the layout evaluator: tokens/s per GPU and MFU, row by row.

Every row is a published measurement of a training run (model shape, GPU, number of GPUs, layout, micro-batch,
global batch, sequence length, activation checkpointing), its source (repository, file, table and row) beside
it. Each is evaluated exactly as ``plan --parallel`` evaluates a layout: its command line
(:func:`plan_argv`) is parsed by the workbench's own parser, the model (``benchmarks/published_models.py``) is
profiled under fake tensors for the row's GPU by :class:`~workbench.parallel.profiles.RankChains` (cached by
content under ``build/profiles``), and :func:`workbench.parallel.evaluate.evaluate` prices the step (the pipeline,
FSDP's gathers and reductions, the optimizer) on :func:`workbench.front.layouts.job_from_args`'s job. One
approximation: torchtitan's selective activation checkpointing by operation is not a policy of the model
(keep, recompute, offload): :func:`selective_op` adds to each block's backward the recompute of the
operations the policy does not save, priced by the same kernel time model; the memory is that of ``keep``
(so such a row's memory is not checked).

Only torchtitan's Llama-3.1-8B FSDP row on 8 H100s entered the calibration of the time model
(``benchmarks/roofline.py``); every other row is HELD OUT: nothing was fitted to it. A row with ``tp > 1`` is
evaluated on the per-rank tensor-parallel chain ``plan --parallel`` profiles for it (``RankChains(tp, mbs)``), its
job (the parameters of MFU) from the tp = 1 chain, as ``plan --parallel`` takes it.

    .venv/bin/python benchmarks/published_rows.py          # a few minutes the first time (profiles), then seconds

MFU: predicted by 6 N FLOPs a token over the GPU's dense bf16 peak (``plan --parallel``'s convention); the
published MFU as its source states it (llm-foundry's adds attention's FLOPs; torchtitan's counts 6 N plus
attention as well, over the H100 SXM's peak).

Measured 2026-11-29 (docs/results.md, "Published training throughput"), predicted / published tokens/s per GPU:

=============================================  ==================  ==========  ===========  =====
row                                            GPUs                predicted   published    ratio
=============================================  ==================  ==========  ===========  =====
torchtitan Llama-3.1-8B FSDP, selective op     8 h100-96gb-500w    5,735       5,762        1.00 (calibration)
torchtitan Llama-3-8B FSDP, selective op       64 a100-80gb        2,760       2,973        0.93
torchtitan Llama-3-70B FSDP, full              64 a100-80gb        307         331          0.93
llm-foundry MPT-70B, full, mbs 8               64 h100-sxm         1,058       1,039        1.02
llm-foundry MPT-30B, full, mbs 3               8 h100-sxm          2,225       2,002        1.11
llm-foundry MPT-13B, none, mbs 2               8 h100-sxm          5,865       4,792        1.22
llm-foundry MPT-7B, none, mbs 6                8 h100-sxm          11,868      10,643       1.12
llm-foundry MPT-70B, full, mbs 8               64 a100-80gb        379         410          0.92
llm-foundry MPT-30B, full, mbs 3               8 a100-80gb         811         916          0.89
llm-foundry MPT-13B, none, mbs 2               8 a100-80gb         2,370       2,262        1.05
llm-foundry MPT-7B, none, mbs 6                8 a100-80gb         4,574       4,641        0.99
NeMo Nemotron-4 15B, TP 4 DP 4, mbs 4          16 h100-sxm         5,405       5,826        0.93
NeMo Nemotron-4 15B, TP 4 DP 16, mbs 4         64 h100-sxm         5,429       5,759        0.94
NeMo Nemotron-4 15B, TP 2 DP 8, mbs 2          16 h100-sxm         5,364       5,966        0.90
NeMo Llama-3-70B SFT, TP 4 PP 4x5 DP 2, mbs 1  32 h100-sxm         1,018       1,219        0.83
=============================================  ==================  ==========  ===========  =====

FSDP rows, held out: 9 of 10 within 15 %, all within 25 %. The miss, MPT-13B on H100 (+22 %), is the table's
shortest step (0.86 s, one micro-batch a step): likely what a step pays once (the optimizer, the first gather and
last reduce-scatter, NCCL's kernels taking SMs), which weighs most there. Tensor/pipeline-parallel rows (held
out): 3 of 4 within 15 %, all within 25 %; with them 12 of 14 held-out rows are within 15 % and all within 25 %.
Each NeMo row is evaluated with what its source runs, each setting with its source line in the row's note:
sequence parallelism and Megatron's vocabulary-parallel loss (``sp=1,lp=1``), Transformer Engine's fused kernels
(``--kernels fused``: fused norms, activation, rotary and cross-entropy, cuDNN attention, sequence-first
collectives without torch's reorder copies; docs/model.md, "Fused kernels"), TP communication overlap (``tpo=1``,
TE's userbuffers) and Megatron's distributed optimizer with its overlapped reduce-scatter and gather (``dpo=1``).
Nothing was fitted on them. How the ratios moved, 2026-11-29, one setting added at a time (docs/results.md):

================================  ========  =========  ==========  ============  ==============  ========
row                               eager     +sp, lp    +fused      +tpo          +seq-first      +dpo
================================  ========  =========  ==========  ============  ==============  ========
Nemotron-4 15B TP 4 DP 4          0.67      0.69       0.80        0.85          0.90            0.93
Nemotron-4 15B TP 4 DP 16         0.67      0.70       0.81        0.86          0.90            0.94
Nemotron-4 15B TP 2 DP 8          0.72      0.71       0.80        0.80          0.82            0.90
Llama-3-70B SFT TP 4 PP 4x5 DP 2  0.58      0.67       0.79        0.82          0.83            0.83
================================  ========  =========  ==========  ============  ==============  ========

What is left on the 70B row (read from its chains; hypotheses, not fits): the pipeline's imbalance (the head and
its loss on the last rank: its slowest rank works 6 % above the mean, the flush 4.0 % above that, the textbook
interleaved bubble 3 / 80 plus sends), SFT's packed short sequences priced as one 4096-token causal sequence
(attention about 4 % of the step), and Megatron's fused QKV and gate/up projections (two full-size gradient adds a
block here).

    .venv/bin/python benchmarks/published_rows.py --only NeMo --compare-kernels   # eager and fused side by side
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workbench.model.chain import Chain  # noqa: E402
from workbench.parallel.evaluate import Evaluation  # noqa: E402
from workbench.profiles.kernel_time import H100_CALIBRATION, KINDS, Calibration  # noqa: E402

MODELS = REPO / "benchmarks" / "published_models.py"
CHECKPOINTING = {"none": "keep", "full": "recompute", "selective-op": "keep"}

TORCHTITAN_H100 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TORCHTITAN_A100 = "pytorch/torchtitan docs/performance.md, \"Llama 3 performance numbers\" (64 A100 80GB)"
FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
#: NVIDIA's DGX Cloud benchmarking recipes (DGX H100: 8 H100 SXM a node, 400 Gb/s InfiniBand a GPU: the
#: workbench's default 50 GB/s between nodes); tokens/s per GPU = the README's tokens/s over its GPUs
DGXC = "NVIDIA/dgxc-benchmarking"
#: NeMo 2.0's recommended H100 configurations (micro-batch, recompute) of the DGXC rows measured with NeMo 2.0
NEMO_H100_CONFIGS = "NVIDIA/NeMo scripts/performance/recommended_model_configs/model_configs_h100.csv"
#: NeMo Framework Launcher 24.12's Nemotron-4 15B (shape, no recompute, sequence parallel, distributed Adam)
NEMOTRON_YAML = "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_15b.yaml"
#: NeMo 2.0's performance scripts set sequence parallelism wherever tp > 1
NEMO_PERF_SP = "NVIDIA/NeMo scripts/performance/helpers.py, set_primary_perf_configs (sequence_parallel = tp_size > 1)"
#: Megatron-Core computes the loss vocabulary-parallel (its cross-entropy split over TP): lp=1 on every TP row
MEGATRON_LOSS = "vocabulary-parallel loss: Megatron-Core's only cross-entropy under TP"
#: TP communication overlap (Transformer Engine's userbuffers) on in the sources' configurations: tpo=1
NEMOTRON_TPO = ("TP communication overlap on: " + NEMOTRON_YAML + ", model.ub_tp_comm_overlap: True (Megatron's "
                "--tp-comm-overlap)")
NEMOTRON_PERF_TPO = ("TP communication overlap on: NVIDIA/NeMo nemo/collections/llm/recipes/nemotron4_15b.py, "
                     "pretrain_performance_optimizations (MegatronCommOverlapCallback(tp_comm_overlap=True), what "
                     "scripts/performance/llm/pretrain_nemotron4_15b.py runs: pretrain_recipe(performance_mode=True))")
LLAMA70B_SFT_TPO = ("TP communication overlap on: NVIDIA-NeMo/Megatron-Bridge's performance config of this row (Llama3 "
                    "70B SFT, 32x H100, TP=4 PP=4 VP=5, GBS 32: CommOverlapConfig(tp_comm_overlap=True))")
#: NeMo builds Megatron-Core's GPT model with Transformer Engine's layers whenever TE is installed (as in NeMo's
#: containers the DGXC recipes run) and fuses the cross-entropy by default: the rows are profiled with
#: ``--kernels fused`` (docs/model.md, "Fused kernels")
#: ZeRO-1 as Megatron's distributed optimizer with its overlaps (``dpo=1``): the sources' settings
NEMOTRON_DPO = ("distributed optimizer overlapped: " + NEMOTRON_YAML + ", optim: name: distributed_fused_adam, "
                "overlap_grad_sync: True, overlap_param_sync: true; " + DGXC + " nemotron/nemotron4-15b-synth.yaml "
                "(commit 8f5cbb3), optim: name: mcore_distributed_optim, overlap_grad_sync: True, overlap_param_sync: "
                "true, which NVIDIA/NeMo nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py, "
                "setup_mcore_distributed_parallel, turns into DistributedDataParallelConfig(grad_reduce_in_fp32="
                "(optim.grad_sync_dtype, default fp32) == fp32, overlap_grad_reduce, overlap_param_gather, "
                "bucket_size=optim.ddp_bucket_size: unset, Megatron's default)")
NEMOTRON_PERF_DPO = ("distributed optimizer overlapped: NVIDIA/NeMo nemo/collections/llm/recipes/nemotron.py, "
                     "nemotron_trainer (DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce="
                     "True, overlap_param_gather=True)) with nemotron4_15b.py's optim distributed_fused_adam_with_"
                     "cosine_annealing (use_distributed_optimizer=True); MegatronCommOverlapCallback "
                     "(nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py, _get_optimizer_overlap_cfgs) sets "
                     "both overlaps with buckets of 128 Mi parameters when dp > 1 (priced at Megatron's default 40 M: "
                     "docs/results.md gives the difference)")
LLAMA70B_SFT_DPO = ("distributed optimizer overlapped: NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/llama/"
                    "llama3_llm_finetune.py, llama3_70b_sft_config_h100 (use_distributed_optimizer = True; "
                    "CommOverlapConfig, whose _get_optimizer_overlap_cfgs sets both overlaps, 128 Mi-parameter "
                    "buckets and align_param_gather when dp > 1 and vp > 1); it sets grad_reduce_in_fp32 = False "
                    "(bf16 gradients), priced in fp32 here: the row's reductions hide behind the drain either way")
NEMO_TE = ("fused kernels: NVIDIA/NeMo nemo/collections/llm/gpt/model/base.py, default_layer_spec (HAVE_TE: "
           "transformer_engine_layer_spec) and GPTConfig (cross_entropy_loss_fusion = True)")


@dataclass(frozen=True)
class Row:
    """One published row: what ran (``model``: a builder of ``benchmarks/published_models.py``), its layout
    (``plan --parallel``'s ``tp=..,pp=..,dp=..,zero=..``), micro-batch and global batch (samples), checkpointing
    (``none``, ``full``, ``selective-op``), and what was measured (tokens/s per GPU, MFU as published)."""

    name: str
    source: str
    model: str
    gpu: str
    gpus: int
    layout: str
    micro_batch: int
    global_batch: int
    sequence: int
    checkpointing: str
    tokens_per_gpu: float
    mfu: float | None = None
    calibration: bool = False
    node_bandwidth: str | None = None
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    note: str = ""
    kernels: str = "eager"


_FOUNDRY_H100 = FOUNDRY + ", table \"H100 80GB BF16\""
_FOUNDRY_A100 = FOUNDRY + ", table \"A100 80GB with 1600 Gbps node-node interconnect (RoCE)\""
#: llm-foundry's A100 nodes: 1600 Gb/s a node of 8 GPUs, 25 GB/s a GPU one way
_ROCE_1600 = "25GB/s"

ROWS = (
    Row("torchtitan Llama-3.1-8B FSDP", TORCHTITAN_H100 + ", Table 1, row FSDP (settings: train_configs/"
        "llama3_8b.toml at torchtitan 9dec370: seq_len 8192, selective_ac_option op, compile off)",
        "llama31_8b_8192", "h100-96gb-500w", 8, "tp=1,pp=1,dp=8,zero=3", 2, 16, 8192, "selective-op", 5762.0,
        calibration=True),
    Row("torchtitan Llama-3-8B FSDP", TORCHTITAN_A100 + ", row 8B, batch 1, selective op (seq_len 8192: "
        "train_configs/llama3_8b.toml)", "llama31_8b_8192", "a100-80gb", 64, "tp=1,pp=1,dp=64,zero=3", 1, 64, 8192,
        "selective-op", 2973.0, 0.582, note="node links not published: 50 GB/s a GPU assumed"),
    Row("torchtitan Llama-3-70B FSDP", TORCHTITAN_A100 + ", row 70B, batch 1, full (seq_len 8192: "
        "train_configs/llama3_70b.toml)", "llama3_70b_8192", "a100-80gb", 64, "tp=1,pp=1,dp=64,zero=3", 1, 64, 8192,
        "full", 331.0, 0.517, note="node links not published: 50 GB/s a GPU assumed"),
    Row("llm-foundry MPT-70B", _FOUNDRY_H100 + ", row 70b 2048 64", "mpt_70b_2048", "h100-sxm", 64,
        "tp=1,pp=1,dp=64,zero=3", 8, 2048, 2048, "full", 1039.0, 0.4257),
    Row("llm-foundry MPT-30B", _FOUNDRY_H100 + ", row 30b 2048 8", "mpt_30b_2048", "h100-sxm", 8,
        "tp=1,pp=1,dp=8,zero=3", 3, 504, 2048, "full", 2002.0, 0.3811),
    Row("llm-foundry MPT-13B", _FOUNDRY_H100 + ", row 13b 2048 8", "mpt_13b_2048", "h100-sxm", 8,
        "tp=1,pp=1,dp=8,zero=3", 2, 16, 2048, "none", 4792.0, 0.3979),
    Row("llm-foundry MPT-7B", _FOUNDRY_H100 + ", row 7b 2048 8", "mpt_7b_2048", "h100-sxm", 8,
        "tp=1,pp=1,dp=8,zero=3", 6, 48, 2048, "none", 10643.0, 0.4644),
    Row("llm-foundry MPT-70B", _FOUNDRY_A100 + ", row 70b 2048 64", "mpt_70b_2048", "a100-80gb", 64,
        "tp=1,pp=1,dp=64,zero=3", 8, 2048, 2048, "full", 410.0, 0.5333, node_bandwidth=_ROCE_1600),
    Row("llm-foundry MPT-30B", _FOUNDRY_A100 + ", row 30b 2048 8", "mpt_30b_2048", "a100-80gb", 8,
        "tp=1,pp=1,dp=8,zero=3", 3, 504, 2048, "full", 916.0, 0.553),
    Row("llm-foundry MPT-13B", _FOUNDRY_A100 + ", row 13b 2048 8", "mpt_13b_2048", "a100-80gb", 8,
        "tp=1,pp=1,dp=8,zero=3", 2, 48, 2048, "none", 2262.0, 0.5957),
    Row("llm-foundry MPT-7B", _FOUNDRY_A100 + ", row 7b 2048 8", "mpt_7b_2048", "a100-80gb", 8,
        "tp=1,pp=1,dp=8,zero=3", 6, 96, 2048, "none", 4641.0, 0.6423),
    # tensor and pipeline parallelism (Megatron-Core in NeMo; distributed Adam: ZeRO-1 over the data-parallel group)
    Row("NeMo Nemotron-4 15B TP 4", DGXC + " nemotron/README_15b.md (commit 0b71cfd), table \"Nemotron4 15b BF16 "
        "(TP=4, PP=1, MBS=4, GA=4)\", column 16x H100 (GBS=64): step 2.812 s, 93223 tokens/s; settings: "
        + NEMOTRON_YAML,
        "nemotron4_15b_4096", "h100-sxm", 16, "tp=4,pp=1,dp=4,zero=1,sp=1,lp=1,tpo=1,dpo=1", 4, 64, 4096, "none",
        93223.0 / 16, 0.6249, kernels="fused",
        note="sequence parallelism on (the YAML's sequence_parallel: True); " + MEGATRON_LOSS
        + "; " + NEMOTRON_TPO + "; " + NEMOTRON_DPO + "; " + NEMO_TE),
    Row("NeMo Nemotron-4 15B TP 4", DGXC + " nemotron/README_15b.md (commit 0b71cfd), same table, column 64x H100 "
        "(GBS=256): step 2.845 s, 368568 tokens/s; settings: " + NEMOTRON_YAML,
        "nemotron4_15b_4096", "h100-sxm", 64, "tp=4,pp=1,dp=16,zero=1,sp=1,lp=1,tpo=1,dpo=1", 4, 256, 4096, "none",
        368568.0 / 64, 0.6177, kernels="fused", note="as above; " + NEMOTRON_DPO + "; " + NEMO_TE),
    Row("NeMo Nemotron-4 15B TP 2", DGXC + " nemotron/README.md (commit 1f6d9f4), table \"Nemotron4 15b BF16 H100\", "
        "16x H100: step 2.746 s, 95463 tokens/s (layout: its H100 table, TP 2, PP 1, DP 8, MBS 2, GBS 64); "
        "recompute: " + NEMO_H100_CONFIGS + ", row pre_train nemotron4 15b bf16 (recompute_layers 0)",
        "nemotron4_15b_4096", "h100-sxm", 16, "tp=2,pp=1,dp=8,zero=1,sp=1,lp=1,tpo=1,dpo=1", 2, 64, 4096, "none",
        95463.0 / 16, 0.567, kernels="fused",
        note="NeMo 2.0 recipe; sequence parallelism on: " + NEMO_PERF_SP + "; " + MEGATRON_LOSS
        + "; " + NEMOTRON_PERF_TPO + "; " + NEMOTRON_PERF_DPO + "; " + NEMO_TE),
    Row("NeMo Llama-3-70B SFT TP 4 PP 4 VP 5", DGXC + " llama3/finetuning/README_70b.md (commit 8f5cbb3), table "
        "\"Llama3 70b Finetuning SFT BF16 (TP=4, PP=4, CP=1, VP=5)\", 32x H100 (GBS=32): step 3.36 s, 39009 tokens/s; "
        "sequence 4096, micro-batch 1, no recompute: " + NEMO_H100_CONFIGS + ", row sft llama3 70b bf16",
        "llama3_70b_4096", "h100-sxm", 32, "tp=4,pp=4,dp=2,zero=1,schedule=interleaved-1f1b,chunks=5,sp=1,lp=1,tpo=1,"
        "dpo=1",
        1, 32, 4096, "none", 39009.0 / 32, 0.511, kernels="fused",
        note="full-parameter SFT on sequences packed to 4096 tokens, priced as one 4096-token causal sequence; "
             "Megatron's interleaved 1F1B as torch's interleaved-1f1b; sequence parallelism on: " + NEMO_PERF_SP
             + "; " + MEGATRON_LOSS + "; " + LLAMA70B_SFT_TPO + "; " + LLAMA70B_SFT_DPO + "; " + NEMO_TE),
)


def plan_argv(row: Row, models: Path = MODELS) -> list[str]:
    """The ``plan --parallel`` command line of ``row`` (without the program's name).

    >>> r = ROWS[3]
    >>> " ".join(plan_argv(r, Path("m.py")))  # doctest: +NORMALIZE_WHITESPACE
    'plan --module m.py:mpt_70b_2048 --fake --gpu h100-sxm --devices 64 --devices-per-node 8 --global-batch 2048
     --parallel tp=1,pp=1,dp=64,zero=3,mbs=8 --activations recompute --optimizer adamw --precision bf16-mixed
     --quiet'
    """
    if row.checkpointing not in CHECKPOINTING:
        raise ValueError(f"{row.name}: checkpointing {row.checkpointing!r}; known: {', '.join(CHECKPOINTING)}")
    argv = ["plan", "--module", f"{models}:{row.model}", "--fake", "--gpu", row.gpu, "--devices", str(row.gpus),
            "--devices-per-node", str(min(8, row.gpus)), "--global-batch", str(row.global_batch),
            "--parallel", f"{row.layout},mbs={row.micro_batch}", "--activations", CHECKPOINTING[row.checkpointing],
            "--optimizer", row.optimizer, "--precision", row.precision, "--quiet"]
    if row.node_bandwidth:
        argv += ["--node-bandwidth", row.node_bandwidth]
    if row.kernels != "eager":
        argv += ["--kernels", row.kernels]
    return argv


#: a transformer block's layer name: Hugging Face's Llama (``model.layers.3``) and GPT-2 (``transformer.h.3``)
BLOCK = re.compile(r"(^|\.)(layers|h)\.\d+$")


def selective_op_recomputed(kind: np.ndarray) -> np.ndarray:
    """Which of a block's forward operations (kinds, :data:`~workbench.profiles.kernel_time.KINDS` indices) its
    backward runs again under torchtitan's selective checkpointing by operation: every one but attention's
    and the odd-numbered matmuls' (1st, 3rd, ...), whose outputs are saved (torchtitan's ``_save_list`` policy
    recomputes every second matmul).

    >>> m, a, x = KINDS.index("matmul"), KINDS.index("attention"), KINDS.index("memory")
    >>> selective_op_recomputed(np.array([x, m, m, m, a, x, m])).tolist()
    [True, False, True, False, False, True, True]
    """
    kind = np.asarray(kind)
    out = ~np.isin(kind, [KINDS.index("attention"), KINDS.index("attention_fused")])
    matmuls = np.flatnonzero(kind == KINDS.index("matmul"))
    out[matmuls[0::2]] = False
    return out


def selective_op(chain: Chain, calibration: Calibration = H100_CALIBRATION) -> Chain:
    """``chain`` (a fake profile with its operations) with each block's backward lengthened by the recompute of
    :func:`selective_op_recomputed`, priced for the chain's GPU (no start-up of its own: it runs inside the
    backward)."""
    from workbench.model.accelerators import accelerator
    from workbench.profiles.kernel_time import phase_seconds
    from workbench.profiles.retime import decode_works

    phases = decode_works(str(chain.meta["work"]))
    gpu = accelerator(str(chain.meta["gpu"]))
    inside = dataclasses.replace(calibration, overhead=0.0)
    layers = []
    for layer, (fwd, _) in zip(chain.layers, phases):
        if BLOCK.search(layer.name):
            r = selective_op_recomputed(fwd.kind)
            extra = phase_seconds(fwd.kind[r], fwd.precision[r], fwd.flops[r], fwd.bytes[r], fwd.aligned[r], gpu,
                                  inside, False) if r.any() else 0.0
            layer = dataclasses.replace(layer, backward=layer.backward + extra)
        layers.append(layer)
    return dataclasses.replace(chain, layers=tuple(layers))


def row_args(row: Row) -> argparse.Namespace:
    """``row``'s command line parsed by the workbench's own parser."""
    from workbench.front.cli import build_parser

    return build_parser().parse_args(plan_argv(row))


def row_tp(row: Row) -> int:
    """The tensor-parallel degree of ``row``'s layout.

    >>> row_tp(ROWS[0]), row_tp(ROWS[-1])
    (1, 4)
    """
    return row_switches(row)[0]


def row_switches(row: Row) -> tuple[int, bool, bool]:
    """(tp, sequence parallelism, vocabulary-parallel loss) of ``row``'s layout.

    >>> row_switches(ROWS[0]), row_switches(ROWS[-1])
    ((1, False, False), (4, True, True))
    """
    from workbench.model.layout import Layout

    lay = Layout.parse(row.layout)
    return lay.tp, lay.sequence_parallel, lay.loss_parallel


def base_chain(row: Row, cache: Path | None = None, tp: int = 1, kernels: str | None = None) -> Chain:
    """The chain of one rank of ``row`` (``tp``, its micro-batch; for the row's tp its sequence parallelism and
    loss) as ``plan --parallel`` makes it: RankChains of the module under fake tensors for the row's GPU (tp > 1:
    the per-rank tensor-parallel profile), cached by content (``build/profiles``), with ``kernels`` (None: the
    row's)."""
    from workbench.parallel.profiles import DEFAULT_CACHE, RankChains

    args = row_args(row)
    row_tp_, sp, lp = row_switches(row)
    switches = {"sequence_parallel": sp, "loss_parallel": lp} if tp == row_tp_ and tp > 1 else {}
    return RankChains(args.module, gpu=args.gpu, cache=cache or REPO / DEFAULT_CACHE,
                      kernels=kernels or row.kernels)(tp, row.micro_batch, **switches)


def priced(row: Row, chain: Chain, calibration: Calibration | None = None) -> Chain:
    """``chain`` re-estimated under ``calibration`` (None: as profiled), with :func:`selective_op` when the row
    checkpoints by operation."""
    from workbench.profiles.retime import retimed

    if calibration is not None:
        chain = retimed(chain, row.gpu, calibration)
    return selective_op(chain, calibration or H100_CALIBRATION) if row.checkpointing == "selective-op" else chain


def evaluate_row(row: Row, calibration: Calibration | None = None, chain: Chain | None = None,
                 kernels: str | None = None) -> Evaluation:
    """``row`` evaluated as ``plan --parallel`` evaluates its command line (module docstring); ``chain``: its
    :func:`base_chain` when already made; ``kernels``: the profiles' (None: the row's)."""
    from workbench.front.layouts import _layout_arg, job_from_args
    from workbench.parallel.evaluate import evaluate

    args = row_args(row)
    tp = row_tp(row)
    if tp > 1 and calibration is not None:
        raise ValueError(f"{row.name}: a calibration re-estimates tp=1 chains only (this row's tp is {tp})")
    first = priced(row, base_chain(row, kernels=kernels) if chain is None else chain, calibration)
    rank = first if tp == 1 else priced(row, base_chain(row, tp=tp, kernels=kernels))

    _, sp, lp = row_switches(row)

    def chain_for(t: int, mbs: int | None, sequence_parallel: bool = False, loss_parallel: bool = False) -> Chain:
        if (t, mbs, sequence_parallel, loss_parallel) != (tp, row.micro_batch, sp, lp):
            raise ValueError(f"{row.name}: only tp={tp}, micro-batch size {row.micro_batch}, sp={int(sp)}, "
                             f"lp={int(lp)} are profiled")
        return rank

    # the job (the parameters of MFU, the tokens of a sample) from the tp=1 chain, as plan --parallel takes it
    return evaluate(job_from_args(args, first), _layout_arg(args), chain_for, args.activations)


def without_overlap(row: Row) -> Row | None:
    """``row`` with its TP communication overlap off (``tpo=1`` dropped); None when it has none.

    >>> "tpo=1" in without_overlap(ROWS[-1]).layout, without_overlap(ROWS[0])
    (False, None)
    """
    return without(row, "tpo=1")


def without_dp_overlap(row: Row) -> Row | None:
    """``row`` with ZeRO-1 as torch runs it (``dpo=1`` dropped); None when it has none.

    >>> without_dp_overlap(ROWS[-1]).layout.endswith("tpo=1"), without_dp_overlap(ROWS[0])
    (True, None)
    """
    return without(row, "dpo=1")


def without(row: Row, item: str) -> Row | None:
    """``row`` with ``item`` dropped from its layout; None when it has none."""
    parts = row.layout.split(",")
    if item not in parts:
        return None
    return dataclasses.replace(row, layout=",".join(p for p in parts if p != item))


def _dp_seconds(e: Evaluation) -> float:
    """What data parallelism adds to ``e``'s step: its exposed collectives and the gather after the step."""
    return e.breakdown.get("data_parallel", 0) + e.breakdown.get("post_step", 0)


def print_switched(results: list[tuple[Row, Evaluation]], item: str, title: str,
                   detail: Callable[[Evaluation, Evaluation], str] | None = None) -> None:
    """For each row whose layout has ``item`` (e.g. ``tpo=1``): its ratio and step without it -> with it (the row
    evaluated again without it), under ``title``; ``detail(without, with)`` adds to each line."""
    switched = [(row, without(row, item), e) for row, e in results if without(row, item) is not None]
    if switched:
        print(f"\n{title}, predicted / published without -> with:")
    for row, plain, e in switched:
        old = evaluate_row(plain)
        print(f"  {row.name} ({layout_label(row)}, {row.gpus} GPUs): {tps_ratio(plain, old):.2f} -> "
              f"{tps_ratio(row, e):.2f} (step {old.step_seconds:.3f} -> {e.step_seconds:.3f} s"
              f"{detail(old, e) if detail else ''})")


def verdict(ratio: float) -> str:
    """``within 15 %``, ``within 25 %`` or ``MISSES 25 %`` for predicted / published.

    >>> verdict(1.10), verdict(0.80), verdict(1.3)
    ('within 15 %', 'within 25 %', 'MISSES 25 %')
    """
    err = abs(ratio - 1)
    return "within 15 %" if err <= 0.15 else "within 25 %" if err <= 0.25 else "MISSES 25 %"


def layout_label(row: Row) -> str:
    """``row``'s layout in short: ``FSDP 8``, ``TP 4 DP 4``, ``TP 4 PP 4x5 DP 2`` (PP ranks x virtual stages).

    >>> layout_label(ROWS[0]), layout_label(ROWS[-1])
    ('FSDP 8', 'TP 4 PP 4x5 DP 2')
    """
    from workbench.model.layout import Layout

    lay = Layout.parse(row.layout)
    if lay.tp == lay.pp == 1 and lay.zero == 3:
        return f"FSDP {lay.dp}"
    parts = [f"TP {lay.tp}"] if lay.tp > 1 else []
    if lay.pp > 1:
        parts.append(f"PP {lay.pp}" + (f"x{lay.chunks}" if lay.chunks > 1 else ""))
    return " ".join(parts + [f"DP {lay.dp}"])


def table(results: list[tuple[Row, Evaluation]]) -> str:
    """The rows, predicted against published."""
    head = (f"{'row':<36} {'GPU':<15} {'n':>3} {'layout':<17} {'mbs':>3} {'seq':>5} {'AC':<12} {'pred tok/s/GPU':>14} "
            f"{'published':>9} {'ratio':>6} {'MFU pred':>8} {'MFU pub':>7}  {'':<11} {'':<10}")
    lines = [head, "-" * len(head)]
    for row, e in results:
        tps = e.tokens_per_second / row.gpus
        ratio = tps / row.tokens_per_gpu
        pub = f"{row.mfu:.1%}" if row.mfu is not None else "-"
        lines.append(f"{row.name:<36} {row.gpu:<15} {row.gpus:>3} {layout_label(row):<17} {row.micro_batch:>3} "
                     f"{row.sequence:>5} "
                     f"{row.checkpointing:<12} {tps:>14,.0f} {row.tokens_per_gpu:>9,.0f} {ratio:>6.2f} "
                     f"{e.mfu:>8.1%} {pub:>7}  {verdict(ratio):<11} "
                     f"{'CALIBRATION' if row.calibration else 'HELD OUT':<10}")
    held = [tps_ratio(r, e) for r, e in results if not r.calibration]
    if held:
        within = sum(abs(x - 1) <= 0.15 for x in held)
        lines.append(f"held out: {within} of {len(held)} within 15 %, {sum(abs(x - 1) <= 0.25 for x in held)} "
                     f"within 25 % (target: 80 % within 15 %, all within 25 %); median ratio "
                     f"{float(np.median(held)):.2f}")
    split = [tps_ratio(r, e) for r, e in results if not r.calibration and layout_label(r).startswith(("TP", "PP"))]
    if split:
        lines.append(f"  of which tensor/pipeline-parallel: {sum(abs(x - 1) <= 0.15 for x in split)} of {len(split)} "
                     f"within 15 %, {sum(abs(x - 1) <= 0.25 for x in split)} within 25 %, ratios "
                     f"{min(split):.2f}-{max(split):.2f}")
    return "\n".join(lines)


def kernels_table(compared: list[tuple[Row, Evaluation, Evaluation]]) -> str:
    """Rows profiled with eager and with fused kernels: predicted / published tokens/s per GPU side by side."""
    head = (f"{'row':<36} {'layout':<17} {'published':>9} {'eager':>7} {'ratio':>6} {'fused':>7} {'ratio':>6} "
            f"{'fullest rank eager / fused':>26}")
    lines = ["kernels: Hugging Face's eager against fused (docs/model.md, \"Fused kernels\")", head, "-" * len(head)]
    for row, eager, fused in compared:
        te, tf = eager.tokens_per_second / row.gpus, fused.tokens_per_second / row.gpus
        lines.append(f"{row.name:<36} {layout_label(row):<17} {row.tokens_per_gpu:>9,.0f} {te:>7,.0f} "
                     f"{tps_ratio(row, eager):>6.2f} {tf:>7,.0f} {tps_ratio(row, fused):>6.2f} "
                     f"{eager.peak / 2**30:>12.1f} / {fused.peak / 2**30:.1f} GiB")
    return "\n".join(lines)


def tps_ratio(row: Row, e: Evaluation) -> float:
    return e.tokens_per_second / row.gpus / row.tokens_per_gpu if math.isfinite(e.step_seconds) else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="the rows whose name contains this (case-insensitive)")
    ap.add_argument("--compare-kernels", action="store_true",
                    help="the rows profiled with fused kernels evaluated with eager ones too, side by side")
    args = ap.parse_args()
    rows = [r for r in ROWS if args.only is None or args.only.lower() in r.name.lower()]
    results, compared = [], []
    for row in rows:
        t0 = time.perf_counter()
        e = evaluate_row(row)
        print(f"  {row.name} on {row.gpus} {row.gpu}: step {e.step_seconds:.3f} s "
              f"({', '.join(f'{k} {v:.3f}' for k, v in e.breakdown.items())}), {e.status}, "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        results.append((row, e))
        if args.compare_kernels and row.kernels != "eager":
            compared.append((row, evaluate_row(row, kernels="eager"), e))
    print(table(results))
    print_switched(results, "tpo=1", "TP communication overlap (tpo=1, as the sources run)")
    print_switched(results, "dpo=1", "ZeRO-1 as Megatron's overlapped distributed optimizer (dpo=1, as the sources "
                   "run)", lambda old, e: f"; data parallel + post-step {_dp_seconds(old):.3f} -> "
                                          f"{_dp_seconds(e):.3f} s")
    if compared:
        print("\n" + kernels_table(compared))
    print("\nsources:")
    for row in rows:
        print(f"  {row.name} ({row.gpu} x {row.gpus}): {row.source}" + (f"; {row.note}" if row.note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
