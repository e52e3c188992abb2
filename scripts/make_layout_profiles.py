"""Make the per-rank profiles notebook 09 plans Llama-3-70B's layouts with in quick mode (data/profiles/layouts/).

Usage: ``.venv/bin/python scripts/make_layout_profiles.py [--out-dir DIR]``

Llama-3-70B's widths and vocabulary with 2 of its 80 blocks (``examples/llama3.py:llama3_70b_2_layers``), profiled
under fake tensors by :func:`workbench.parallel.tensor.profile.tensor_parallel_profile` (rank 0 of a fake
tensor-parallel group) for every GPU of :data:`GPUS`, tp 1, 2, 4, 8 and micro-batch sizes 1, 2, 4, 8 of 2048-token
sequences: ``llama3-70b-2-blocks-<gpu>-tp<tp>-mbs<mbs>.csv``, known as ``layouts/<that stem>``; for tp > 1 also
with sequence parallelism (``-tp<tp>-sp-mbs<mbs>``), the vocabulary-parallel loss (``-tp<tp>-lp-mbs<mbs>``) and
both (``-tp<tp>-sp-lp-mbs<mbs>``), which ``plan --parallel auto`` searches too; and, for
torchtitan's published run, tp 1, one 8192-token sequence on an A100-80GB
(``llama3-70b-2-blocks-8k-a100-80gb-tp1-mbs1.csv``). The notebook repeats the second block to 80
(:func:`workbench.parallel.profiles.repeat_blocks`); full mode profiles the 80-block model instead. About a second
a profile on a 2-core machine.
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

GPUS = ("a100-40gb", "h100-sxm", "h200")
TPS = (1, 2, 4, 8)
MICRO_BATCH_SIZES = (1, 2, 4, 8)
SPEC = "examples/llama3.py:llama3_70b_2_layers"


def stem(gpu: str, tp: int, mbs: int, long: bool = False, sp: bool = False, lp: bool = False) -> str:
    """The file stem of one profile (module docstring).

    >>> stem("h100-sxm", 4, 2, sp=True, lp=True)
    'llama3-70b-2-blocks-h100-sxm-tp4-sp-lp-mbs2'
    """
    switches = "-sp" * sp + "-lp" * lp
    return f"llama3-70b-2-blocks{'-8k' if long else ''}-{gpu}-tp{tp}{switches}-mbs{mbs}"


#: (sequence parallelism, vocabulary-parallel loss) profiled for tp > 1
SWITCHES = ((False, False), (True, False), (False, True), (True, True))


def make(out_dir: Path) -> list[Path]:
    from workbench.parallel.tensor.profile import tensor_parallel_profile

    jobs = [(gpu, tp, mbs, False, sp, lp) for gpu in GPUS for tp in TPS for mbs in MICRO_BATCH_SIZES
            for sp, lp in (SWITCHES if tp > 1 else SWITCHES[:1])]
    jobs.append(("a100-80gb", 1, 1, True, False, False))
    out = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for gpu, tp, mbs, long, sp, lp in jobs:
        t0 = time.perf_counter()
        spec = str(REPO / (SPEC + ("_8k" if long else "")))
        chain = tensor_parallel_profile(spec, gpu, tp, micro_batch_size=mbs, sequence_parallel=sp, loss_parallel=lp,
                                        cache=False)
        meta = {k: v for k, v in chain.meta.items() if k not in ("source_file", "date", "profile_seconds")}
        meta["module"] = SPEC + ("_8k" if long else "")
        target = out_dir / f"{stem(gpu, tp, mbs, long, sp, lp)}.csv"
        write_profile(chain.__class__(chain.layers, chain.input_bytes, chain.cut_bytes, meta), target)
        out.append(target)
        print(f"{target.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(PROFILES_DIR / "layouts"), help="default data/profiles/layouts")
    make(Path(ap.parse_args(argv).out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
