"""The layout search against the layouts people run, by the workbench's own model (issue "Plan the parallelism
people run", targets 1 and 2).

For Llama-3-8B on 8 H100s (one node) and Llama-3-70B on 64 H100s (8 nodes of 8), ``examples/llama3.py`` under
fake tensors (profiled once per micro-batch size, cached by content in ``build/profiles``), AdamW, bf16-mixed,
2048-token sequences:

* ``plan --parallel auto``'s answer (:func:`workbench.parallel.search.search`, as the command runs it: every
  ``tp > 1`` layout with sequence parallelism and the vocabulary-parallel loss each off and on, each on its own
  profile) and the search's wall time (target: under 2 minutes for 70B on 64 GPUs once its profiles are cached);
* the families people run, each evaluated as ``plan --parallel`` evaluates a layout
  (:func:`workbench.parallel.evaluate.evaluate`), the best of each family over its schedules, micro-batch sizes,
  activation policies (and, with ``tp > 1``, sequence parallelism and the split loss): the pure pipeline (tp 1,
  pp N), pure FSDP (dp N, zero 3), TP 8 x PP N/8, and NVIDIA's TP 4 x PP 8 x VP 5 (interleaved 1F1B, 5 stages per
  rank; on 8 GPUs the expressible TP 4 x PP 2 x VP 5);

side by side with tokens/s per GPU and MFU (6 N per token: docs/model.md, "Layouts"). Target: the search's
answer at least as fast as each family. A family with ``tp > 1`` needs per-rank tensor-parallel profiles
(``workbench.parallel.tensor``); without them it is reported as not expressible here.

Global batches: 8B, 128 sequences (NVIDIA NeMo's performance summary, the LLAMA2-7B row on 8 GPUs: GBS 128);
70B, 1024 sequences (llm-foundry's ``scripts/train/benchmarking/README.md``, the H100 70B row on 32 GPUs at
sequence length 2048: GlobalBatchSize 1024).

    .venv/bin/python benchmarks/layout_search.py            # both models (the first run profiles: minutes)
    .venv/bin/python benchmarks/layout_search.py --only 8b
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.front.cli import build_parser  # noqa: E402
from workbench.front.layouts import _chains, job_from_args  # noqa: E402
from workbench.model.layout import Layout  # noqa: E402
from workbench.parallel.evaluate import evaluate  # noqa: E402
from workbench.parallel.profiles import tensor_parallel_available  # noqa: E402
from workbench.parallel.search import describe_switches, search  # noqa: E402

CASES = {"8b": ("llama3_8b", 8, 128), "70b": ("llama3_70b", 64, 1024)}


def setup(name: str):
    func, devices, batch = CASES[name]
    args = build_parser().parse_args(
        ["plan", "--module", str(ROOT / f"examples/llama3.py:{func}"), "--fake", "--gpu", "h100-sxm",
         "--devices", str(devices), "--devices-per-node", "8", "--global-batch", str(batch), "--parallel", "auto",
         "--optimizer", "adamw", "--precision", "bf16-mixed"])
    chain_for, first, sizes = _chains(args, lambda line: print(f"  {line}", flush=True))
    return job_from_args(args, first), chain_for, sizes


def families(devices: int) -> list[tuple[str, dict]]:
    """(name, the search's restriction) of each family people run."""
    nvidia = (4, 8, devices // 32) if devices >= 32 else (4, devices // 4, 1)
    vp = f"TP 4 x PP {nvidia[1]} x VP 5" + (" (NVIDIA's shape on 8 GPUs)" if devices < 32 else " (NVIDIA)")
    return [("pure pipeline", {"degrees": [(1, devices, 1)]}),
            ("pure FSDP (zero 3)", {"degrees": [(1, 1, devices)], "zeros": (3,)}),
            (f"TP 8 x PP {devices // 8}", {"degrees": [(8, devices // 8, 1)], "tps": (8,)}),
            (vp, {"degrees": [nvidia], "tps": (4,), "schedules": ("interleaved-1f1b",), "chunks": 5})]


def row(name: str, e, devices: int) -> str:
    if e is None:
        return f"{name:<34} {'-':<58} {'no layout fits':>10}"
    return (f"{name:<34} {e.layout.describe() + ', ' + e.activations:<58} {e.tokens_per_second / devices:>10,.0f} "
            f"{e.mfu:>6.1%} {e.peak / 2**30:>8.1f} {e.step_seconds:>8.2f}")


def run(name: str) -> bool:
    job, chain_for, sizes = setup(name)
    tps = None if tensor_parallel_available() else (1,)
    t0 = time.perf_counter()
    for tp in (1, 2, 4, 8) if tps is None else tps:         # every profile made (or read from the cache) first
        for mbs in sizes:
            for sp, lp in [(False, False)] + [(True, False), (False, True), (True, True)] * (tp > 1):
                chain_for(tp, mbs, sequence_parallel=sp, loss_parallel=lp)
    profiles = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = search(job, chain_for, micro_batch_sizes=sizes, tps=tps)
    seconds = time.perf_counter() - t0
    print(f"\nLlama-3-{name.upper()} on {job.devices} H100s, global batch {job.global_batch} x 2048 tokens: "
          f"profiles {profiles:.1f} s; search {seconds:.1f} s (profiles made), {len(result.evaluated)} layouts "
          f"evaluated, {len(result.pruned)} skipped by a bound ({describe_switches(result.switches)})")
    head = f"{'':<34} {'layout, activations':<58} {'tok/s/GPU':>10} {'MFU':>6} {'peak GiB':>8} {'step s':>8}"
    print(head + "\n" + "-" * len(head))
    print(row("chosen (--parallel auto)", result.best, job.devices))
    ok = result.best is not None
    for fam, restrict in families(job.devices):
        if max(restrict.get("tps", (1,))) > 1 and tps == (1,):
            print(f"{fam:<34} not expressible here: tp > 1 needs workbench.parallel.tensor")
            continue
        best = _family_best(job, chain_for, sizes, restrict)
        print(row(fam, best, job.devices))
        if best is not None and result.best is not None:
            ok &= result.best.step_seconds <= best.step_seconds * (1 + 1e-9)
    print(f"target (the answer at least as fast as every family): {'met' if ok else 'NOT met'}")
    return ok


def _family_best(job, chain_for, sizes, restrict: dict):
    """The family's fastest layout that fits, each evaluated as ``plan --parallel`` evaluates it."""
    found = search(job, chain_for, micro_batch_sizes=sizes, prune=False, **restrict)
    fits = [e for e in found.evaluated if e.fits]
    best = min(fits, key=lambda e: e.step_seconds) if fits else None
    if best is not None:     # the same layout, evaluated alone
        again = evaluate(job, Layout.from_dict(best.layout.to_dict()), chain_for, best.activations)
        assert again.step_seconds == best.step_seconds
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(CASES), default=None)
    args = ap.parse_args(argv)
    ok = all([run(name) for name in ([args.only] if args.only else ["8b", "70b"])])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
