"""GPU time of the models people train: Llama-3-8B on one H100, and torchtitan's Llama-3.1-8B FSDP step on 8.

The fake profile's time model (:mod:`workbench.profiles.kernel_time`) against what large-model training
measures. Llama is built from Meta's published shapes (``examples/llama3.py``: Hugging Face's
``LlamaForCausalLM``, random weights, bf16) with two of its blocks and profiled under fake tensors; every
block is the same, so the model's time is the embedding, ``layers`` times a block, the final norm and the
LM head with its float32 cross-entropy.

Targets (issue "GPU time that matches what large-model training measures"):

* Llama-3-8B on one H100 SXM, forward and backward of one 2048-token micro-batch: 200-330 ms (30-50 % MFU by
  6 N FLOPs per token, N = 8.03e9 parameters);
* torchtitan's Llama-3.1-8B FSDP row (:data:`TORCHTITAN`, the calibration's only training row): predicted
  tokens/s per GPU within 15 %. Its settings, as its source states them: 8 H100s of one node, FSDP2 (bf16
  parameters all-gathered, float32 gradients reduce-scattered), local batch 2 of 8192 tokens, selective
  activation checkpointing by operation (torchtitan's default: the outputs of every matmul but every second
  one, and of attention, are kept; the rest of each block's forward runs again in its backward), no
  torch.compile, no Float8, AdamW (foreach), gradient clipping at norm 1; H100s with 96 GB HBM2e at 2.4 TB/s
  and a 500 W power limit (:data:`POWER_CAPPED_CLOCK`). The step: :func:`workbench.profiles.fsdp_step.fsdp_step`.

    .venv/bin/python benchmarks/large_models.py          # about a minute
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from workbench.model.accelerators import Accelerator, accelerator  # noqa: E402
from workbench.profiles.fsdp_step import FsdpStep, Unit, fsdp_step  # noqa: E402
from workbench.profiles.kernel_time import (  # noqa: E402
    H100_CALIBRATION,
    KINDS,
    Calibration,
    gemm_efficiency,
    kernel_seconds,
)
from workbench.profiles.optimizer_time import grad_clip_seconds, optimizer_step_seconds  # noqa: E402
from workbench.profiles.roofline import LayerWork, OpWork, estimate  # noqa: E402

#: torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan; torchtitan 9dec370,
#: torch 1963fc8, 2024-12), Table 1 "1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local batch size 2,
#: global batch size 16. Selective activation checkpointing.", row "FSDP": 5,762 TPS/GPU. Sequence length,
#: checkpointing policy, optimizer and mixed precision from torchtitan 9dec370's train_configs/llama3_8b.toml
#: (seq_len 8192, selective_ac_option 'op', compile false, float8 off, max_norm 1.0) and its defaults
#: (optimizer.fused false: foreach AdamW; mixed_precision_param bfloat16, mixed_precision_reduce float32).
#: Hardware from the same file: H100 96GB HBM2e, 2.4 TB/s, NVLink within the host, 500 W power limit.
TORCHTITAN = {"source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1, row FSDP",
              "tokens_per_gpu": 5762.0, "gpus": 8, "batch": 2, "sequence": 8192, "checkpointing": "selective-op",
              "compile": False, "float8": False, "optimizer": "adamw", "implementation": "foreach"}
#: the clock of a GPU held to 500 W instead of the H100 SXM's 700 W (its datasheet's maximum power): dynamic power
#: grows with the clock times the square of the voltage, and the voltage with the clock, so P ~ f^3 and
#: f(500 W) / f(700 W) = (500/700)^(1/3) = 0.894 (a physical estimate, not a fit)
POWER_CAPPED_CLOCK = (500 / 700) ** (1 / 3)
#: the H100 of that row: the H100 SXM's NVLink, its compute at the clock of a 500 W limit, 96 GB of HBM2e at
#: 2.4 TB/s (same source)
TORCHTITAN_H100 = dataclasses.replace(
    accelerator("h100-sxm"), name="h100-96gb-500w", memory=96e9, memory_bandwidth=2.4e12,
    flops={k: v * POWER_CAPPED_CLOCK for k, v in accelerator("h100-sxm").flops.items()},
    label="NVIDIA H100 96GB HBM2e (500 W)")
LLAMA3_8B_PARAMS = 8.03e9


@dataclass(frozen=True)
class LlamaWork:
    """The work of a Llama model's layers (one block stands for all ``layers``) and their parameters."""

    embed: LayerWork
    block: LayerWork
    norm: LayerWork
    head: LayerWork
    layers: int
    block_params: float
    root_params: float

    @property
    def params(self) -> float:
        return self.layers * self.block_params + self.root_params


