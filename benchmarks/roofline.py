"""Estimated H100 times against measured ones: the roofline of fake profiles beside data/profiles/h100/.

For each of the ten H100 profiles in ``data/profiles/h100/`` (resnet50, resnet101, vgg16 at batch
32 and 224 px, gpt-small and gpt-medium at batch 8 of 512 tokens; float32 and bfloat16, measured
with CUDA events on an NVIDIA H100 80GB HBM3 by ``scripts/gpu_validation.py``), the same zoo model
in the same configuration, batch and dtype is profiled fake for ``h100-sxm``
(:func:`workbench.profiles.fake.fake_zoo`), and its estimated times are compared with the measured
ones: the total step time (forward + backward of every layer) per network, and per layer the
median and the largest absolute error of forward + backward, for the bare roofline (datasheet
peaks, no launch cost: ``UNCALIBRATED``) and the calibrated one (``H100_CALIBRATION``).
Target (issue 24): total step time within 25 % of the measurement per network, calibrated.

``--fit`` fits the calibration again (six numbers: the fraction of the peak reached by float32
matmuls, bf16 matmuls, TF32 convolutions and bf16 convolutions, the fraction of the memory
bandwidth, a launch cost per kernel) by minimising, over the ten networks, the squared log error
of the total plus the squared log error of every layer's forward and backward weighted by its
share of the network's time; it prints the fitted ``Calibration`` to paste into
``workbench/profiles/roofline.py``. Fitting and checking on the same ten networks measures how
well six numbers describe them, not how well they predict a new network: ``--holdout`` fits ten
times, each time on nine networks, and reports the tenth (leave one out).

    .venv/bin/python benchmarks/roofline.py            # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/roofline.py --fit
    .venv/bin/python benchmarks/roofline.py --holdout
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.accelerators import accelerator  # noqa: E402
from workbench.paths import PROFILES_DIR  # noqa: E402
from workbench.profiles import read_profile  # noqa: E402
from workbench.profiles.fake import fake_zoo  # noqa: E402
from workbench.profiles.roofline import H100_CALIBRATION, UNCALIBRATED, Calibration, estimate  # noqa: E402

GPU = accelerator("h100-sxm")
KEYS = ("matmul/float32", "matmul/bfloat16", "conv/tf32", "conv/bfloat16")


def cases() -> list[dict]:
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
        out.append({"network": path.stem, "dtype": m["dtype"], "works": times.works,
                    "forward": measured.forward, "backward": measured.backward,
                    "seconds": time.perf_counter() - t0})
        print(f"  profiled {path.stem} fake in {out[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    return out


def predicted(case: dict, cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    f = np.array([estimate(w.forward, GPU, cal) for w in case["works"]])
    b = np.array([estimate(w.backward, GPU, cal) for w in case["works"]])
    return f, b


def errors(case: dict, cal: Calibration) -> dict:
    f, b = predicted(case, cal)
    meas = case["forward"] + case["backward"]
    layer = (f + b) / meas - 1
    total = (f.sum() + b.sum()) / meas.sum() - 1
    return {"total": total, "median_layer": float(np.median(np.abs(layer))), "max_layer": float(np.max(np.abs(layer))),
            "predicted_ms": (f.sum() + b.sum()) * 1e3, "measured_ms": meas.sum() * 1e3}


def calibration(x: np.ndarray) -> Calibration:
    return Calibration(dict(zip(KEYS, (float(v) for v in x[:4]))), float(x[4]), float(x[5]),
                       H100_CALIBRATION.source)


def objective(x: np.ndarray, data: list[dict]) -> float:
    cal = calibration(x)
    loss = 0.0
    for case in data:
        f, b = predicted(case, cal)
        mf, mb = case["forward"], case["backward"]
        total = mf.sum() + mb.sum()
        loss += math.log((f.sum() + b.sum()) / total) ** 2
        w = np.concatenate([mf, mb]) / total
        loss += float(np.sum(w * np.log(np.maximum(np.concatenate([f, b]), 1e-12) / np.maximum(np.concatenate([mf, mb]),
                                                                                                 1e-12)) ** 2))
    return loss


def fit(data: list[dict]) -> Calibration:
    from scipy.optimize import minimize

    x0 = np.array([0.7, 0.6, 0.5, 0.5, 0.7, 5e-6])
    bounds = [(0.05, 1.0)] * 5 + [(0.0, 1e-4)]
    res = minimize(objective, x0, args=(data,), method="Powell", bounds=bounds,
                   options={"xtol": 1e-4, "ftol": 1e-8, "maxfev": 20000})
    return calibration(res.x)


def report(data: list[dict], cal: Calibration, title: str) -> None:
    print(f"\n{title}")
    print(f"{'network':<18} {'measured':>10} {'bare':>10} {'err':>8} {'calibrated':>11} {'err':>8} "
          f"{'layer |err| median':>19} {'max':>8}")
    worst = 0.0
    for case in data:
        bare, calib = errors(case, UNCALIBRATED), errors(case, cal)
        worst = max(worst, abs(calib["total"]))
        print(f"{case['network']:<18} {calib['measured_ms']:>8.2f}ms {bare['predicted_ms']:>8.2f}ms "
              f"{bare['total']:>+8.1%} {calib['predicted_ms']:>9.2f}ms {calib['total']:>+8.1%} "
              f"{calib['median_layer']:>19.1%} {calib['max_layer']:>8.1%}")
    print(f"largest total error, calibrated: {worst:.1%} (target: 25 %)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the calibration on the ten networks and print it")
    ap.add_argument("--holdout", action="store_true", help="leave one out: fit on nine networks, report the tenth")
    args = ap.parse_args()
    data = cases()
    if args.holdout:
        print("\nleave one out: each network's total with the calibration fitted on the nine others")
        worst = 0.0
        for i, case in enumerate(data):
            cal = fit(data[:i] + data[i + 1:])
            e = errors(case, cal)
            worst = max(worst, abs(e["total"]))
            print(f"{case['network']:<18} measured {e['measured_ms']:8.2f} ms, predicted {e['predicted_ms']:8.2f} ms "
                  f"({e['total']:+.1%}); per layer |err| median {e['median_layer']:.1%}", flush=True)
        print(f"largest total error, left out: {worst:.1%}")
        return 0
    cal = fit(data) if args.fit else H100_CALIBRATION
    if args.fit:
        print(f"\nfitted: compute={dict(cal.compute)}, memory={cal.memory:.4g}, overhead={cal.overhead:.4g}")
    report(data, cal, f"H100 SXM (h100-sxm): roofline of fake profiles against data/profiles/h100/ "
                      f"({'fitted now' if args.fit else 'H100_CALIBRATION'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
