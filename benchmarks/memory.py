"""The memory model against torch's own tracker: one-device plans, several models, optimizers, precisions.

For every case: build a zoo model from its config (random weights), profile it
with the workbench's profiler, plan it on one device (``dp``, weights
``single``, the case's optimizer and precision: what
``plan --devices 1 --weights single --optimizer NAME --json F`` writes as
``memory[0]``), and compare that prediction with the peak that
``torch.distributed._tools.mem_tracker.MemTracker`` records around plain
training steps of the same model (:func:`workbench.runtime.witness.plain_step_peak`:
no pipeline, no profiler, no workbench runtime). The target (issue 15): within
5 % of the witness, and never more than 2 % below it.

Then, with ``--ranks``, plans on 2 and 4 devices run on ``torch.distributed``
(gloo, one process per device) on both engines, and every rank's
allocator-level peak (MemTracker in the rank) is compared with the plan's
memory (plus, on torch's engine, what it preallocates). Target: within 5 %.

    .venv/bin/python benchmarks/memory.py            # every one-device case (a few minutes on 2 cores)
    .venv/bin/python benchmarks/memory.py --quick    # the small cases only
    .venv/bin/python benchmarks/memory.py --ranks    # and the 2- and 4-rank runs
    .venv/bin/python benchmarks/memory.py --schedules   # torch's multi-stage schedules on 2 and 4 ranks

With ``--schedules``, every torch schedule (``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb``,
``zbv``, ``dualpipev``) is planned without a memory limit (4P micro-batches) and run on torch's engine with
torch's own schedule class; every rank's peak is compared with the plan's memory plus what the engine
holds in time (:func:`workbench.model.order_memory.engine_extra`). Target: within +5 %, never below -2 %.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.chain import Platform  # noqa: E402
from workbench.model.units import format_bytes  # noqa: E402
from workbench.planners import plan as run_planner  # noqa: E402
from workbench.profiles import zoo  # noqa: E402
from workbench.profiles.profiler import profile_zoo  # noqa: E402
from workbench.runtime.witness import plain_step_peak  # noqa: E402

GPT16K = {"layers": 4, "d_model": 256, "heads": 4, "seq_len": 256, "vocab": 16384}
#: (label, zoo model, config, batch, optimizer, precision)
CASES = [
    ("resnet50 64px", "resnet50", {"image_size": 64}, 8, "sgd", "fp32"),
    ("resnet50 64px", "resnet50", {"image_size": 64}, 8, "adam", "fp32"),
    ("vgg16 64px", "vgg16", {"image_size": 64}, 8, "sgd", "fp32"),
    ("vgg16 64px", "vgg16", {"image_size": 64}, 8, "momentum", "fp32"),
    ("vgg16 64px", "vgg16", {"image_size": 64}, 8, "adam", "fp32"),
    ("gpt 4x256, vocab 16k", "gpt", GPT16K, 8, "sgd", "fp32"),
    ("gpt 4x256, vocab 16k", "gpt", GPT16K, 8, "momentum", "fp32"),
    ("gpt 4x256, vocab 16k", "gpt", GPT16K, 8, "adam", "fp32"),
    ("gpt 4x256, vocab 16k", "gpt", GPT16K, 8, "adamw", "bf16"),
    ("gpt 4x256, vocab 16k", "gpt", GPT16K, 8, "adam", "bf16-mixed"),
    ("resnet50 64px", "resnet50", {"image_size": 64}, 8, "momentum", "bf16"),
    ("gpt-2 small, 128 tokens", "gpt", {"seq_len": 128}, 2, "adam", "fp32"),
]
QUICK = [c for c in CASES if c[1] != "vgg16" and "small" not in c[0]]


def run_case(label: str, model_name: str, config: dict, batch: int, optimizer: str, precision: str) -> dict:
    dtype = "float32" if precision == "fp32" else "bfloat16"
    t0 = time.perf_counter()
    chain = profile_zoo(model_name, batch, dtype=dtype, repeats=1, warmup=0, **config)
    platform = Platform(1, weights="single", optimizer=optimizer, precision=precision)
    plan = run_planner(chain, platform, "dp")
    predicted = plan.memory[0]
    model = zoo.build_model(model_name, dtype=dtype, **config)
    x, y = zoo.sample_batch(model_name, batch, dtype=dtype, **config)
    measured = plain_step_peak(model, x, y, zoo.loss_fn(model_name), optimizer, mixed=precision == "bf16-mixed")
    return {"case": label, "batch": batch, "optimizer": optimizer, "precision": precision,
            "predicted": predicted, "measured": measured, "error": predicted / measured - 1,
            "seconds": time.perf_counter() - t0}


GPT4 = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 128, "vocab": 4096}
#: (label, zoo model, config, batch, optimizer, {devices: assignment}, activation policies or None)
RANK_CASES = [
    ("gpt 4x128, vocab 4k", "gpt", GPT4, 4, "adam", {2: [0, 0, 0, 1, 1, 1], 4: [0, 0, 1, 2, 3, 3]}, None),
    ("resnet50 64px", "resnet50", {"image_size": 64}, 4, "momentum",
     {2: [0] * 8 + [1] * 10, 4: [0] * 4 + [1] * 4 + [2] * 5 + [3] * 5}, None),
    ("gpt, blocks recomputed", "gpt", GPT4, 4, "adam", {2: [0, 0, 0, 1, 1, 1]},
     ("keep",) + ("recompute",) * 4 + ("keep",)),
    ("gpt, blocks offloaded", "gpt", GPT4, 4, "adam", {2: [0, 0, 0, 1, 1, 1]},
     ("keep",) + ("offload",) * 4 + ("keep",)),
]


def run_ranks(label: str, model_name: str, config: dict, batch: int, optimizer: str, plans: dict,
              policies: tuple[str, ...] | None) -> list[dict]:
    from workbench.front.running import run_and_compare
    from workbench.model.activations import apply_policies
    from workbench.verify.schedule import best_schedule

    chain = profile_zoo(model_name, batch, repeats=1, warmup=0, **config)
    rows = []
    for P, assignment in plans.items():
        for weights in ("stash", "single"):
            platform = Platform(P, bandwidth="12GB/s", weights=weights, optimizer=optimizer)
            plan = best_schedule(apply_policies(chain, policies), platform, assignment, method="benchmark")
            plan = plan.with_(activations=tuple(policies or ()))
            s = run_and_compare(plan, chain, platform, model_name, batch, steps=8, model_config=config, replan=False)
            for d, (pred, meas) in enumerate(zip(s["memory_predicted"], s["memory_measured"])):
                rows.append({"case": label, "ranks": P, "engine": s["engine"], "device": d,
                             "in_flight": ",".join(str(st.in_flight) for st in plan.stages if st.device == d),
                             "predicted": pred, "measured": meas, "error": pred / meas - 1,
                             "grad_error": s["max_grad_error"]})
    return rows


#: torch's multi-stage schedules (--schedules): (label, zoo model, {ranks: config}, batch, optimizer)
SCHEDULE_CASES = [
    ("gpt 128 wide, vocab 4k", "gpt", {2: GPT4, 4: {**GPT4, "layers": 6}}, 4, "adam"),
    ("resnet50 64px", "resnet50", {2: {"image_size": 64}, 4: {"image_size": 64}}, 4, "momentum"),
]


def run_schedules(label: str, model_name: str, configs: dict, batch: int, optimizer: str) -> list[dict]:
    """Every torch schedule on 2 and 4 ranks, its plan's partition without a memory limit, 4P micro-batches."""
    from workbench.front.running import run_and_compare
    from workbench.methods import METHODS

    rows = []
    for P, config in configs.items():
        chain = profile_zoo(model_name, batch, repeats=1, warmup=0, **config)
        platform = Platform(P, bandwidth="12GB/s", weights="single", optimizer=optimizer)
        for m in (m for m in METHODS if m.torch_class):
            plan = run_planner(chain, platform, m.name)
            s = run_and_compare(plan, chain, platform, model_name, batch, steps=plan.micro_batches,
                                model_config=config, replan=False)
            for d, (pred, meas) in enumerate(zip(s["memory_predicted"], s["memory_measured"])):
                rows.append({"case": f"{label}, {m.name}", "ranks": P, "engine": s["engine"], "device": d,
                             "in_flight": ",".join(str(st.in_flight) for st in plan.stages if st.device == d),
                             "predicted": pred, "measured": meas, "error": pred / meas - 1,
                             "grad_error": s["max_grad_error"]})
    return rows


