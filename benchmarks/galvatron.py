"""Galvatron's search engine beside the workbench's planner: Llama-2-7B on one node of 8 x 80 GB GPUs (issue 36).

Galvatron (PKU-DAIR/Hetu-Galvatron) ships profiles of Llama-2-7B measured on its own node: per-layer forward times
against the batch size at sequence 2048 and per-layer memory (``galvatron/models/gpt/configs/
computation_profiling_bf16_llama2-7b_all.json`` and ``memory_profiling_bf16_llama2-7b_all.json``), and the node's
collectives (``galvatron/profile_hardware/hardware_configs/*_1nodes_8gpus_per_node.json``: all-reduce 154 GB/s over
8 GPUs, p2p 109-164 GB/s). Those numbers are an A100's (a block's forward, 3.86 ms per sample of 2048 tokens, is
232 TFLOP/s: 74 % of an A100's 312, 23 % of an H100's 990; an all-reduce bus bandwidth of 154 x 14 / 8 = 270 GB/s is
NVLink 3's), so the workbench's side is a fake profile for ``a100-80gb``. The settings are the profiles' and the
search script's (``galvatron/models/gpt/scripts/search_dist.yaml``): global batch 64, bf16, ZeRO-2 as the default
data parallelism, 1F1B (``pipedream_flush``); memory 80 GB and sequence 2048 (the profiles' own; the yaml's 8192
has no time profile). Galvatron runs its search twice: its full space (DP, TP, PP, SP, ZeRO-2/3 and
checkpointing per layer) and held to pipeline-only (DP and TP disabled: PP 8).

Setup (its search engine runs on CPU; nothing of Galvatron is in this repository). The package registry's
hetu-galvatron 2.4.0 (2025-04) ships only a Llama-7B profile whose memory file its own search engine cannot read
(``KeyError: 2048``: the file predates the per-sequence-length format), so the source is the repository at commit
cea12ffb146a220643c8f99f9cb84294755d29f8 (2026-06-16)::

    git clone https://github.com/PKU-DAIR/Hetu-Galvatron galvatron-src && git -C galvatron-src checkout cea12ffb
    python -m venv venv-galvatron && venv-galvatron/bin/pip install torch==2.13.0 numpy scipy tqdm pydantic rich \\
        hydra-core omegaconf transformers && venv-galvatron/bin/pip install --no-deps triton
    GALVATRON_PYTHON=venv-galvatron/bin/python GALVATRON_SRC=galvatron-src python benchmarks/galvatron.py

(``galvatron.core.runtime``'s package import needs flash-attn and CUDA kernels; the search imports only its
``args_schema``, so the driver below registers the package without running its ``__init__``.) Without the two
variables the Galvatron column is the run recorded here on 2026-11-29 (torch 2.13.0+cpu, 2 cores):

- full search: DP 8 (no PP, no TP), ZeRO-3 on the first 16 blocks and ZeRO-2 on the last 16, the embedding and
  the head in TP 2 with SP and ZeRO-3, no checkpointing, the global batch in 4 micro-batches of 16 (2 per GPU):
  step 3.52 s, 18.19 samples/s; 19 minutes of search;
- pipeline-only: PP 8 (4 blocks per stage), 32 micro-batches of 2, 1F1B, no checkpointing: step 4.41 s,
  14.52 samples/s; 6 seconds of search.

The full search is 25 % faster than the pipeline alone, as issue 36 quotes (18.2 and 14.5 samples/s).

The workbench's column: ``plan --parallel auto`` and Galvatron's full choice evaluated with ``--parallel``
when the workbench has them, and today's pipeline-only planners (1F1B over 8 GPUs, the micro-batch size among
1, 2, 4 that plans fastest, 64 samples a step; and the periodic ``dp``); profiles are cached in
``build/galvatron/``. Run from the repository root: ``python benchmarks/galvatron.py``. Measured here on
2026-11-29, before ``plan --parallel`` was merged (re-run the script once it is, for the first three workbench
rows): 1F1B on PP 8 predicts 6.12 samples/s (micro-batch 1 x 64, peak 29.2 GiB), the periodic plan 6.70; both
are below Galvatron's 14.52 mostly because the workbench's fake A100 profile puts a block's forward at 11.10 ms
a sample where Galvatron's measured profile has 3.86 ms (2.88x): the gap is in the per-layer times (the
workbench's roofline estimate for the Hugging Face model against Galvatron's measurement of its own kernels),
not in the pipeline partition (both split the blocks 4 per stage).

Issue 36's third target, the layout table (:func:`layout_table`: ``benchmarks/layout_search.py``'s families and
the search's choice, each through ``plan --parallel``'s evaluator; per-rank profiles of a 2-block Llama-2-7B
repeated to 32 blocks), measured here on 2026-11-29 (search 22 s, 42 layouts evaluated, 910 skipped by a bound),
samples/s of the node:

- chosen (``--parallel auto``): DP 8 ZeRO-2, micro-batch 4 x 2, keep: 15.68 (peak 73.8 GiB, MFU 51.0 %);
  Galvatron's full search: DP 8, ZeRO-3/ZeRO-2 per block, micro-batch 2 x 4: 18.19;
- pure FSDP (zero 3): micro-batch 4 x 2, keep: 15.68 (61.5 GiB: the same step as ZeRO-2, less memory);
- pure pipeline: PP 8 DualPipeV, micro-batch 4 x 16, keep: 13.49; Galvatron's pipeline-only (PP 8, 1F1B): 14.52;
- TP 8: micro-batch 8 x 8: 7.91; TP 4 x PP 2 x VP 5 (NVIDIA's shape on 8 GPUs), micro-batch 8 x 8: 10.37.

Both planners choose data parallelism over the 8 GPUs with sharded state, and both put the pipeline below it:
the full answer is 16 % faster than the best pure pipeline by the workbench's model, 25 % by Galvatron's. The
workbench's figures are 14 % and 7 % below Galvatron's: its fake A100-80GB profile now puts a block's forward at
5.55 ms a sample at micro-batch 1 (5.06 at 4) against Galvatron's measured 3.86 ms.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "galvatron"
GPU, DEVICES, GLOBAL_BATCH, SEQUENCE = "a100-80gb", 8, 64, 2048
COMMIT = "cea12ffb146a220643c8f99f9cb84294755d29f8"
#: Galvatron's per-sample forward time of a block, ms: the slope of its linear fit over batch sizes 1..12 of
#: ``layertype_0_bsz*_seq2048`` (computation_profiling_bf16_llama2-7b_all.json), as its search engine prints it
GALVATRON_BLOCK_MS = 3.8590169
#: Galvatron's answers, measured here (see the module docstring); "layers" is per block: (dp type, checkpoint)
GALVATRON_RECORDED = {
    "full": {"throughput": 18.188049412731036, "pp": 1, "tp": 1, "dp": 8, "global_batch": 64, "chunks": 4,
             "pp_division": "32", "zero": "ZeRO-3 on 16 blocks, ZeRO-2 on 16; embedding and head TP 2 with SP, "
             "ZeRO-3", "checkpoint": 0},
    "pipeline": {"throughput": 14.523663064489634, "pp": 8, "tp": 1, "dp": 1, "global_batch": 64, "chunks": 32,
                 "pp_division": "4,4,4,4,4,4,4,4", "zero": "ZeRO-3 on 0 blocks, ZeRO-2 on 32; embedding and head "
                 "TP 1", "checkpoint": 0},
}


def llama2_7b(batch_size: int = 1, layers: int | None = None):
    """Llama-2-7B from ``transformers.LlamaConfig``'s defaults (hidden 4096, MLP 11008, 32 blocks, 32 heads,
    vocabulary 32000, context 2048), random bf16 weights, ``batch_size`` sequences of 2048 tokens, next-token loss;
    ``layers``: only that many of its blocks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from torch.nn import functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.profiles.fake import default_dtype

    config = LlamaConfig(use_cache=False, **({"num_hidden_layers": layers} if layers else {}))
    with default_dtype(torch.bfloat16):
        model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (batch_size, config.max_position_embeddings))

    def loss(out, targets):
        return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())

    return model, ids, ids.roll(-1, 1), loss


