"""Data parallelism's memory per rank against torch's own trackers: DDP, ZeRO-1 and FSDP2 (zero 2 and 3).

For every case: the model's prediction for one rank of a data-parallel group of ``dp`` ranks (a one-stage pipeline
planned with ``Target.of(1, dp=..., zero=...)``, ``1f1b`` with the case's micro-batches: what
``plan --parallel pp=1,dp=D,zero=Z`` writes for every rank) from the workbench's fake profile of the model, against
the peak torch's tracker records around real training steps of the same model wrapped as torch runs the ZeRO
level (:mod:`workbench.parallel.data.witness`: ``FSDPMemTracker`` around ``fully_shard`` on a fake process group
under ``FakeTensorMode`` for zero 2 and 3; ``MemTracker`` around ``DistributedDataParallel`` (+
``ZeroRedundancyOptimizer``) on real tensors for zero 0 and 1). The two share no code: the profile measures each
layer alone, the witness runs the whole model under torch's data parallelism. Target (as the memory model's):
within -2 % .. +5 %.

Cases: a small Llama-style decoder (Hugging Face ``LlamaForCausalLM``, 4 blocks of width 256, grouped-query
attention, untied head, 2 sequences of 256 tokens) in fp32, bf16 and bf16-mixed, every ZeRO level, 2 to 8 ranks,
1 and 2 micro-batches; Llama-3-8B (``examples/llama3.py``, one 2048-token sequence, bf16) on 8 ranks with zero 2
and 3 (fake tensors: nothing is allocated), and with ``--full`` on 64 ranks.

    .venv/bin/python benchmarks/data_parallel.py            # a few minutes on 2 cores
    .venv/bin/python benchmarks/data_parallel.py --quick    # the small model only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.model.memory_zero import TORCH_MAPPING  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.parallel.data.witness import rank_peak  # noqa: E402
from workbench.planners import plan  # noqa: E402
from workbench.profiles import load_profile  # noqa: E402
from workbench.profiles.fake import default_dtype, fake_profile  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-mixed": torch.bfloat16}


def small_llama(dtype: torch.dtype = torch.float32, *, layers: int = 4, sequence: int = 256):
    """A builder of the small Llama-style decoder with its parameters in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def build():
        cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=layers,
                          num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                          tie_word_embeddings=False, use_cache=False)
        with default_dtype(dtype):
            model = LlamaForCausalLM(cfg)
        ids = torch.randint(0, 1024, (2, sequence))
        return model, ids, ids.roll(-1, 1), lm_loss

    return build


def lm_loss(out, targets):
    """Next-token cross-entropy of the logits, in float32."""
    return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


def predicted(chain, *, dp: int, zero: int, precision: str, micro_batches: int) -> float:
    """The model's peak for one rank: a one-stage 1F1B pipeline of the chain on a rank of ``dp`` under ZeRO."""
    platform = Target.of(1, optimizer="adamw", precision=precision, weights="single", dp=dp, zero=zero)
    result = plan(chain, platform, "1f1b", micro_batches=micro_batches)
    if result.extra.get("violations"):
        raise AssertionError(f"the checker rejects the plan: {result.extra['violations'][0]}")
    return float(result.memory[0])


def small_cases(quick: bool) -> list[tuple]:
    """(label, precision, dp, zero, micro_batches) of the small model."""
    out = []
    for precision in ("fp32", "bf16", "bf16-mixed"):
        for zero in (0, 1, 2, 3):
            if zero <= 1 and precision == "bf16-mixed":
                continue        # the witness's DDP runs torch's optimizer on the model's own parameters
            for dp, mb in ((4, 1), (8, 2)) if not quick else ((4, 1),):
                out.append(("small Llama", precision, dp, zero, mb))
    return out


def run(quick: bool, full: bool) -> list[dict]:
    rows = []
    profiles = {}
    for label, precision, dp, zero, mb in small_cases(quick):
        # bf16-mixed: the profile is the bf16 model's; the witness builds fp32 shards that FSDP2 computes in bf16
        build = small_llama(torch.float32 if precision == "bf16-mixed" else DTYPES[precision])
        if precision not in profiles:
            profiles[precision] = fake_profile(small_llama(DTYPES[precision]), "h100-sxm")
        rows.append(_row(label, profiles[precision], build, precision, dp, zero, mb, fake=zero >= 2))
    if not quick:
        sys.path.insert(0, str(ROOT / "examples"))
        import llama3

        chain = load_profile(str(ROOT / "data/profiles/fake/llama3-8b-h100-sxm.csv"))
        for dp, zero in ((8, 2), (8, 3)) + (((64, 3),) if full else ()):
            rows.append(_row("Llama-3-8B", chain, llama3.llama3_8b, "bf16", dp, zero, 1, fake=True))
    return rows


def _row(label, chain, build, precision, dp, zero, mb, *, fake: bool) -> dict:
    t0 = time.perf_counter()
    measured = rank_peak(build, dp=dp, zero=zero, micro_batches=mb, fake=fake, mixed=precision == "bf16-mixed")
    pred = predicted(chain, dp=dp, zero=zero, precision=precision, micro_batches=mb)
    return {"model": label, "precision": precision, "dp": dp, "zero": zero, "micro_batches": mb,
            "predicted": pred, "measured": measured, "error": pred / measured - 1,
            "seconds": time.perf_counter() - t0}


def table(rows: list[dict]) -> str:
    head = (f"{'model':<12} {'precision':<10} {'dp':>3} {'zero':>4} {'mb':>3} {'predicted':>12} {'measured':>12} "
            f"{'error':>7} {'s':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:<12} {r['precision']:<10} {r['dp']:>3} {r['zero']:>4} {r['micro_batches']:>3} "
                     f"{r['predicted'] / 2**20:>9.2f}MiB {r['measured'] / 2**20:>9.2f}MiB {r['error']:>+7.2%} "
                     f"{r['seconds']:>6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small model only, one set-up per precision")
    ap.add_argument("--full", action="store_true", help="also Llama-3-8B on 64 ranks")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = run(args.quick, args.full)
    print("ZeRO levels as torch runs them:")
    for zero, text in TORCH_MAPPING.items():
        print(f"  {zero}: {text}")
    print(table(rows))
    worst = min(r["error"] for r in rows), max(r["error"] for r in rows)
    ok = -0.02 <= worst[0] and worst[1] <= 0.05
    print(f"errors {worst[0]:+.2%} .. {worst[1]:+.2%}: {'within' if ok else 'OUTSIDE'} the -2 % .. +5 % target")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
