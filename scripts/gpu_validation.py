"""Profile networks on a GPU and check plans there: one script for one lease of a GPU machine.

Usage (on a machine with a CUDA GPU; the package need not be installed)::

    python scripts/gpu_validation.py [--dtype float32|bfloat16] [--out DIR] [--quick] [--only-profiles]
                                     [--skip-profiles] [--profiles NAME ...] [--runs NAME ...]

``--dtype bfloat16`` does everything in pure bf16 (the models' parameters and
floating inputs cast, token ids left integer): profiles, replays, shared runs
and the reference gradients. Its profiles are ``{name}-bf16.csv`` and its
default folder is ``build/gpu-bf16`` (float32: ``{name}.csv``, ``build/gpu``),
so the two never overwrite each other. Smoke test without a GPU:
``--device cpu --quick --profiles mlp --runs mlp-P2`` (a tiny model, in either dtype).

What it does, each finished unit written atomically, so an interrupted run keeps what it finished:

1. ``env.json``: torch, CUDA and cuDNN versions, the GPU, the TF32 and bf16-reduction switches, the dtype.
2. ``profiles/{name}{suffix}.csv``: every entry of ``GPU_PROFILES`` (or ``--profiles``) profiled on
   the GPU (median of the repeats, CUDA events).
3. ``runs/{name}/``: for every entry of ``VALIDATIONS``, a plan made on that
   GPU profile (``dp`` under a memory limit that binds, or the best schedule
   of a given interleaved allocation) and two runs of it:

   - ``replay.csv``: each device's program alone on the GPU
     (:func:`workbench.runtime.replay.replay_devices`): measured compute per
     mini-batch and the allocator's peak beside the prediction;
   - ``shared/``: all devices as processes sharing the one GPU
     (:func:`workbench.front.running.run_and_compare`; gloo, messages
     staged through the host; learning rate 0, so the gradients are checked
     against one process on the same GPU, within ``grad_tolerance`` of the
     dtype). Memory per device and gradients are meaningful here; times are
     not (the processes take turns on the GPU).

4. ``validation.csv``: one row per finished run in ``DIR/runs`` (each run's ``row.json``, so runs
   made by an earlier call into the same folder stay in it); the rows of this call are printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from workbench.io import write_frame_atomic, write_text_atomic  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.profiles import read_profile, write_profile  # noqa: E402
from workbench.profiles.profiler import profile_zoo  # noqa: E402

GPT_SMALL = dict(layers=12, d_model=768, heads=12, seq_len=512, vocab=50257)
GPT_MEDIUM = dict(layers=24, d_model=1024, heads=16, seq_len=512, vocab=50257)

# network -> settings (zoo model, batch size, warm-up, repeats, model options); in --dtype throughout
GPU_PROFILES: dict[str, dict] = {
    "resnet50": dict(model="resnet50", batch_size=32, warmup=5, repeats=20, options=dict(image_size=224)),
    "resnet101": dict(model="resnet101", batch_size=32, warmup=5, repeats=20, options=dict(image_size=224)),
    "vgg16": dict(model="vgg16", batch_size=32, warmup=5, repeats=20, options=dict(image_size=224)),
    "gpt-small": dict(model="gpt", batch_size=8, warmup=5, repeats=20, options=GPT_SMALL),
    "gpt-medium": dict(model="gpt", batch_size=8, warmup=5, repeats=20, options=GPT_MEDIUM),
    "mlp": dict(model="mlp", batch_size=8, warmup=1, repeats=3, options={}),  # the CPU smoke test's
}
# dtype -> suffix of the profile files and of the default output folder
SUFFIX = {"float32": "", "bfloat16": "-bf16"}

# run name -> (profile, devices, how to plan); "dp" / "ilp-general": memory-aware dp / the general
# ILP (needs Pyomo and HiGHS) at a limit that binds (the demo's: halfway between the least memory of
# any contiguous plan and what dp uses unconstrained); a tuple of stage devices: that interleaved
# allocation over balanced stages, best periodic schedule, no memory limit
VALIDATIONS: dict[str, tuple[str, int, object]] = {
    "resnet50-P1": ("resnet50", 1, "dp"),
    "resnet50-P2": ("resnet50", 2, "dp"),
    "resnet50-P4": ("resnet50", 4, "dp"),
    "gpt-small-P1": ("gpt-small", 1, "dp"),
    "gpt-small-P4": ("gpt-small", 4, "dp"),
    "gpt-small-P2-interleaved": ("gpt-small", 2, (0, 1, 0, 1)),
    "resnet50-P4-ilp-general": ("resnet50", 4, "ilp-general"),
    "gpt-small-P4-ilp-general": ("gpt-small", 4, "ilp-general"),
    "vgg16-P4": ("vgg16", 4, "dp"),
    "gpt-medium-P4": ("gpt-medium", 4, "dp"),
    "mlp-P2": ("mlp", 2, "dp"),  # a smoke test (not run by default)
}
DEFAULT_RUNS = [r for r in VALIDATIONS if not r.startswith("mlp")]
DEFAULT_PROFILES = [p for p in GPU_PROFILES if p != "mlp"]
ILP_TIME_LIMIT = 60.0


def environment(dtype: str = "float32") -> dict:
    """What the numbers were measured on."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "dtype": dtype,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_memory=p.total_memory,
                    multiprocessors=p.multi_processor_count, gpus=torch.cuda.device_count())
    return info


