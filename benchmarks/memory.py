"""The memory model against torch's own tracker: one device and every rank of 2 and 4, both training loops.

For every one-device case: build the model from its config (random weights), profile it with the
workbench's profiler, plan it on one device (``dp``, weights ``single``, the case's optimizer, precision
and training loop: what ``plan --devices 1 --weights single --optimizer NAME --zero-grad LOOP --json F``
writes as ``memory[0]``), and compare that prediction with the peak that
``torch.distributed._tools.mem_tracker.MemTracker`` records around plain training steps of the same model
running the same loop (:func:`workbench.runtime.witness.plain_step_peak`: no pipeline, no profiler, no
workbench runtime). The loops (docs/model.md, "Memory"): ``none``, torch's default ``zero_grad()`` (gradients
set to None between steps), and ``zeros`` (zeroed in place). Target (issue 23): within 5 % of the witness,
never more than 2 % below it.

With ``--ranks``, plans on 2 and 4 devices run on ``torch.distributed`` (gloo, one process per device) on
both engines (weights ``stash``: the PipeDream engine; ``single``: torch's), both loops, with blocks recomputed
and offloaded: Hugging Face GPT-2 and BERT with their LM heads tied to the embedding (the head's rank holds a
copy), a Llama-style decoder untied (``benchmarks/memory_models.py``: default configurations, reduced sizes),
and resnet50. Every rank's allocator-level peak (MemTracker in the rank) against the prediction (the plan's
memory; on torch's engine the periodic plan as torch runs it, one step of every mini-batch:
:func:`workbench.model.memory_views.torch_engine_memory`). Same target.

    .venv/bin/python benchmarks/memory.py            # every one-device case, both loops (several minutes on 2 cores)
    .venv/bin/python benchmarks/memory.py --quick    # the small cases only
    .venv/bin/python benchmarks/memory.py --ranks    # and the 2- and 4-rank runs (about 20 minutes more)
    .venv/bin/python benchmarks/memory.py --schedules   # torch's multi-stage schedules on 2 and 4 ranks

With ``--schedules``, every torch schedule (``interleaved-1f1b``, ``looped-bfs``, ``interleaved-zb``,
``zbv``, ``dualpipev``) is planned without a memory limit (4P micro-batches), under both loops, and run on
torch's engine with torch's own schedule class; every rank's peak is compared with the plan's memory plus what
the engine holds in time (:func:`workbench.schedules.order_memory.engine_extra`). Target: within +5 %, never below -2 %.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.target import Target  # noqa: E402
from workbench.model.units import format_bytes  # noqa: E402
from workbench.planners import plan as run_planner  # noqa: E402
from workbench.profiles import zoo  # noqa: E402
from workbench.profiles.profiler import profile_workload, profile_zoo  # noqa: E402
from workbench.profiles.workload import Workload  # noqa: E402
from workbench.runtime.witness import plain_step_peak  # noqa: E402

LOOPS = ("none", "zeros")
HERE = Path(__file__).resolve().parent
GPT16K = {"layers": 4, "d_model": 256, "heads": 4, "seq_len": 256, "vocab": 16384}
#: (label, zoo model or benchmarks/memory_models.py builder, config, batch, optimizer, precision)
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
    ("HF GPT-2, tied head", "gpt2_tied", {}, 4, "adam", "fp32"),
    ("HF BERT MLM, tied head", "bert_tied", {}, 4, "sgd", "fp32"),
    ("HF Llama-style, untied", "llama_untied", {}, 4, "adamw", "fp32"),
]
QUICK = [c for c in CASES if c[1] not in ("vgg16",) and "small" not in c[0]]
BUILDERS = ("gpt2_tied", "bert_tied", "llama_untied")


def _workload(model_name: str, config: dict, batch: int, dtype: str = "float32") -> Workload:
    if model_name in BUILDERS:
        return Workload.module(f"{HERE / 'memory_models.py'}:{model_name}")
    return Workload.zoo(model_name, batch, dtype=dtype, **config)


def run_case(label: str, model_name: str, config: dict, batch: int, optimizer: str, precision: str) -> list[dict]:
    """One one-device case under both loops: the plan's memory against MemTracker around plain steps."""
    dtype = "float32" if precision == "fp32" else "bfloat16"
    t0 = time.perf_counter()
    if model_name in BUILDERS:
        chain = profile_workload(_workload(model_name, config, batch), repeats=1, warmup=0)
    else:
        chain = profile_zoo(model_name, batch, dtype=dtype, repeats=1, warmup=0, **config)
    rows = []
    for loop in LOOPS:
        platform = Target.of(1, weights="single", optimizer=optimizer, precision=precision, zero_grad=loop)
        predicted = run_planner(chain, platform, "dp").memory[0]
        if model_name in BUILDERS:
            wl = _workload(model_name, config, batch)
            model, (x, y), loss = wl.build(), wl.batch(0), wl.loss
        else:
            model = zoo.build_model(model_name, dtype=dtype, **config)
            (x, y), loss = zoo.sample_batch(model_name, batch, dtype=dtype, **config), zoo.loss_fn(model_name)
        measured = plain_step_peak(model, x, y, loss, optimizer, mixed=precision == "bf16-mixed", loop=loop)
        rows.append({"case": label, "batch": batch, "optimizer": optimizer, "precision": precision, "loop": loop,
                     "predicted": predicted, "measured": measured, "error": predicted / measured - 1,
                     "seconds": time.perf_counter() - t0})
    return rows