def llama2_7b_2_layers(batch_size: int = 1):
    """Llama-2-7B with 2 of its 32 blocks: the layout table's per-rank profiles (:func:`layout_table` repeats the
    second block to 32, :func:`workbench.parallel.profiles.repeat_blocks`)."""
    return llama2_7b(batch_size, layers=2)


def llama2_7b_mbs2():
    return llama2_7b(2)


def llama2_7b_mbs4():
    return llama2_7b(4)


_DRIVER = r"""
import json, os, sys, types
src = os.environ["GALVATRON_SRC"]
sys.path.insert(0, src)
m = types.ModuleType("galvatron.core.runtime"); m.__path__ = [os.path.join(src, "galvatron/core/runtime")]
sys.modules["galvatron.core.runtime"] = m     # its __init__ imports the training runtime (flash-attn, CUDA)
from galvatron.core.arguments import load_with_hydra
from galvatron.core.search_engine.search_engine import GalvatronSearchEngine
from galvatron.utils.hf_config_adapter import model_name, model_layer_configs, resolve_model_config
gpt = os.path.join(src, "galvatron/models/gpt")
os.chdir(gpt)
args = load_with_hydra(os.path.join(gpt, "scripts/search_dist.yaml"), overrides=sys.argv[1:], mode="search")
resolve_model_config(args)
eng = GalvatronSearchEngine(args)
eng.set_search_engine_info(path=gpt, model_layer_configs=model_layer_configs(args), model_name=model_name(args))
eng.initialize_search_engine(show_all_strategy_list=False)
print("GALVATRON_THROUGHPUT", eng.parallelism_optimization())
"""


