"""``export --to torchtitan`` checked by torchtitan itself: its 0.2.2 ``ConfigManager`` reads the TOML, its 0.3.0
``ConfigManager`` reads the command line, and each value it parsed is compared with the one exported.

torchtitan is not among the project's requirements (see docs/model.md, "Export to torchtitan and Megatron-LM":
its config module needs tyro, and 0.2.2's package import pulls tokenizers and triton; 0.3.0's ``--module llama3``
config also needs spmd-types, tensorboard, torchdata and datasets). Set it up in two virtual environments of their
own, with the CPU build of torch::

    python -m venv venv-titan022 && venv-titan022/bin/pip install torch==2.13.0 tyro tokenizers triton
    venv-titan022/bin/pip install --no-deps torchtitan==0.2.2
    python -m venv venv-titan030 && venv-titan030/bin/pip install torch==2.13.0 tyro tensorboard \\
        "datasets>=3.6,<4.8" && venv-titan030/bin/pip install --no-deps torchtitan==0.3.0 spmd-types==0.2.3 \\
        torchdata tokenizers triton
    TORCHTITAN_022_PYTHON=venv-titan022/bin/python TORCHTITAN_030_PYTHON=venv-titan030/bin/python \\
        python benchmarks/torchtitan_export.py

Without them it says so and exits 0 (nothing is checked). Measured here on 2026-11-28 (torch 2.13.0+cpu,
torchtitan 0.2.2 and 0.3.0 from the package registry): all six layouts below parse in both versions and every
parsed value equals the exported one; 0.3.0's own split function (``_generate_llm_fqn_per_model_part``) gives the
plan's blocks per stage for the split the 0.3 command line sets. Before the check, 0.3.0 refused the first
export of a pipeline ("CUDA graphs do not support pipeline parallelism yet"): the exporter now adds
``--training.disable_cuda_graphs`` under PP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.parallel.export import job_from_plan, to_toml, torchtitan_settings  # noqa: E402

#: name -> (plan --method, devices, activations, layout, sequence length, model) ; layouts of real plans (one
#: assignment each: workbench/methods.py alone lists methods together, tests/test_methods.py)
CASES: dict[str, tuple] = {}
CASES["8B 1F1B x4, TP 2, recompute"] = ("1f1b", 4, "recompute", dict(tp=2, pp=4, dp=1), 8192, "llama3_8b")
CASES["8B interleaved x4x2, DP 2 FSDP"] = ("interleaved-1f1b", 4, "keep", dict(tp=1, pp=4, dp=2, zero=3, chunks=2),
                                          8192, "llama3_8b")
CASES["8B ZB-V x2, TP 2 SP, DP 2 ZeRO-2"] = ("zbv", 2, "keep", dict(tp=2, pp=2, dp=2, zero=2, chunks=2,
                                                                   sequence_parallel=True), 4096, "llama3_8b")
CASES["8B GPipe x4, DP 2 ZeRO-1"] = ("gpipe", 4, "keep", dict(tp=1, pp=4, dp=2, zero=1), 8192, "llama3_8b")
CASES["8B FSDP 8 (no pipeline)"] = ("1f1b", 1, "recompute", dict(tp=1, pp=1, dp=8, zero=3), 8192, "llama3_8b")
# NVIDIA's Llama-3-70B layout, Megatron's even split (2 blocks per virtual stage), written by hand
CASES["70B TP 4 x PP 8 x VP 5, DP 2 ZeRO-1"] = (None, 8, "keep", dict(tp=4, pp=8, dp=2, zero=1, chunks=5,
                                                                     sequence_parallel=True), 8192, "llama3_70b")
PROFILE = ROOT / "data/profiles/fake/llama3-8b-h100-sxm.csv"

_PARSE_022 = """
import json, sys
from torchtitan.config import ConfigManager
c = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
want = json.load(open(sys.argv[2]))
bad = [f"{s}.{k}: {getattr(getattr(c, s), k)!r} != {v!r}" for s, keys in want.items() for k, v in keys.items()
       if getattr(getattr(c, s), k) != v]
print(json.dumps(bad))
"""
_PARSE_030 = """
import json, math, sys
from torchtitan.config import ConfigManager
from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part as split
args, want, blocks, per_stage = json.load(open(sys.argv[1]))
c = ConfigManager().parse_args(args)
bad = [f"{s}.{k}: {getattr(getattr(c, s), k)!r} != {v!r}" for s, keys in want.items() for k, v in keys.items()
       if getattr(getattr(c, s), k) != v]
p = c.parallelism
if p.pipeline_parallel_degree > 1 and p.pipeline_parallel_layers_per_stage:
    a, b = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
    stages = math.ceil((blocks + a + b) / p.pipeline_parallel_layers_per_stage)
    got = [sum(m.startswith("layers.") for m in part) for part in split(stages, blocks, a, b)]
    if got != per_stage:
        bad.append(f"split {got} != plan's {per_stage}")
