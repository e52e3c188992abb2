"""Measure the backward split of the bundled CPU profiles' models and add it to the profiles, times unchanged.

Usage: ``.venv/bin/python scripts/measure_backward_split.py [--only NAME ...] [--out-dir DIR] [--repeats N]``

The bundled profiles (``data/profiles/*.csv``, made by ``scripts/make_profiles.py``)
predate the backward split (docs/model.md, "Backward split"): plans of the
zero-bubble schedules estimate it and say so. This script builds each
profile's model with the same settings (``make_profiles.PROFILES``), measures
every layer's split with torch's ``stage_backward_input`` and
``stage_backward_weight`` (:func:`workbench.profiles.split.model_split`: the
weight-gradient share of the backward, and the bytes held between the two),
and writes the profile back with the two columns added: each layer's
``backward_weight_ms`` is its measured share of the profile's own
``backward_ms``, which is not re-timed, so the profile's times (and every plan
made from them) stay as they are. Run it on a quiet machine: the shares are
ratios of times. A few minutes per network on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from make_profiles import PROFILES, entries  # noqa: E402

from workbench.profiles import zoo  # noqa: E402
from workbench.profiles.csvio import read_profile, write_profile  # noqa: E402
from workbench.profiles.split import model_split, with_split  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="these entries only")
    ap.add_argument("--out-dir", default=str(REPO / "data" / "profiles"),
                    help="where the profiles are read and written")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per layer (default 5)")
    args = ap.parse_args(argv)
    for name in entries(ap, args.only):
        s, t0 = PROFILES[name], time.perf_counter()
        path = Path(args.out_dir) / f"{name}.csv"
        chain = read_profile(path)
        model = zoo.build_model(s["model"], **s["options"])
        x, y = zoo.sample_batch(s["model"], s["batch_size"], **s["options"])
        cols = model_split(model, x, zoo.loss_fn(s["model"]), y, repeats=args.repeats)
        how = (f"measured by scripts/measure_backward_split.py with torch's stage_backward_input and "
               f"stage_backward_weight ({args.repeats} repeats): the W share of backward_ms, which is not re-timed")
        done = with_split(chain, cols, how)
        write_profile(done, path)
        w = sum(l.backward_weight for l in done.layers)
        pending = sum(l.weight_pending_bytes for l in done.layers)
        print(f"{name}: {len(cols)} layers, W {w * 1e3:.1f} ms of {chain.backward.sum() * 1e3:.1f} ms backward, "
              f"pending {pending / 2**20:.1f} MiB; {time.perf_counter() - t0:.0f} s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
