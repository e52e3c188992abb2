"""Layouts run on CPU ranks: tensor x pipeline x data parallelism, every rank against its prediction (issue 37).

For each row: a small decoder from a shrunk Hugging Face default config (random weights; a Llama-style
``LlamaForCausalLM``, the same with its head tied to its embedding, and ``GPT2LMHeadModel`` whose head is
tied), profiled (``tp`` = 1: measured here; ``tp`` > 1: one rank's profile under fake tensors with a fake group
of ``tp`` ranks, :func:`workbench.parallel.tensor.profile.tensor_parallel_profile`, which equals the gloo
ranks' to the byte for these models), its pipeline planned on ``pp`` devices (1F1B, ``M`` micro-batches,
adam), then run as the layout on ``tp x pp x dp`` gloo processes (:mod:`workbench.parallel.run`). Printed per
row:

* ``grad err``: the largest relative gradient error against one process running the ``dp x M`` mini-batches
  (target 1e-4);
* ``predicted`` and ``measured``: the largest rank's prediction and its measured peak (torch's ``MemTracker``,
  ``FSDPMemTracker`` under FSDP2, in the rank); ``err lo .. hi``: the range over the ranks of measured /
  predicted - 1 (target -2 % .. +5 %);
* ``wall``: seconds the ranks took (start to results), on this 2-core machine.

The prediction is :func:`workbench.parallel.run.summary.predict_rank_memory`, whose source is printed under the
table: the layout model's ``rank_memory`` where this build has it; without it, the pipeline plan's memory of
the rank's stage (a ``tp = dp = 1`` prediction, so the error columns then measure what tensor and data
parallelism change, not the layout model). Rows with ``tp`` > 1 need the sharding plan of
:mod:`workbench.parallel.tensor` and are skipped without it. GPT-2 is split as Megatron splits its GPT (its
fused query/key/value projection ``c_attn`` by heads, its tied embedding and head over the vocabulary).

    .venv/bin/python benchmarks/run_layouts.py            # every row (a few minutes on 2 cores)
    .venv/bin/python benchmarks/run_layouts.py --quick    # one row per model and the 8-rank rows
    .venv/bin/python benchmarks/run_layouts.py --model gpt2-tied    # one model's rows
    .venv/bin/python benchmarks/run_layouts.py --match tp=2,pp=    # the rows whose layout starts so (lp=1 and not)

With ``lp=1`` (the vocabulary-parallel loss) the last stage computes the model's cross-entropy on its shard of
the logits under torch's ``loss_parallel`` and is predicted from the ``lp=1`` profile.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.layout import Layout  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.model.units import format_bytes  # noqa: E402
from workbench.parallel.run.config import LayoutConfig  # noqa: E402
from workbench.parallel.run.launch import RankFailure, conclude_layout, run_layout  # noqa: E402
from workbench.parallel.run.tensor import tensor_parallel_plan  # noqa: E402
from workbench.parallel.run.workloads import hf_workload, workload_example  # noqa: E402
from workbench.planners import plan as make_plan  # noqa: E402
from workbench.profiles.profiler import profile_model  # noqa: E402

#: the models: name -> hf_workload arguments (heads and key/value heads that tp 4 divides)
MODELS = {
    "llama": dict(kind="llama", batch_size=2, sequence=32, layers=4, hidden=64, heads=8, kv_heads=4, vocab=512),
    "llama-tied": dict(kind="llama", batch_size=2, sequence=32, layers=4, hidden=64, heads=8, kv_heads=4,
                       vocab=512, tied=True),
    "gpt2-tied": dict(kind="gpt2", batch_size=2, sequence=32, layers=4, hidden=64, heads=8, vocab=512),
}
#: (model, layout, micro-batches per replica); --quick keeps the rows marked True
ROWS = [
    ("llama", "tp=2,pp=2", 4, True),
    ("llama", "tp=2,dp=2,zero=0", 4, False),
    ("llama", "tp=2,dp=2,zero=1", 4, False),
    ("llama", "tp=2,dp=2,zero=2", 4, False),
    ("llama", "tp=2,dp=2,zero=3", 4, True),
    ("llama", "tp=2,pp=2,dp=2,zero=1", 4, True),
    ("llama", "tp=4,pp=1,dp=1", 4, False),
    ("llama", "tp=4,dp=2,zero=3", 4, True),
    ("llama", "tp=4,pp=2", 4, False),
    ("llama-tied", "tp=2,pp=2", 4, False),
    ("llama-tied", "tp=2,pp=2,dp=2,zero=3", 4, True),
    ("gpt2-tied", "pp=2", 4, False),
    ("gpt2-tied", "pp=2,dp=2,zero=0", 4, True),
    ("gpt2-tied", "pp=2,dp=2,zero=1", 4, False),
    ("gpt2-tied", "pp=2,dp=2,zero=2", 4, False),
    ("gpt2-tied", "pp=2,dp=2,zero=3", 4, False),
    ("gpt2-tied", "pp=2,dp=4,zero=1", 4, True),
    ("gpt2-tied", "tp=2,pp=2", 4, True),
    ("gpt2-tied", "tp=2,dp=2,zero=0", 4, False),
    ("gpt2-tied", "tp=2,dp=2,zero=2", 4, False),
    ("gpt2-tied", "tp=2,dp=2,zero=3", 4, True),
    ("gpt2-tied", "tp=2,pp=2,dp=2,zero=0", 4, False),
    ("gpt2-tied", "tp=2,pp=2,dp=2,zero=1", 4, True),
    ("gpt2-tied", "tp=2,pp=2,sp=1", 4, False),
    ("gpt2-tied", "tp=4,pp=2", 4, False),
    # the vocabulary-parallel loss (lp=1: torch's loss_parallel on the last stage), beside the same layouts without
    ("llama", "tp=2,pp=1", 4, False),
    ("llama", "tp=2,pp=1,lp=1", 4, False),
    ("llama", "tp=2,pp=2,lp=1", 4, True),
    ("llama", "tp=2,pp=2,dp=2,zero=1,lp=1", 4, False),
    ("gpt2-tied", "tp=2,pp=1", 4, False),
    ("gpt2-tied", "tp=2,pp=1,lp=1", 4, False),
    ("gpt2-tied", "tp=2,pp=2,lp=1", 4, True),
    ("gpt2-tied", "tp=2,pp=2,sp=1,lp=1", 4, False),
]


def _chain(wl, layout: Layout):
    """The chain a rank of ``layout`` runs: measured here (``tp`` = 1), else one rank's tensor-parallel
    profile under fake tensors."""
    if layout.tp == 1:
        x, y = wl.batch(0)
        return profile_model(wl.build(), x, loss=wl.loss, target=y, repeats=2, warmup=1)
    from workbench.parallel.tensor.profile import tensor_parallel_profile

    return tensor_parallel_profile(partial(workload_example, wl), "h100-sxm", layout.tp,
                                   sequence_parallel=layout.sequence_parallel, loss_parallel=layout.loss_parallel,
                                   cache=False)


def _planned(model: str, layout: Layout, micro_batches: int, chains: dict):
    """The workload, its chain (profiled once per model, tp, sequence parallelism and split loss) and its 1F1B pipeline
    on ``pp`` devices."""
    args = dict(MODELS[model])
    wl = hf_workload(args.pop("kind"), **args)
    key = (model, layout.tp, layout.sequence_parallel, layout.loss_parallel)
    if key not in chains:
        chains[key] = _chain(wl, layout)
    platform = Target.of(layout.pp, optimizer="adam", zero_grad="none")
    plan = make_plan(chains[key], platform, "1f1b", micro_batches=micro_batches)
    return wl, chains[key], platform, plan


def run_row(model: str, text: str, micro_batches: int, chains: dict) -> dict | None:
    """One row: plan, run, conclude; None when the row needs what this build lacks."""
    layout = Layout.parse(text)
    if layout.tp > 1 and tensor_parallel_plan() is None:
        return None
    wl, chain, platform, plan = _planned(model, layout, micro_batches, chains)
    cfg = LayoutConfig(plan, layout, wl, micro_batches, timeout=600.0)
    t0 = time.perf_counter()
    try:
        parts = run_layout(cfg)
    except RankFailure as e:
        return {"model": model, "layout": layout.describe(), "failed": str(e)}
    wall = time.perf_counter() - t0
    s = conclude_layout(cfg, parts, chain, platform, out=None, wall_seconds=wall, say=lambda *a, **k: None)
    errors = s["memory_error"]
    big = max(range(layout.devices), key=lambda r: s["memory_predicted"][r])
    return {"model": model, "layout": layout.describe(),
            "ranks": layout.devices, "grad": s["max_grad_error"],
            "predicted": s["memory_predicted"][big], "measured": s["memory_measured"][big], "lo": min(errors),
            "hi": max(errors), "wall": wall, "tied": s["tied_copies_equal"], "source": s["prediction"]}


def print_row(r: dict) -> None:
    if "failed" in r:
        print(f"{r['model']:<11} {r['layout']:<28} FAILED: {r['failed']}", flush=True)
        return
    tied = "" if not r["tied"] else ("  tied copies equal" if all(r["tied"].values()) else "  TIED COPIES DIFFER")
    print(f"{r['model']:<11} {r['layout']:<28} {r['ranks']:>5} {r['grad']:>9.2e} {format_bytes(r['predicted']):>11} "
          f"{format_bytes(r['measured']):>11} {r['lo']:>+8.1%} .. {r['hi']:>+7.1%} {r['wall']:>7.1f}{tied}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the rows marked quick only")
    ap.add_argument("--model", choices=sorted(MODELS), help="this model's rows only")
    ap.add_argument("--match", help="the rows whose layout contains this text only (e.g. tp=2,pp=)")
    args = ap.parse_args(argv)
    print(f"{'model':<11} {'layout':<28} {'ranks':>5} {'grad err':>9} {'predicted':>11} {'measured':>11} "
          f"{'err lo .. hi':>18} {'wall s':>7}")
    chains: dict = {}
    sources, skipped = set(), []
    for model, text, mb, quick in ROWS:
        skip = (args.quick and not quick) or (args.model and model != args.model)
        if skip or (args.match and args.match not in text):
            continue
        row = run_row(model, text, mb, chains)
        if row is None:
            skipped.append(f"{model} {text}")
            continue
        print_row(row)
        sources.update(row.get("source", []))
    for s in sorted(sources):
        print(f"predictions: {s}")
    if skipped:
        print(f"skipped (this build has no tensor-parallel sharding plan): {'; '.join(skipped)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
