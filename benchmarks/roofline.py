"""The time model's calibration: each case predicted against measured, the fit, and leave-one-out.

The calibration cases, and nothing else (every other published measurement is held out):

* the ten H100 profiles in ``data/profiles/h100/`` (resnet50, resnet101, vgg16 at batch 32 and 224 px,
  gpt-small and gpt-medium at batch 8 of 512 tokens; float32 and bfloat16, measured layer by layer with CUDA
  events on an NVIDIA H100 80GB HBM3 by ``scripts/gpu_validation.py``): the same zoo model, batch and dtype is
  profiled fake for ``h100-sxm`` and its estimated forward + backward of every layer is compared with the
  measurement (target: total step time within 20 % per network);
* torchtitan's Llama-3.1-8B FSDP row on 8 H100s (``benchmarks/published_rows.py``: ``ROWS[0]``, its source
  and settings): tokens/s per GPU of the step the layout evaluator predicts, as ``plan --parallel`` prices it
  (target: within 15 %).

The published figures of :mod:`workbench.profiles.kernel_time` (GEMM latency and ceiling, attention) are
fixed; ``--fit`` fits the :class:`~workbench.profiles.kernel_time.Calibration` (the sustained fraction of the
published tensor-core figures, float32-matmul, convolution and float32-attention efficiencies, the speed of
misaligned 16-bit matmuls, least memory-bound kernel time, launch costs) by minimising, over
the cases, the squared log error of each total plus, for each profile, the squared log error of every
layer's forward and backward weighted by its share of the network's time; it prints the ``Calibration`` to
paste into ``workbench/profiles/kernel_time.py``. ``--holdout`` fits once per case on all the others and
reports the one left out. Every fit starts from :data:`STARTS` (the published figures as they are).

    .venv/bin/python benchmarks/roofline.py            # the cases with H100_CALIBRATION (about a minute)
    .venv/bin/python benchmarks/roofline.py --fit      # longer: the torchtitan case runs the layout evaluator
    .venv/bin/python benchmarks/roofline.py --holdout  # eleven fits
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from large_models import TORCHTITAN, torchtitan_step  # noqa: E402
from published_rows import base_chain  # noqa: E402

from workbench.model.accelerators import accelerator  # noqa: E402
from workbench.paths import PROFILES_DIR  # noqa: E402
from workbench.profiles import read_profile  # noqa: E402
from workbench.profiles.fake import fake_zoo  # noqa: E402
from workbench.profiles.kernel_time import (  # noqa: E402
    H100_CALIBRATION,
    T_GEMM,
    UNCALIBRATED,
    Calibration,
    phases_seconds,
)
from workbench.profiles.roofline import estimate  # noqa: E402

GPU = accelerator("h100-sxm")
#: the fitted numbers: name, lower and upper bound, scale (so that the optimiser sees numbers near 1); a memory-bound
#: kernel's fixed latency is bounded by a GEMM kernel's (T_GEMM, measured)
PARAMETERS = (("sustained", 0.3, 1.0, 1.0), ("matmul/float32", 0.05, 1.0, 1.0), ("conv/tf32", 0.05, 1.0, 1.0),
              ("conv/bfloat16", 0.05, 1.0, 1.0), ("attention/float32", 0.02, 1.0, 1.0), ("misaligned", 0.05, 1.0, 1.0),
              ("kernel_floor", 0.0, T_GEMM, 1e-6), ("launch_forward", 0.0, 200e-6, 1e-5),
              ("launch_backward", 0.0, 200e-6, 1e-5), ("host", 0.0, 1.0, 1.0), ("overhead", 0.0, 500e-6, 1e-5))


def profile_cases() -> list[dict]:
    """Every H100 profile with the fake profile's work of the same model, layer by layer."""
    out = []
    for path in sorted((PROFILES_DIR / "h100").glob("*.csv")):
        measured = read_profile(path)
        m = measured.meta
        t0 = time.perf_counter()
        chain, times = fake_zoo(m["model"], int(m["batch_size"]), GPU, dtype=m["dtype"], return_work=True,
                                **json.loads(m["model_config"]))
        names = [l.name for l in chain.layers]
        if names != [l.name for l in measured.layers]:
            raise SystemExit(f"{path.name}: the fake profile's layers {names[:3]}... are not the measured ones")
        case = {"case": path.stem, "kind": "profile", "works": times.works, "packed": packed(times.works),
                "forward": measured.forward, "backward": measured.backward}
        one_by_one = [estimate(w.forward, GPU, H100_CALIBRATION) for w in times.works]
        if not np.allclose(predicted(case, H100_CALIBRATION)[0], one_by_one, rtol=1e-9):
            raise SystemExit(f"{path.stem}: the packed phases do not price as the phases one by one")
        out.append(case)
        print(f"  profiled {path.stem} fake in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def cases() -> list[dict]:
    """The calibration cases (module docstring)."""
    t0 = time.perf_counter()
    chain = base_chain(TORCHTITAN)
    print(f"  profiled Llama-3.1-8B ({TORCHTITAN.micro_batch} x {TORCHTITAN.sequence} tokens) fake in "
          f"{time.perf_counter() - t0:.1f} s (or read it from build/profiles)", file=sys.stderr, flush=True)
    tt = {"case": "torchtitan 8B FSDP x8", "kind": "torchtitan", "chain": chain, "measured": TORCHTITAN.tokens_per_gpu}
    return profile_cases() + [tt]


def packed(works: list) -> dict:
    """Every layer's forward, then every layer's backward, one after the other (:func:`phases_seconds`)."""
    phases = [w.forward for w in works] + [w.backward for w in works]
    nonempty = np.array([len(p) > 0 for p in phases])
    kept = [p for p in phases if len(p)]
    lengths = np.array([len(p) for p in kept])
    back = np.concatenate([np.full(len(p), i >= len(works)) for i, p in enumerate(phases) if len(p)])
    return {"n": len(works), "nonempty": nonempty, "starts": np.concatenate([[0], np.cumsum(lengths)[:-1]]),
            "backward": back, **{f: np.concatenate([getattr(p, f) for p in kept])
                                 for f in ("kind", "precision", "flops", "bytes", "aligned")}}


def predicted(case: dict, cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """Every layer's estimated forward and backward seconds."""
    p = case["packed"]
    t = np.zeros(2 * p["n"])
    t[p["nonempty"]] = phases_seconds(p["kind"], p["precision"], p["flops"], p["bytes"], p["aligned"],
                                      p["backward"], p["starts"], GPU, cal)
    return t[:p["n"]], t[p["n"]:]


def errors(case: dict, cal: Calibration) -> dict:
    """Predicted against measured: the total's relative error (profiles: seconds; torchtitan: tokens/s per
    GPU), and for profiles the median and largest per-layer error of forward + backward."""
    if case["kind"] == "torchtitan":
        _, tps = torchtitan_step(cal, case["chain"])
        return {"total": tps / case["measured"] - 1, "predicted": tps, "measured": case["measured"],
                "unit": "tokens/s", "median_layer": math.nan, "max_layer": math.nan}
    f, b = predicted(case, cal)
    meas = case["forward"] + case["backward"]
    layer = (f + b) / meas - 1
    return {"total": (f.sum() + b.sum()) / meas.sum() - 1, "predicted": (f.sum() + b.sum()) * 1e3,
            "measured": meas.sum() * 1e3, "unit": "ms", "median_layer": float(np.median(np.abs(layer))),
            "max_layer": float(np.max(np.abs(layer)))}


def calibration(x: np.ndarray) -> Calibration:
    v = dict(zip((p[0] for p in PARAMETERS), (float(a) * p[3] for a, p in zip(x, PARAMETERS))))
    compute = {k: v[k] for k in ("matmul/float32", "conv/tf32", "conv/bfloat16", "attention/float32")}
    return Calibration(sustained=v["sustained"], compute=compute, misaligned=v["misaligned"],
                       kernel_floor=v["kernel_floor"], launch=(v["launch_forward"], v["launch_backward"]),
                       host=v["host"], overhead=v["overhead"], source=H100_CALIBRATION.source)


def vector(cal: Calibration) -> np.ndarray:
    v = {"sustained": cal.sustained, **{k: cal.efficiency(*k.split("/")) for k in
                                        ("matmul/float32", "conv/tf32", "conv/bfloat16", "attention/float32")},
         "misaligned": cal.misaligned, "kernel_floor": cal.kernel_floor,
         "launch_forward": cal.launch[0], "launch_backward": cal.launch[1], "host": cal.host,
         "overhead": cal.overhead}
    return np.array([v[p[0]] / p[3] for p in PARAMETERS])


def objective(x: np.ndarray, data: list[dict]) -> float:
    cal = calibration(x)
    loss = 0.0
    for case in data:
        if case["kind"] == "torchtitan":
            loss += math.log(1 + errors(case, cal)["total"]) ** 2
            continue
        f, b = predicted(case, cal)
        mf, mb = case["forward"], case["backward"]
        total = mf.sum() + mb.sum()
        loss += math.log((f.sum() + b.sum()) / total) ** 2
        pred, meas = np.concatenate([f, b]), np.concatenate([mf, mb])
        loss += float(np.sum(meas / total * np.log(np.maximum(pred, 1e-12) / np.maximum(meas, 1e-12)) ** 2))
    return loss


#: where the fits start: the published figures as they are (sustained 1), nothing fitted yet, with a cheap CPU
#: or a costly one (Powell's method finds local minima: each start is polished twice, the best kept)
NEUTRAL = Calibration(sustained=1.0, compute={"matmul/float32": 0.5, "conv/tf32": 0.5, "conv/bfloat16": 0.5,
                                              "attention/float32": 0.5},
                      misaligned=0.5, kernel_floor=2e-6, launch=(20e-6, 20e-6), host=0.5, overhead=100e-6)
STARTS = (NEUTRAL, dataclasses.replace(NEUTRAL, launch=(40e-6, 40e-6), host=0.0, overhead=300e-6))


def fit(data: list[dict], starts: tuple[Calibration, ...] = STARTS) -> Calibration:
    from scipy.optimize import minimize

    bounds = [(lo / s, hi / s) for _, lo, hi, s in PARAMETERS]
    best = None
    for start in starts:
        x = np.clip(vector(start), [b[0] for b in bounds], [b[1] for b in bounds])
        for _ in range(2):
            res = minimize(objective, x, args=(data,), method="Powell", bounds=bounds,
                           options={"xtol": 1e-4, "ftol": 1e-9, "maxfev": 30000})
            x = res.x
        if best is None or res.fun < best.fun:
            best = res
    return calibration(best.x)


def report(data: list[dict], cal: Calibration, title: str) -> None:
    print(f"\n{title}")
    print(f"{'case':<24} {'measured':>14} {'bare roofline':>14} {'err':>8} {'calibrated':>14} {'err':>8} "
          f"{'layer |err| median':>19} {'max':>8}")
    for case in data:
        bare, calib = errors(case, UNCALIBRATED), errors(case, cal)
        u = calib["unit"]
        print(f"{case['case']:<24} {calib['measured']:>9.1f} {u:<4} {bare['predicted']:>9.1f} {u:<4} "
              f"{bare['total']:>+8.1%} {calib['predicted']:>9.1f} {u:<4} {calib['total']:>+8.1%} "
              f"{calib['median_layer']:>19.1%} {calib['max_layer']:>8.1%}")
    profiles = [abs(errors(c, cal)["total"]) for c in data if c["kind"] == "profile"]
    tt = [abs(errors(c, cal)["total"]) for c in data if c["kind"] == "torchtitan"]
    print(f"largest total error, H100 profiles: {max(profiles):.1%} (target 20 %); torchtitan: {max(tt):.1%} "
          f"(target 15 %)")


def print_calibration(cal: Calibration) -> None:
    print(f"\nfitted: Calibration(sustained={cal.sustained:.3f}, compute={{"
          + ", ".join(f'"{k}": {v:.3f}' for k, v in cal.compute.items())
          + f"}}, misaligned={cal.misaligned:.3f}, kernel_floor={cal.kernel_floor:.3g}, "
          f"launch=({cal.launch[0]:.3g}, {cal.launch[1]:.3g}), host={cal.host:.3f}, overhead={cal.overhead:.3g})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the calibration on every case and print it")
    ap.add_argument("--holdout", action="store_true", help="leave one out: fit on all cases but one, report it")
    args = ap.parse_args()
    data = cases()
    if args.holdout:
        print("\nleave one out: each case with the calibration fitted on all the others")
        worst = {"profile": 0.0, "torchtitan": 0.0}
        for i, case in enumerate(data):
            cal = fit(data[:i] + data[i + 1:])
            e = errors(case, cal)
            worst[case["kind"]] = max(worst[case["kind"]], abs(e["total"]))
            print(f"{case['case']:<24} measured {e['measured']:9.1f} {e['unit']}, predicted {e['predicted']:9.1f} "
                  f"{e['unit']} ({e['total']:+.1%}); sustained {cal.sustained:.3f}", flush=True)
        print(f"largest error left out: H100 profiles {worst['profile']:.1%}, torchtitan {worst['torchtitan']:.1%}")
        return 0
    cal = fit(data) if args.fit else H100_CALIBRATION
    if args.fit:
        print_calibration(cal)
    report(data, cal, f"calibration cases on the H100 ({'fitted now' if args.fit else 'H100_CALIBRATION'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
