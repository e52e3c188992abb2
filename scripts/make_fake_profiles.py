"""Regenerate the fake profiles in data/profiles/fake/ (notebook 09 loads them instead of profiling a 70B model).

Usage: ``.venv/bin/python scripts/make_fake_profiles.py [--only NAME ...] [--out-dir DIR]``

Each entry of ``MODELS`` is an ``examples/`` model profiled once under fake tensors
(:func:`workbench.profiles.fake.fake_profile`), then written once per GPU of its entry, the times
estimated for that GPU from the same work (:func:`workbench.profiles.fake.for_gpu`; the memory
columns do not depend on the GPU): ``<name>-<gpu>.csv``, known as ``fake/<name>-<gpu>``. Llama-3-70B
takes about 5 minutes on a shared 2-core machine and 0.5 GB of memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workbench.paths import PROFILES_DIR  # noqa: E402
from workbench.profiles.csvio import write_profile  # noqa: E402
from workbench.profiles.fake import fake_profile, for_gpu  # noqa: E402
from workbench.profiles.usermodel import load_user_model, spec_relative_to  # noqa: E402

#: file stem -> (FILE.py:FUNC under the repository, the GPUs it is written for)
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama3-8b": ("examples/llama3.py:llama3_8b", ("a100-40gb", "h100-sxm", "h200")),
    "llama3-70b": ("examples/llama3.py:llama3_70b", ("a100-40gb", "h100-sxm", "h200")),
}


def make(name: str, out_dir: Path) -> list[Path]:
    spec, gpus = MODELS[name]
    path = str(REPO / spec.split(":")[0])
    func = spec.split(":")[1]
    t0 = time.perf_counter()
    chain, times = fake_profile(lambda: _built(f"{path}:{func}"), gpus[0], return_work=True, progress=True,
                                meta={"network": name, "module": spec_relative_to(f"{path}:{func}", out_dir)})
    print(f"{name}: profiled fake in {time.perf_counter() - t0:.0f} s", flush=True)
    out = []
    for gpu in gpus:
        target = out_dir / f"{name}-{gpu}.csv"
        write_profile(chain if gpu == gpus[0] else for_gpu(chain, times, gpu), target)
        out.append(target)
        print(f"  wrote {target}", flush=True)
    return out


def _built(spec: str):
    um = load_user_model(spec)
    return um.model, um.inputs, um.targets, um.loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="only these entries")
    ap.add_argument("--out-dir", default=str(PROFILES_DIR / "fake"), help="where to write (default data/profiles/fake)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(MODELS):
        if name not in MODELS:
            raise SystemExit(f"unknown entry {name!r}; known: {', '.join(MODELS)}")
        make(name, out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