def _rank_table(rows: list[dict]) -> bool:
    """Print the rank rows and the verdict (within +5 %, never below -2 %)."""
    print(f"\n{'case':40s} {'ranks':>5s} {'engine':>9s} {'device':>6s} {'k':>5s} {'predicted':>11s} "
          f"{'measured':>11s} {'error':>7s} {'grad err':>8s}")
    for r in rows:
        print(f"{r['case']:40s} {r['ranks']:5d} {r['engine']:>9s} {r['device']:6d} {r['in_flight']:>5s} "
              f"{format_bytes(r['predicted']):>11s} {format_bytes(r['measured']):>11s} {r['error']:+7.2%} "
              f"{r['grad_error']:8.1e}", flush=True)
    used = [r for r in rows if r["measured"] > 0]
    over, under = max(r["error"] for r in used), min(r["error"] for r in used)
    ok = over <= 0.05 and under >= -0.02
    print(f"\n{len(used)} ranks: prediction from {under:+.2%} to {over:+.2%} of the measured peak (target: within "
          f"+5 %, never below -2 %): {'PASS' if ok else 'FAIL'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the small cases")
    ap.add_argument("--ranks", action="store_true", help="also run plans on 2 and 4 processes")
    ap.add_argument("--schedules", action="store_true",
                    help="only torch's multi-stage schedules, each on 2 and 4 processes")
    args = ap.parse_args(argv)
    if args.schedules:
        return 0 if _rank_table([r for case in SCHEDULE_CASES for r in run_schedules(*case)]) else 1
    torch.manual_seed(0)
    rows = []
    print(f"{'case':26s} {'batch':>5s} {'optimizer':>9s} {'precision':>10s} {'predicted':>11s} {'measured':>11s} "
          f"{'error':>7s} {'s':>5s}")
    for case in (QUICK if args.quick else CASES):
        r = run_case(*case)
        rows.append(r)
        print(f"{r['case']:26s} {r['batch']:5d} {r['optimizer']:>9s} {r['precision']:>10s} "
              f"{format_bytes(r['predicted']):>11s} {format_bytes(r['measured']):>11s} {r['error']:+7.2%} "
              f"{r['seconds']:5.1f}", flush=True)
    worst_over = max(r["error"] for r in rows)
    worst_under = min(r["error"] for r in rows)
    ok = worst_over <= 0.05 and worst_under >= -0.02
    print(f"\n{len(rows)} cases: error from {worst_under:+.2%} to {worst_over:+.2%} "
          f"(target: within +5 %, never below -2 %): {'PASS' if ok else 'FAIL'}")
    if args.ranks:
        print(f"\n{'case':24s} {'ranks':>5s} {'engine':>9s} {'device':>6s} {'k':>5s} {'predicted':>11s} "
              f"{'measured':>11s} {'error':>7s} {'grad err':>8s}")
        ranked = []
        for case in RANK_CASES:
            for r in run_ranks(*case):
                ranked.append(r)
                print(f"{r['case']:24s} {r['ranks']:5d} {r['engine']:>9s} {r['device']:6d} {r['in_flight']:>5s} "
                      f"{format_bytes(r['predicted']):>11s} {format_bytes(r['measured']):>11s} {r['error']:+7.2%} "
                      f"{r['grad_error']:8.1e}", flush=True)
        used = [r for r in ranked if r["measured"] > 0]
        worst = max(abs(r["error"]) for r in used)
        ok_ranks = worst <= 0.05
        print(f"\n{len(used)} ranks: prediction within {worst:.2%} of the measured peak (target 5 %): "
              f"{'PASS' if ok_ranks else 'FAIL'}")
        ok = ok and ok_ranks
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