def llama_work(size: str, sequence: int, batch: int) -> LlamaWork:
    """``examples/llama3.py``'s Llama-3 ``size`` ("8b", "70b") on ``batch`` x ``sequence`` tokens, profiled fake."""
    import llama3

    from workbench.profiles.fake import fake_profile

    chain, times = fake_profile(lambda: llama3.llama3(size, sequence=sequence, batch=batch, layers=2), "h100-sxm",
                                return_work=True)
    names = [l.name for l in chain.layers]
    if len(names) != 5 or not names[1].endswith("layers.0"):
        raise SystemExit(f"unexpected layers for {size}: {names}")
    params = [l.weight_bytes / 2 for l in chain.layers]            # bf16
    e, b, _, n, h = times.works
    return LlamaWork(e, b, n, h, llama3.SHAPES[size][2], params[1], params[0] + params[3] + params[4])


def _subset(work: OpWork, keep: np.ndarray) -> OpWork:
    return OpWork(work.kind[keep], work.precision[keep], work.flops[keep], work.bytes[keep], work.aligned[keep])


def recompute(forward: OpWork, checkpointing: str) -> OpWork:
    """What a block's backward runs again of its forward: ``none``; ``full`` (all of it); ``selective-op``
    (torchtitan's policy: every kernel but attention and every other matmul, whose outputs are kept)."""
    if checkpointing == "none":
        return _subset(forward, np.zeros(len(forward), bool))
    if checkpointing == "full":
        return forward
    if checkpointing != "selective-op":
        raise ValueError(f"checkpointing {checkpointing!r}: none, full or selective-op")
    keep = forward.kind != KINDS.index("attention")
    matmuls = np.flatnonzero(forward.kind == KINDS.index("matmul"))
    keep[matmuls[0::2]] = False          # torchtitan counts matmuls from 1 and recomputes the even ones
    return _subset(forward, keep)


def step_units(work: LlamaWork, gpu: Accelerator, cal: Calibration, checkpointing: str) -> list[Unit]:
    """FSDP's units in forward order: the root's embedding (all the root's parameters), the blocks (with
    their recompute in the backward; the last not resharded), the root's norm and head. In a training step
    the CPU issues layer after layer without waiting for the GPU: no layer pays the start-up a profiler's
    per-layer timing does (``Calibration.overhead``)."""
    cal = dataclasses.replace(cal, overhead=0.0)

    def seconds(w: LayerWork) -> tuple[float, float]:
        return estimate(w.forward, gpu, cal), estimate(w.backward, gpu, cal, backward=True)

    ef, eb = seconds(work.embed)
    bf, bb = seconds(work.block)
    rb = estimate(recompute(work.block.forward, checkpointing), gpu, cal)
    nf, nb = seconds(work.norm)
    hf, hb = seconds(work.head)
    blocks = [Unit(f"layers.{i}", bf, bb + rb, work.block_params, regather=i < work.layers - 1)
              for i in range(work.layers)]
    return [Unit("root (embedding)", ef, eb, work.root_params, regather=False), *blocks,
            Unit("root (norm, head)", nf + hf, nb + hb, 0.0, regather=False)]


def torchtitan_step(work: LlamaWork, cal: Calibration = H100_CALIBRATION, gpu: Accelerator = TORCHTITAN_H100,
                    row: dict = TORCHTITAN) -> tuple[FsdpStep, float]:
    """The step of ``row`` (:data:`TORCHTITAN`) and its predicted tokens/s per GPU."""
    n = row["gpus"]
    units = step_units(work, gpu, cal, row["checkpointing"])
    shard = work.params / n
    opt = (optimizer_step_seconds(shard, row["optimizer"], "fp32", gpu, implementation=row["implementation"],
                                  tensors=3 + 9 * work.layers, calibration=cal)
           + grad_clip_seconds(shard, "fp32", gpu, calibration=cal))
    step = fsdp_step(units, n, gpu.link_bandwidth, param_bytes=2.0, grad_bytes=4.0, optimizer=opt)
    return step, row["batch"] * row["sequence"] / step.total


