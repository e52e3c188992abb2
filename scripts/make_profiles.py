"""Regenerate the bundled CPU profiles in data/profiles/ with the workbench profiler.

Usage: ``.venv/bin/python scripts/make_profiles.py [--only NAME ...] [--out-dir DIR] [--list]``

Each entry of ``PROFILES`` gives the exact settings (zoo model, its options,
batch size, warm-up and repeats). Profiling runs on one CPU thread; each
network takes at most a couple of minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workbench.profiles.csvio import write_profile  # noqa: E402
from workbench.profiles.profiler import profile_zoo  # noqa: E402

NOTE = ("CPU timings on a shared 2-core machine, other jobs running at the same time; "
        "times are medians of the repeats, spread_* give (max-min)/median over layers")

# file stem -> settings (model, batch_size, warmup, repeats, model options)
PROFILES: dict[str, dict] = {
    "resnet50": dict(model="resnet50", batch_size=8, warmup=2, repeats=5, options=dict(image_size=224)),
    "resnet101": dict(model="resnet101", batch_size=8, warmup=2, repeats=5, options=dict(image_size=224)),
    "vgg16": dict(model="vgg16", batch_size=8, warmup=2, repeats=5, options=dict(image_size=112)),
    "gpt-small": dict(model="gpt", batch_size=4, warmup=2, repeats=5,
                      options=dict(layers=12, d_model=768, heads=12, seq_len=128, vocab=50257)),
    "gpt-medium": dict(model="gpt", batch_size=2, warmup=2, repeats=5,
                       options=dict(layers=24, d_model=1024, heads=16, seq_len=128, vocab=50257)),
}


def entries(ap: argparse.ArgumentParser, only: list[str] | None) -> list[str]:
    """The entries of ``PROFILES`` asked for (all by default); an unknown one is an argument error."""
    names = only or list(PROFILES)
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        ap.error(f"unknown entries {unknown}; known: {list(PROFILES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="profile only these entries")
    ap.add_argument("--out-dir", default=str(REPO / "data" / "profiles"))
    ap.add_argument("--list", action="store_true", help="print the settings and exit")
    args = ap.parse_args(argv)
    for name in entries(ap, args.only):
        s = PROFILES[name]
        if args.list:
            print(name, s)
            continue
        t0 = time.perf_counter()
        chain = profile_zoo(s["model"], s["batch_size"], "cpu", warmup=s["warmup"], repeats=s["repeats"],
                            threads=1, progress=True, meta={"network": name, "note": NOTE}, **s["options"])
        out = Path(args.out_dir) / f"{name}.csv"
        write_profile(chain, out)
        m = chain.meta
        print(f"{name}: {chain.summary()}")
        print(f"  spread forward {float(m['spread_forward']):.1%} (max {float(m['spread_forward_max']):.1%}), "
              f"backward {float(m['spread_backward']):.1%} (max {float(m['spread_backward_max']):.1%}); "
              f"{time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
