"""Profile the GPT configurations behind ``python -m workbench largest`` (data/profiles/gpt-family/).

Usage: ``.venv/bin/python scripts/make_family_profiles.py [--only D ...] [--list]``

One embedding, one block and the LM head (with the loss) of the zoo GPT at several widths
d_model (heads = d_model / 64; batch 8, 256 tokens, GPT-2's vocabulary), profiled on one
CPU thread with the workbench's profiler, one file per width. ``workbench.experiments.largest`` fits
every column of the embedding, the block and the head as a quadratic in d_model on the
widths in ``FIT`` and checks the fit on ``CHECK`` (not used in the fit); the depth family
repeats the measured block of ``CHECK``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workbench.experiments.largest import CHECK, FAMILY_DIR, FIT, family_config  # noqa: E402
from workbench.profiles.csvio import write_profile  # noqa: E402
from workbench.profiles.profiler import profile_zoo  # noqa: E402

NOTE = "CPU timings on a shared 2-core machine, one thread; one block of the GPT family at this width"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", type=int, default=None, help="widths to profile (default: all)")
    ap.add_argument("--list", action="store_true", help="print the settings and exit")
    args = ap.parse_args(argv)
    widths = args.only or list(FIT) + [CHECK]
    for d in widths:
        cfg = family_config(d)
        if args.list:
            print(d, cfg)
            continue
        t0 = time.perf_counter()
        batch = cfg.pop("batch_size")
        chain = profile_zoo("gpt", batch, "cpu", warmup=1, repeats=3, threads=1,
                            meta={"network": f"gpt-d{d}", "note": NOTE}, **cfg)
        out = FAMILY_DIR / f"gpt-d{d}.csv"
        write_profile(chain, out)
        print(f"d_model {d}: {chain.summary()} ({time.perf_counter() - t0:.0f} s) -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