def one_gpu_seconds(work: LlamaWork, gpu: Accelerator, cal: Calibration = H100_CALIBRATION) -> float:
    """Forward and backward of the whole model on one GPU, as the fake profile's layers add up."""
    return sum(estimate(w.forward, gpu, cal) + estimate(w.backward, gpu, cal, backward=True)
               for w in (work.embed, work.norm, work.head)) + work.layers * (
        estimate(work.block.forward, gpu, cal) + estimate(work.block.backward, gpu, cal, backward=True))


def breakdown(work: LlamaWork, gpu: Accelerator, cal: Calibration = H100_CALIBRATION) -> dict[str, float]:
    """Where one GPU's forward and backward go: seconds of GEMMs, attention and memory-bound kernels on the GPU,
    and the rest of the layers' time, when the GPU waits for the CPU (launches, each layer's start-up)."""
    out = {"matmul": 0.0, "attention": 0.0, "memory-bound": 0.0}
    total = 0.0
    layers = [(w, 1) for w in (work.embed, work.norm, work.head)] + [(work.block, work.layers)]
    for w, n in layers:
        for phase, backward in ((w.forward, False), (w.backward, True)):
            t = kernel_seconds(phase.kind, phase.precision, phase.flops, phase.bytes, phase.aligned, gpu, cal,
                               backward)
            for kind, name in (("matmul", "matmul"), ("attention", "attention"), ("memory", "memory-bound")):
                out[name] += n * float(t[phase.kind == KINDS.index(kind)].sum())
            total += n * estimate(phase, gpu, cal, backward=backward)
    out["waiting for the CPU"] = total - sum(out.values())
    return out


def main() -> int:
    h100 = accelerator("h100-sxm")
    print("Llama-3-8B, one micro-batch of 2048 tokens, forward + backward on one GPU (target on h100-sxm: "
          "200-330 ms, 30-50 % MFU by 6N)")
    w8 = llama_work("8b", 2048, 1)
    for name in ("h100-sxm", "a100-80gb", "h200"):
        gpu = accelerator(name)
        t = one_gpu_seconds(w8, gpu)
        mfu = 6 * LLAMA3_8B_PARAMS * 2048 / t / gpu.peak("bfloat16")
        flag = ("  within target" if 0.200 <= t <= 0.330 else "  OUTSIDE target") if name == "h100-sxm" else ""
        print(f"  {name:<10} {t * 1e3:7.1f} ms  {2048 / t:7.0f} tokens/s  MFU {mfu:5.1%}{flag}")
    bf, bb = estimate(w8.block.forward, h100, H100_CALIBRATION), estimate(w8.block.backward, h100, H100_CALIBRATION,
                                                                           backward=True)
    print(f"  one block on h100-sxm: forward {bf * 1e3:.2f} ms, backward {bb * 1e3:.2f} ms; "
          f"2048x4096x14336 GEMM at {gemm_efficiency(2048, 14336, 4096, h100, H100_CALIBRATION):.1%} of the peak, "
          f"70B's 2048x8192x28672 at {gemm_efficiency(2048, 28672, 8192, h100, H100_CALIBRATION):.1%}")
    parts = breakdown(w8, h100)
    print("  where the h100-sxm's time goes: " + ", ".join(f"{k} {v * 1e3:.1f} ms ({v / sum(parts.values()):.0%})"
                                                         for k, v in parts.items()))
    row = TORCHTITAN
    tw = llama_work("8b", row["sequence"], row["batch"])
    step, tps = torchtitan_step(tw)
    err = tps / row["tokens_per_gpu"] - 1
    print(f"\ntorchtitan Llama-3.1-8B, FSDP on 8 H100s (96GB HBM2e, 2.4 TB/s, 500 W), batch 2 x 8192, selective AC "
          f"({row['source']})")
    print(f"  step {step.total:.3f} s = compute {step.compute:.3f} (with recompute) + exposed collectives "
          f"{step.exposed * 1e3:.1f} ms + optimizer and clipping {step.optimizer * 1e3:.1f} ms")
    print(f"  predicted {tps:,.0f} tokens/s per GPU, measured {row['tokens_per_gpu']:,.0f}: {err:+.1%} "
          f"({'within' if abs(err) <= 0.15 else 'OUTSIDE'} the 15 % target)")
    print("  not expressed: the same table's torch.compile and Float8 rows (compile fuses the memory-bound "
          "kernels that this model prices one by one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
