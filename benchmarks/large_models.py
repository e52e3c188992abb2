"""GPU time of the models people train: Llama-3-8B on one H100, and torchtitan's Llama-3.1-8B FSDP step on 8.

The fake profile's time model (:mod:`workbench.profiles.kernel_time`) against what large-model training
measures. Llama is built from Meta's published shapes (``examples/llama3.py``: Hugging Face's
``LlamaForCausalLM``, random weights, bf16) with two of its blocks and profiled under fake tensors; every
block is the same, so the model's time is the embedding, ``layers`` times a block, the final norm and the
LM head with its float32 cross-entropy.

Targets (issue "GPU time that matches what large-model training measures"):

* Llama-3-8B on one H100 SXM, forward and backward of one 2048-token micro-batch: 200-330 ms (30-50 % MFU by
  6 N FLOPs per token, N = 8.03e9 parameters);
* torchtitan's Llama-3.1-8B FSDP row (``benchmarks/published_rows.py``: ``ROWS[0]``, the calibration's only
  training row, its source and settings beside it): predicted tokens/s per GPU within 15 %. Its step is the layout
  evaluator's, as ``plan --parallel`` prices ``tp=1,pp=1,dp=8,zero=3`` on 8 ``h100-96gb-500w`` (the H100s of that
  run: 96 GB HBM2e at 2.4 TB/s, a 500 W limit), batch 2 x 8192 a GPU, selective activation checkpointing by
  operation (``published_rows.selective_op``), foreach AdamW on bf16-mixed masters.

    .venv/bin/python benchmarks/large_models.py          # about a minute
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "benchmarks"))

from published_rows import ROWS, evaluate_row  # noqa: E402

from workbench.model.accelerators import Accelerator, accelerator  # noqa: E402
from workbench.parallel.evaluate import Evaluation  # noqa: E402
from workbench.profiles.kernel_time import (  # noqa: E402
    H100_CALIBRATION,
    KINDS,
    Calibration,
    gemm_efficiency,
    kernel_seconds,
)
from workbench.profiles.roofline import LayerWork, estimate  # noqa: E402

#: torchtitan's Llama-3.1-8B FSDP row on 8 H100s, the calibration's only training row (its source and settings:
#: ``benchmarks/published_rows.py``)
TORCHTITAN = ROWS[0]

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


def llama_work(size: str, sequence: int, batch: int, kernels: str = "eager") -> LlamaWork:
    """``examples/llama3.py``'s Llama-3 ``size`` ("8b", "70b") on ``batch`` x ``sequence`` tokens, profiled fake
    with ``kernels`` (``eager`` or ``fused``: :mod:`workbench.profiles.fused`)."""
    import llama3

    from workbench.profiles.fake import fake_profile

    chain, times = fake_profile(lambda: llama3.llama3(size, sequence=sequence, batch=batch, layers=2), "h100-sxm",
                                return_work=True, kernels=kernels)
    names = [l.name for l in chain.layers]
    if len(names) != 5 or not names[1].endswith("layers.0"):
        raise SystemExit(f"unexpected layers for {size}: {names}")
    params = [l.weight_bytes / 2 for l in chain.layers]            # bf16
    e, b, _, n, h = times.works
    return LlamaWork(e, b, n, h, llama3.SHAPES[size][2], params[1], params[0] + params[3] + params[4])


def torchtitan_step(cal: Calibration = H100_CALIBRATION, chain=None) -> tuple[Evaluation, float]:  # noqa: ANN001
    """torchtitan's Llama-3.1-8B FSDP row (``published_rows.ROWS[0]``) through the layout evaluator, its times
    estimated under ``cal``; ``chain``: its fake profile when already made (``published_rows.base_chain``). The
    evaluation and its tokens/s per GPU."""
    e = evaluate_row(TORCHTITAN, cal, chain)
    return e, e.tokens_per_second / TORCHTITAN.gpus


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
            for kinds, name in ((("matmul",), "matmul"), (("attention", "attention_fused"), "attention"),
                                (("memory",), "memory-bound")):
                out[name] += n * float(t[np.isin(phase.kind, [KINDS.index(k) for k in kinds])].sum())
            total += n * estimate(phase, gpu, cal, backward=backward)
    out["waiting for the CPU"] = total - sum(out.values())
    return out


def fused_kernels_line(eager: LlamaWork, gpu: Accelerator) -> None:
    """The same model profiled with fused kernels (``kernels="fused"``: :mod:`workbench.profiles.fused`), against
    eager: the time, MFU, kernels a block launches and where the time goes."""
    fused = llama_work("8b", 2048, 1, "fused")
    for name, w in (("eager", eager), ("fused", fused)):
        t = one_gpu_seconds(w, gpu)
        parts = breakdown(w, gpu)
        print(f"  kernels {name}: {t * 1e3:.1f} ms, MFU {6 * LLAMA3_8B_PARAMS * 2048 / t / gpu.peak('bfloat16'):.1%}; "
              f"a block launches {w.block.forward.kernels} + {w.block.backward.kernels} kernels; "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in parts.items()))


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
    fused_kernels_line(w8, h100)
    row = TORCHTITAN
    e, tps = torchtitan_step()
    err = tps / row.tokens_per_gpu - 1
    print(f"\n{row.name} on {row.gpus} {row.gpu}, batch {row.micro_batch} x {row.sequence}, {row.checkpointing} "
          f"checkpointing ({row.source})")
    print(f"  step {e.step_seconds:.3f} s, as plan --parallel {row.layout} prices it: "
          + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in e.breakdown.items()))
    print(f"  predicted {tps:,.0f} tokens/s per GPU, measured {row.tokens_per_gpu:,.0f}: {err:+.1%} "
          f"({'within' if abs(err) <= 0.15 else 'OUTSIDE'} the 15 % target)")
    print("  not expressed: the same table's torch.compile and Float8 rows (compile fuses the memory-bound "
          "kernels that this model prices one by one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