def run_galvatron(space: str, python: str, src: str) -> dict:
    """Galvatron's search (``space``: ``full`` or ``pipeline``) and its answer from the config it writes."""
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"MEMORY_CONSTRAINT={80}", f"SEQ_LENGTH={SEQUENCE}", f"LOG_DIR={out}/logs",
                     "search_engine.profiling_info.time_profile_mode=batch",
                     f"+search_engine.options_info.output_config_path={out}"]
        if space == "pipeline":
            overrides += [f"search_engine.search_space_info.{k}=1" for k in ("disable_dp", "disable_tp", "disable_sp")]
        r = subprocess.run([python, "-c", _DRIVER, *overrides], capture_output=True, text=True,
                           env={**os.environ, "GALVATRON_SRC": src})
        found = re.findall(r"GALVATRON_THROUGHPUT (\S+)", r.stdout)
        configs = list(Path(out).glob("galvatron_config_*.json"))
        if r.returncode or not found or not configs:
            raise RuntimeError(f"Galvatron's search failed: {(r.stderr or r.stdout)[-2000:]}")
        return galvatron_answer(json.loads(configs[0].read_text()), float(found[-1]))


def galvatron_answer(config: dict, throughput: float) -> dict:
    """Galvatron's output config in the table's terms: its degrees, its data parallelism per block (ZeRO-3 where
    ``dp_types_enc`` is 1, else its default), its checkpointed blocks."""
    pp = config["pp_deg"]
    tps = [int(t) for t in config["tp_sizes_enc"].split(",")]
    sdp = [int(d) for d in config["dp_types_enc"].split(",")]
    ckpt = [int(c) for c in config["checkpoint"].split(",")]
    default = {"zero2": "ZeRO-2", "ddp": "DDP"}[config["default_dp_type"]]
    zero3 = sum(sdp)
    head = (f"; embedding and head TP {config['vtp']}{' with SP' if config.get('vsp') else ''}"
            f"{', ZeRO-3' if config.get('embed_sdp') else ''}")
    return {"throughput": throughput, "pp": pp, "tp": max(tps), "dp": DEVICES // pp // max(tps),
            "global_batch": config["global_bsz"], "chunks": config["chunks"], "pp_division": config["pp_division"],
            "zero": f"ZeRO-3 on {zero3} blocks, {default} on {len(sdp) - zero3}{head}", "checkpoint": sum(ckpt)}


def _workbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def workbench_profile(mbs: int) -> Path:
    """The fake A100-80GB profile of Llama-2-7B at micro-batch ``mbs`` (made once, then read from build/)."""
    out = BUILD / f"llama2-7b-{GPU}-mbs{mbs}.csv"
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        func = "llama2_7b" if mbs == 1 else f"llama2_7b_mbs{mbs}"
        r = _workbench("profile", "--module", f"benchmarks/galvatron.py:{func}", "--fake", "--gpu", GPU,
                       "--out", str(out))
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
    return out


def workbench_pipeline(mbs: int, method: str = "1f1b") -> dict:
    """Today's pipeline planner on 8 GPUs: ``method`` over the profile at micro-batch ``mbs``, 64 samples a step
    (flushed: GLOBAL_BATCH / mbs micro-batches a flush), bf16 with fp32 master weights and Adam, as Galvatron's."""
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--micro-batches", str(GLOBAL_BATCH // mbs)] if method != "dp" else []
        r = _workbench("plan", "--profile", str(workbench_profile(mbs)), "--devices", str(DEVICES), "--gpu", GPU,
                       "--method", method, "--precision", "bf16-mixed", "--optimizer", "adam", "--json",
                       f"{tmp}/plan.json", "-q", *extra)
        if r.returncode or not Path(f"{tmp}/plan.json").exists():
            return {"error": (r.stderr.strip().splitlines() or ["no plan"])[-1]}
        plan = json.loads(Path(f"{tmp}/plan.json").read_text())
    split = [s["layers"][1] - s["layers"][0] + 1 for s in sorted(plan["stages"], key=lambda s: s["layers"][0])]
    return {"samples_per_s": mbs / plan["period"], "status": plan["status"], "split": split,
            "peak_gib": max(plan["memory"]) / 2**30, "micro_batches": plan.get("micro_batches"), "mbs": mbs,
            "recomputed": sum(a != "keep" for a in plan.get("activations", []))}