#: (label, model, config, batch, optimizer, device counts, activation policy of the blocks or None)
RANK_CASES = [
    ("HF GPT-2, tied head", "gpt2_tied", {}, 4, "adam", (2, 4), None),
    ("HF BERT MLM, tied head", "bert_tied", {}, 4, "adam", (2, 4), None),
    ("HF Llama-style, untied", "llama_untied", {}, 4, "adam", (2, 4), None),
    ("resnet50 64px", "resnet50", {"image_size": 64}, 4, "momentum", (2,), None),
    ("HF GPT-2, blocks recomputed", "gpt2_tied", {}, 4, "adam", (2,), "recompute"),
    ("HF GPT-2, blocks offloaded", "gpt2_tied", {}, 4, "adam", (2,), "offload"),
]
QUICK_RANKS = [c for c in RANK_CASES if c[1] == "gpt2_tied"]
STEPS = 8


def _assignment(n_layers: int, devices: int) -> list[int]:
    """Contiguous stages of about equal layer counts, the embedding first and the head last."""
    return [min(devices - 1, (l * devices) // n_layers) for l in range(n_layers)]


def run_ranks(label: str, model_name: str, config: dict, batch: int, optimizer: str, counts: tuple[int, ...],
              policy: str | None) -> list[dict]:
    """Every device count, engine and loop of one rank case: per rank, predicted against measured."""
    from workbench.front.running import run_and_compare
    from workbench.model.activations import apply_policies
    from workbench.schedules.builder import best_schedule

    wl = _workload(model_name, config, batch)
    chain = profile_workload(wl, repeats=1, warmup=0)
    L = len(chain)
    policies = (("keep",) + (policy,) * (L - 3) + ("keep", "keep")) if policy else None
    rows = []
    for P in counts:
        for weights in ("stash", "single"):
            for loop in LOOPS:
                platform = Target.of(P, bandwidth="12GB/s", weights=weights, optimizer=optimizer, zero_grad=loop)
                plan = best_schedule(apply_policies(chain, policies), platform, _assignment(L, P), method="benchmark")
                plan = plan.with_(activations=tuple(policies or ()))
                s = run_and_compare(plan, chain, platform, wl, batch, steps=STEPS, replan=False)
                for d, (pred, meas) in enumerate(zip(s["memory_predicted"], s["memory_measured"])):
                    rows.append({"case": label, "loop": loop, "ranks": P, "engine": s["engine"], "device": d,
                                 "in_flight": ",".join(str(st.in_flight) for st in plan.stages if st.device == d),
                                 "predicted": pred, "measured": meas, "error": pred / meas - 1,
                                 "grad_error": s["max_grad_error"], "steady": s["steady_state"][d]})
    return rows


def _band(rows: list[dict], what: str) -> bool:
    over = max(r["error"] for r in rows)
    under = min(r["error"] for r in rows)
    ok = over <= 0.05 and under >= -0.02
    print(f"\n{len(rows)} {what}: error from {under:+.2%} to {over:+.2%} (target: within +5 %, never below -2 %): "
          f"{'PASS' if ok else 'FAIL'}")
    for loop in LOOPS:
        mine = [r["error"] for r in rows if r["loop"] == loop]
        if mine:
            print(f"  zero_grad {loop}: {min(mine):+.2%} .. {max(mine):+.2%} ({len(mine)})")


GPT4 = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 128, "vocab": 4096}
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
        for m in (m for m in METHODS if m.torch_class):
            for loop in LOOPS:
                platform = Target.of(P, bandwidth="12GB/s", weights="single", optimizer=optimizer, zero_grad=loop)
                plan = run_planner(chain, platform, m.name)
                s = run_and_compare(plan, chain, platform, model_name, batch, steps=plan.micro_batches,
                                    model_config=config, replan=False)
                for d, (pred, meas) in enumerate(zip(s["memory_predicted"], s["memory_measured"])):
                    rows.append({"case": f"{label}, {m.name}", "loop": loop, "ranks": P, "engine": s["engine"],
                                 "device": d, "in_flight": ",".join(str(st.in_flight) for st in plan.stages
                                                                    if st.device == d),
                                 "predicted": pred, "measured": meas, "error": pred / meas - 1,
                                 "grad_error": s["max_grad_error"]})
    return rows


def _rank_table(rows: list[dict]) -> bool:
    """Print the rank rows and the verdict (within +5 %, never below -2 %), per loop too."""
    print(f"\n{'case':40s} {'loop':>5s} {'ranks':>5s} {'engine':>9s} {'device':>6s} {'k':>5s} {'predicted':>11s} "
          f"{'measured':>11s} {'error':>7s} {'grad err':>8s}")
    for r in rows:
        print(f"{r['case']:40s} {r['loop']:>5s} {r['ranks']:5d} {r['engine']:>9s} {r['device']:6d} "
              f"{r['in_flight']:>5s} {format_bytes(r['predicted']):>11s} {format_bytes(r['measured']):>11s} "
              f"{r['error']:+7.2%} {r['grad_error']:8.1e}", flush=True)
    return _band([r for r in rows if r["measured"] > 0], "ranks")


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
    print(f"{'case':26s} {'batch':>5s} {'optimizer':>9s} {'precision':>10s} {'loop':>5s} {'predicted':>11s} "
          f"{'measured':>11s} {'error':>7s} {'s':>5s}")
    for case in (QUICK if args.quick else CASES):
        for r in run_case(*case):
            rows.append(r)
            print(f"{r['case']:26s} {r['batch']:5d} {r['optimizer']:>9s} {r['precision']:>10s} {r['loop']:>5s} "
                  f"{format_bytes(r['predicted']):>11s} {format_bytes(r['measured']):>11s} {r['error']:+7.2%} "
                  f"{r['seconds']:5.1f}", flush=True)
    ok = _band(rows, "one-device cases")
    if args.ranks:
        print(f"\n{'case':28s} {'loop':>5s} {'ranks':>5s} {'engine':>9s} {'device':>6s} {'k':>5s} {'predicted':>11s} "
              f"{'measured':>11s} {'error':>7s} {'grad err':>8s} {'steady':>6s}")
        ranked = []
        for case in (QUICK_RANKS if args.quick else RANK_CASES):
            for r in run_ranks(*case):
                ranked.append(r)
                print(f"{r['case']:28s} {r['loop']:>5s} {r['ranks']:5d} {r['engine']:>9s} {r['device']:6d} "
                      f"{r['in_flight']:>5s} {format_bytes(r['predicted']):>11s} {format_bytes(r['measured']):>11s} "
                      f"{r['error']:+7.2%} {r['grad_error']:8.1e} {'yes' if r['steady'] else 'NO':>6s}", flush=True)
        ok = _band([r for r in ranked if r["measured"] > 0], "ranks") and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