def balanced_stages(chain, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous stages of about equal compute (a greedy cut at multiples of total / n)."""
    comp = [layer.forward + layer.backward for layer in chain.layers]
    total, acc, cuts = sum(comp), 0.0, []
    for i, c in enumerate(comp[:-1]):
        acc += c
        if len(cuts) < n - 1 and acc >= total * (len(cuts) + 1) / n and len(comp) - i - 1 >= n - 1 - len(cuts):
            cuts.append(i)
    bounds, first = [], 0
    for c in cuts:
        bounds.append((first, c))
        first = c + 1
    bounds.append((first, len(comp) - 1))
    return bounds


def make_plan(chain, devices: int, how):
    """The plan a validation runs, and its platform."""
    from workbench.front.demo import demo_memory_limit
    from workbench.planners import plan as run_planner
    from workbench.schedules.builder import best_schedule

    platform = Target.of(devices, bandwidth="12GB/s", memory_model="paper")  # the runtime counts rule 7 (paper)
    if isinstance(how, str):  # "dp" or "ilp-general"
        if devices > 1:
            platform = platform.with_(memory=demo_memory_limit(chain, platform))
        if how == "dp":
            return run_planner(chain, platform, "dp"), platform
        return run_planner(chain, platform, "ilp", allocation="general", time_limit=ILP_TIME_LIMIT), platform
    assignment: list[int] = []
    for (a, b), d in zip(balanced_stages(chain, len(how)), how):
        assignment += [d] * (b - a + 1)
    return best_schedule(chain, platform, assignment, method="interleaved"), platform


def profile_file(out: Path, name: str, dtype: str = "float32") -> Path:
    """Where network ``name``'s profile in ``dtype`` goes: ``out/profiles/{name}{suffix}.csv``.

    >>> profile_file(Path("o"), "resnet50", "bfloat16").as_posix()
    'o/profiles/resnet50-bf16.csv'
    """
    return out / "profiles" / f"{name}{SUFFIX[dtype]}.csv"


def profile_all(out: Path, names: list[str], repeats: int | None, device: str = "cuda",
                dtype: str = "float32") -> None:
    for name in names:
        s = GPU_PROFILES[name]
        t0 = time.perf_counter()
        where = "one GPU, nothing else running" if device == "cuda" else f"{device} (a smoke test)"
        timing = "CUDA events" if device == "cuda" else "time.perf_counter"
        chain = profile_zoo(s["model"], s["batch_size"], device, dtype=dtype, warmup=s["warmup"],
                            repeats=repeats or s["repeats"], threads=None,
                            meta={"network": name, "note": f"{where}; {dtype}, medians of the repeats timed with "
                                  f"{timing}"}, **s["options"])
        write_profile(chain, profile_file(out, name, dtype))
        print(f"profiled {name} ({dtype}): {chain.summary()} ({time.perf_counter() - t0:.0f} s)", flush=True)


def validation_table(out: Path):
    """Every finished run's ``row.json`` under ``out/runs``, in the order of ``VALIDATIONS``."""
    import pandas as pd

    order = {n: i for i, n in enumerate(VALIDATIONS)}
    rows = [json.loads(f.read_text()) for f in (out / "runs").glob("*/row.json")]
    rows.sort(key=lambda r: (order.get(r["run"], len(order)), r["run"]))
    return pd.DataFrame(rows)


def validate(out: Path, name: str, steps: int, device: str = "cuda", dtype: str = "float32") -> dict:
    from workbench.front.running import run_and_compare
    from workbench.runtime.engine import Workload, grad_tolerance
    from workbench.runtime.replay import replay_to
    from workbench.runtime.session import model_config_of

    prof, devices, how = VALIDATIONS[name]
    path = profile_file(out, prof, dtype)
    chain = read_profile(path)
    if chain.meta.get("dtype") != dtype:
        raise ValueError(f"{path} was measured in {chain.meta.get('dtype')}, not {dtype}")
    s = GPU_PROFILES[prof]
    plan, platform = make_plan(chain, devices, how)
    if not plan.feasible:
        raise ValueError(f"{name}: no plan: {plan.notes}")
    cfg = model_config_of(chain, plan)
    wl = Workload.zoo(s["model"], s["batch_size"], dtype=dtype, **cfg)
    run_dir = out / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "plan.json", plan.to_json() + "\n")
    n = max(steps, 4 * max(st.in_flight for st in plan.stages))
    t0 = time.perf_counter()
    _, rep = replay_to(run_dir, plan, chain, wl, n, weights=platform.setup.weights, device=device, platform=platform)
    row = {"run": name, "profile": path.stem, "dtype": dtype, "devices": devices, "stages": len(plan.stages),
           "allocation": plan.allocation, "method": plan.method, "status": plan.status, "gap": plan.gap,
           "memory_limit": platform.memory_of(0), "steps": n,
           "predicted_period": plan.period, "predicted_max_load": float(rep["predicted_busy"].max()),
           "replay_max_busy": float(rep["measured_busy"].max()),
           "replay_busy_error_max": float(rep["busy_error"].abs().max()),
           "replay_memory_error_max": float(rep["memory_error"].abs().max()),
           "allocator_over_predicted_max": float(rep["allocator_over_predicted"].max()),
           "allocator_peak_max": float(rep["allocator_peak"].max()),
           "replay_seconds": time.perf_counter() - t0}
    print(f"{name}: replay done ({row['replay_seconds']:.0f} s)\n{rep.to_string()}", flush=True)
    if devices > 1:
        t0 = time.perf_counter()
        summ = run_and_compare(plan, chain, platform, s["model"], s["batch_size"], n, model_config=cfg,
                               backend="gloo", out=run_dir / "shared", timeout=600.0, device=device,
                               replan=False, dtype=dtype)  # the processes share one GPU: their times are not the plan's
        row.update(shared_max_grad_error=summ["max_grad_error"], grad_tolerance=grad_tolerance(dtype),
                   shared_memory_error_max=max(abs(e) for e in summ["memory_error"]),
                   shared_allocator_peak_max=max([m for m in summ["max_memory_allocated"] or [] if m is not None],
                                                     default=math.nan),
                   shared_period=summ["measured_period"], shared_seconds=time.perf_counter() - t0)
        print(f"{name}: shared-GPU run done: max grad error {summ['max_grad_error']:.3g}, memory error "
              f"{row['shared_memory_error_max']:.3g} ({row['shared_seconds']:.0f} s)", flush=True)
    write_text_atomic(run_dir / "row.json", json.dumps(row, indent=2) + "\n")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=list(SUFFIX), default="float32",
                    help="precision of everything (bfloat16: pure bf16; profiles get the suffix -bf16)")
    ap.add_argument("--out", default=None, help="output folder (default build/gpu, or build/gpu-bf16 in bfloat16)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps (a smoke test)")
    ap.add_argument("--only-profiles", action="store_true")
    ap.add_argument("--skip-profiles", action="store_true", help="reuse out/profiles")
    ap.add_argument("--profiles", nargs="*", default=None, help=f"networks to profile (default {DEFAULT_PROFILES})")
    ap.add_argument("--runs", nargs="*", default=None, help=f"validation runs (default {DEFAULT_RUNS}; also mlp-P2)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script without a GPU")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to do", file=sys.stderr)
        return 2
    out = Path(args.out or REPO / "build" / f"gpu{SUFFIX[args.dtype]}")
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "env.json", json.dumps(environment(args.dtype), indent=2) + "\n")
    if not args.skip_profiles:
        profile_all(out, args.profiles if args.profiles is not None else DEFAULT_PROFILES,
                    3 if args.quick else None, args.device, args.dtype)
    if args.only_profiles:
        return 0
    import pandas as pd

    rows, failed = [], 0
    for name in args.runs if args.runs is not None else DEFAULT_RUNS:
        try:
            rows.append(validate(out, name, 8 if args.quick else 16, args.device, args.dtype))
        except Exception:  # keep going: one failing run must not lose the others
            failed += 1
            traceback.print_exc()
            write_text_atomic(out / "runs" / f"{name}.error.txt", traceback.format_exc())
            continue
        write_frame_atomic(out / "validation.csv", validation_table(out))  # after every run: nothing finished is lost
    if rows:
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