def workbench_parallel(layout: str = "auto") -> dict | None:
    """``plan --parallel LAYOUT`` (issue 36: ``auto`` searches, ``tp=..,pp=..,dp=..,zero=..`` evaluates one) when
    this workbench has it, else None."""
    if "--parallel" not in _workbench("plan", "--help").stdout:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        r = _workbench("plan", "--module", "benchmarks/galvatron.py:llama2_7b", "--fake", "--gpu", GPU,
                       "--devices", str(DEVICES), "--devices-per-node", str(DEVICES), "--global-batch",
                       str(GLOBAL_BATCH), "--parallel", layout, "--precision", "bf16-mixed", "--optimizer", "adam",
                       "--json", f"{tmp}/plan.json", "-q")
        if r.returncode:
            return {"error": (r.stderr.strip().splitlines() or ["no plan"])[-1]}
        plan = json.loads(Path(f"{tmp}/plan.json").read_text())
    return {"samples_per_s": plan["tokens_per_second"] / SEQUENCE, "parallel": plan["parallel"],
            "peak_gib": max(plan["memory"]) / 2**30, "mfu": plan.get("mfu")}


def layout_table() -> list[str]:
    """Issue 36's third target: the layout table of ``benchmarks/layout_search.py`` (the search's choice and the
    best of each family people run, each evaluated as ``plan --parallel`` evaluates a layout) for Galvatron's case:
    Llama-2-7B on one node of 8 A100-80GB, global batch 64 of 2048 tokens, bf16-mixed, Adam. Per-rank profiles for
    tp 1, 2, 4, 8 and micro-batches 1, 2, 4, 8 of a 2-block model (cached in ``build/profiles``), its second block
    repeated to 32."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import layout_search

    from workbench.front.cli import build_parser
    from workbench.front.layouts import _chains, job_from_args
    from workbench.parallel.profiles import repeat_blocks
    from workbench.parallel.search import search

    args = build_parser().parse_args(
        ["plan", "--module", str(ROOT / "benchmarks/galvatron.py:llama2_7b_2_layers"), "--fake", "--gpu", GPU,
         "--devices", str(DEVICES), "--devices-per-node", str(DEVICES), "--global-batch", str(GLOBAL_BATCH),
         "--parallel", "auto", "--optimizer", "adam", "--precision", "bf16-mixed"])
    short, first, sizes = _chains(args, None)
    cache: dict = {}

    def chain_for(tp: int, mbs: int | None):
        if (tp, mbs) not in cache:
            cache[(tp, mbs)] = repeat_blocks(short(tp, mbs), 32)
        return cache[(tp, mbs)]

    job = job_from_args(args, chain_for(1, sizes[0]))
    result = search(job, chain_for, micro_batch_sizes=sizes, tps=None)
    per_gpu = lambda e: e.tokens_per_second / SEQUENCE  # noqa: E731   samples/s of the whole node
    lines = [f"workbench --parallel | {'chosen (auto)':<30} | {_describe(result.best)} | "
             f"{per_gpu(result.best):.2f} samples/s"]
    for name, restrict in layout_search.families(DEVICES):
        best = layout_search._family_best(job, chain_for, sizes, restrict)
        lines.append(f"workbench --parallel | {name:<30} | {_describe(best)} | "
                     + (f"{per_gpu(best):.2f} samples/s" if best else "-"))
    lines.append(f"(search: {len(result.evaluated)} evaluated, {len(result.pruned)} skipped by a bound, "
                 f"{result.seconds:.1f} s)")
    return lines


def _describe(e) -> str:
    if e is None:
        return "no layout fits"
    return (f"{e.layout.describe()}, {e.activations}, peak {e.peak / 2**30:.1f} GiB, step {e.step_seconds:.2f} s, "
            f"MFU {e.mfu:.1%}")


def _galvatron_row(space: str, g: dict | None, source: str) -> str:
    if g is None:
        return f"Galvatron ({source}) | {space} | not recorded: run with GALVATRON_PYTHON and GALVATRON_SRC"
    layout = f"PP {g['pp']} x TP {g['tp']} x DP {g['dp']}, {g['zero']}, split {g['pp_division']}"
    mbs = g["global_batch"] // g["chunks"] // g["dp"]          # samples per micro-batch on one GPU (pipeline)
    return (f"Galvatron ({source}) | {space} | {layout} | {mbs} x {g['chunks']} | {g['checkpoint']} blocks | "
            f"{g['global_batch'] / g['throughput']:.2f} | {g['throughput']:.2f}")


def _workbench_row(space: str, w: dict | None) -> str:
    if w is None:
        return (f"workbench | {space} | not in this workbench yet: re-run python benchmarks/galvatron.py once "
                "plan --parallel auto is merged")
    if "error" in w:
        return f"workbench | {space} | {w['error']}"
    if "parallel" in w:
        p = w["parallel"]
        layout = f"PP {p['pp']} x TP {p['tp']} x DP {p['dp']}, ZeRO-{p['zero']}, {p.get('schedule')}"
        batches = f"{p.get('micro_batch_size')} x {p.get('micro_batches')}"
        return (f"workbench | {space} | {layout} | {batches} | - | {GLOBAL_BATCH / w['samples_per_s']:.2f} | "
                f"{w['samples_per_s']:.2f}")
    m = w["micro_batches"] or "periodic"
    return (f"workbench | {space} | PP {DEVICES}, split {','.join(map(str, w['split']))} (layers), peak "
            f"{w['peak_gib']:.1f} GiB, {w['status']} | {w['mbs']} x {m} | {w['recomputed']} layers | "
            f"{GLOBAL_BATCH / w['samples_per_s']:.2f} | {w['samples_per_s']:.2f}")


def main() -> int:
    python, src = os.environ.get("GALVATRON_PYTHON"), os.environ.get("GALVATRON_SRC")
    if python and src:
        galv, source = {space: run_galvatron(space, python, src) for space in ("full", "pipeline")}, "run now"
    else:
        print("Galvatron is not set up (GALVATRON_PYTHON, GALVATRON_SRC: see this script's docstring); its column "
              "is the run recorded in the docstring")
        galv, source = GALVATRON_RECORDED, f"recorded, {COMMIT[:8]}"
    print(f"Llama-2-7B, {DEVICES} x {GPU}, sequence {SEQUENCE}, global batch {GLOBAL_BATCH}, bf16 + fp32 master, "
          "Adam")
    print("planner | search | layout | micro-batch x count (per replica) | recomputed | step s | samples/s")
    print(_galvatron_row("full", galv["full"], source))
    print(_workbench_row("--parallel auto", workbench_parallel("auto")))
    for space, zero in (("Galvatron's full choice, ZeRO-3", 3), ("Galvatron's full choice, ZeRO-2", 2)):
        print(_workbench_row(f"{space} (--parallel)", workbench_parallel(f"tp=1,pp=1,dp={DEVICES},zero={zero}")))
    print(_galvatron_row("pipeline-only (PP 8, 1F1B)", galv["pipeline"], source))
    best = max((workbench_pipeline(mbs) for mbs in (1, 2, 4)), key=lambda w: w.get("samples_per_s", 0))
    print(_workbench_row("pipeline-only (PP 8, 1F1B)", best))
    print(_workbench_row("pipeline-only (PP 8, periodic dp)", workbench_pipeline(1, "dp")))
    print("\nThe layout table (benchmarks/layout_search.py's families) through the workbench's --parallel evaluator:")
    print("\n".join(layout_table()))
    block = _block_forward_ms(workbench_profile(1))
    print(f"a block's forward, one sample of {SEQUENCE} tokens: Galvatron's profile {GALVATRON_BLOCK_MS:.2f} ms "
          f"(its fit over batch sizes), the workbench's fake {GPU} profile {block:.2f} ms "
          f"({block / GALVATRON_BLOCK_MS:.2f}x)")
    return 0


def _block_forward_ms(profile: Path) -> float:
    """The forward time of the profile's first block (model.layers.0), milliseconds."""
    for line in profile.read_text().splitlines():
        if line.startswith("model.layers.0,"):
            return float(line.split(",")[1])
    raise ValueError(f"{profile}: no model.layers.0")


if __name__ == "__main__":
    raise SystemExit(main())