print(json.dumps(bad))
"""


def even_plan(blocks: int, pp: int, chunks: int) -> dict:
    """A plan of interleaved 1F1B over a Llama's blocks split evenly (the embedding with the first stage, the norm
    and the head with the last), in the plan JSON's fields."""
    names = ["model.embed_tokens+model.rotary_emb", *(f"model.layers.{i}" for i in range(blocks)), "model.norm",
             "lm_head"]
    per, stages, first = blocks // (pp * chunks), [], 0
    for s in range(pp * chunks):
        last = first + per - 1 + (s == 0) + 2 * (s == pp * chunks - 1)
        stages.append({"layers": [first, last], "device": s % pp, "fwd_start": 0.0, "bwd_start": 0.0})
        first = last + 1
    assignment = [st["device"] for st in stages for _ in range(st["layers"][0], st["layers"][1] + 1)]
    return {"method": "interleaved-1f1b", "schedule": "interleaved-1f1b", "devices": pp, "micro_batches": 2 * pp,
            "assignment": assignment, "stages": stages, "activations": ["keep"] * len(names),
            "memory_setup": {"memory_model": "full", "precision": "bf16-mixed"}, "extra": {"layer_names": names}}


def plan_case(name: str, folder: Path) -> tuple[dict, int, str]:
    """A real plan of the Llama-3-8B fake profile with the case's layout added as its "parallel" (a method of
    None: Llama-3-70B's 80 blocks split evenly, :func:`even_plan`)."""
    method, devices, acts, layout, seq, model = CASES[name]
    if method is None:
        data = even_plan(80, layout["pp"], layout["chunks"])
        data["parallel"] = {"micro_batch_size": 1, "micro_batches": 2 * devices, "schedule": data["schedule"],
                            **layout}
        return data, seq, model
    out = folder / "plan.json"
    extra = ["--chunks", "2"] if layout.get("chunks", 1) > 1 else []
    subprocess.run([sys.executable, "-m", "workbench", "plan", "--profile", str(PROFILE), "--devices", str(devices),
                    "--gpu", "h100-sxm", "--memory", "1TiB", "--method", method, "--micro-batches", str(2 * devices),
                    "--activations", acts, "--json", str(out), "-q", *extra], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    data = json.loads(out.read_text())
    data["parallel"] = {"micro_batch_size": 1, "micro_batches": data.get("micro_batches") or 2 * devices,
                        "schedule": method, **layout}
    return data, seq, model


def check(name: str, py022: str | None, py030: str | None, folder: Path) -> list[str]:
    data, seq, model = plan_case(name, folder)
    settings = torchtitan_settings(job_from_plan(data, seq_len=seq))
    job = job_from_plan(data, seq_len=seq)
    row = [name]
    if py022:
        (folder / "job.toml").write_text(to_toml(settings))
        (folder / "want.json").write_text(json.dumps(settings.sections))
        row.append(_run(py022, _PARSE_022, folder / "job.toml", folder / "want.json"))
    if py030:
        want = {s: {k: v for k, v in keys.items() if k not in ("enable_async_tensor_parallel",
                                                                 "module_fqns_per_model_part")}
                for s, keys in settings.sections.items() if s != "activation_checkpoint"}
        args = ["--module", "llama3", "--config", model, *settings.overrides]
        (folder / "args.json").write_text(json.dumps([args, want, job.blocks, [p.blocks for p in job.parts]]))
        row.append(_run(py030, _PARSE_030, folder / "args.json"))
    return row


def _run(python: str, script: str, *files: Path) -> str:
    r = subprocess.run([python, "-c", script, *map(str, files)], capture_output=True, text=True, cwd=files[0].parent)
    if r.returncode:
        return "refused: " + " ".join(r.stderr.split()[-40:])
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    return "ok" if not bad else "differs: " + "; ".join(bad)


def main() -> int:
    py022, py030 = os.environ.get("TORCHTITAN_022_PYTHON"), os.environ.get("TORCHTITAN_030_PYTHON")
    if not (py022 or py030):
        print("torchtitan is not set up: see this script's docstring (TORCHTITAN_022_PYTHON, "
              "TORCHTITAN_030_PYTHON); nothing checked")
        return 0
    heads = ["layout"] + ["torchtitan 0.2.2 (TOML)"] * bool(py022) + ["torchtitan 0.3.0 (command line)"] * bool(py030)
    print(" | ".join(heads))
    failures = 0
    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            row = check(name, py022, py030, Path(tmp))
        failures += any(cell != "ok" for cell in row[1:])
        print(" | ".join(row))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
