"""Measure ``backward_fresh_peak_bytes`` for profiles made before the profiler measured it, keeping every time.

Usage: ``.venv/bin/python scripts/add_fresh_peaks.py [FILE.csv ...]`` (default: the bundled CPU profiles,
``data/profiles/gpt-family/`` and the fake Llama-3 profiles in ``data/profiles/fake/``). A profile of a
user's module (``module: FILE.py:FUNC``, beside the profile) is rebuilt from that file under the environment the
script runs in: ``WORKBENCH_QUICK=1 .venv/bin/python scripts/add_fresh_peaks.py notebooks/my_gpt2-quick.csv``
for notebook 08's quick profile.

The memory columns do not depend on the machine's speed (allocator-level counts on the same model, batch and
dtype), so a profile gains the backward that writes fresh gradients (docs/model.md, "Memory", the training
loop) without re-timing it: the model is rebuilt from the profile's metadata (a zoo ``model`` and its
``model_config``, or a ``module`` of ``examples/``), every layer's memory columns are measured again with no
timing (:func:`workbench.profiles.profiler.profile_model` with ``times`` returning zeros), the columns the
profile already has must come out the same (else the script stops, naming the column), and the new one is
added. A profile made before a tied parameter was counted in its owner's columns only (docs/model.md, "Tied
parameters") gets its sharers' ``grad_bytes`` and ``max_param_bytes`` recounted where they differ from the
measure by exactly the tie's bytes. A fake Llama profile is measured on the same model cut to two blocks
(every block is the same layer: the columns do not depend on the depth) and the blocks' column repeated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from workbench.model.chain import Chain  # noqa: E402
from workbench.paths import PROFILES_DIR  # noqa: E402
from workbench.profiles import load_profile, write_profile  # noqa: E402
from workbench.profiles.profiler import profile_model  # noqa: E402

COLUMN = "backward_fresh_peak_bytes"
#: the columns a re-measure must reproduce
CHECKED = ("grad_bytes", "max_param_bytes", "saved_input_bytes", "saved_output_bytes", "forward_peak_bytes",
           "backward_peak_bytes")


def _no_times(*args, **kwargs) -> tuple[list[float], list[float]]:
    return [0.0], [0.0]


def _zoo_columns(chain: Chain) -> Chain:
    from workbench.profiles import zoo

    name = chain.meta["model"]
    cfg = json.loads(chain.meta["model_config"])
    cfg = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
           for k, v in cfg.items()}
    dtype = chain.meta.get("dtype", "float32")
    batch = int(chain.meta["batch_size"])
    model = zoo.build_model(name, seed=0, dtype=dtype, **cfg)
    x, y = zoo.sample_batch(name, batch, seed=0, dtype=dtype, **cfg)
    return profile_model(model, x, repeats=1, warmup=0, loss=zoo.loss_fn(name), target=y, times=_no_times)


def _module_columns(chain: Chain, path: Path) -> Chain:
    """A user's module (its file beside the profile ``path``), rebuilt and measured with no timing."""
    from workbench.profiles.workload import Workload

    wl = Workload.module(str(path.parent / chain.meta["module"]))
    inputs, target = wl.batch(0)
    return profile_model(wl.build(), inputs, repeats=1, warmup=0, loss=wl.loss, target=target, times=_no_times)


def _fake_columns(chain: Chain) -> Chain:
    """The module's model with two blocks, under fake tensors (the blocks' columns do not depend on the depth)."""
    from workbench.profiles.fake import fake_profile

    path, func = chain.meta["module"].split(":")
    sys.path.insert(0, str(REPO / Path(path).parent))
    module = __import__(Path(path).stem)
    size = {"llama3_8b": "8b", "llama3_70b": "70b"}[func]
    return fake_profile(lambda: module.llama3(size, layers=2), chain.meta.get("gpu", "h100-sxm"))


def with_fresh_peaks(chain: Chain, path: Path) -> Chain:
    """``chain`` (read from ``path``) with the new column measured (see the module docstring)."""
    fake = "fake tensors" in str(chain.meta.get("device", ""))
    user = not fake and "model" not in chain.meta and chain.meta.get("module")
    again = _fake_columns(chain) if fake else _module_columns(chain, path) if user else _zoo_columns(chain)
    rows = list(again.layers)
    if fake:           # embedding, two blocks, the rest: the profile's later blocks take the second block's columns
        n, m = len(chain), len(again)
        rows = [rows[0]] + [rows[min(i, 2)] for i in range(1, n - (m - 3))] + rows[3:]
    if len(rows) != len(chain):
        raise SystemExit(f"{chain.name}: {len(rows)} layers measured, the profile has {len(chain)}")
    from workbench.model.ties import chain_ties

    shared = {}          # a sharer's tied bytes, once counted in its own columns too
    for t in chain_ties(chain):
        for s in t.sharers:
            shared[s] = shared.get(s, 0.0) + t.nbytes
    layers = []
    for i, (old, new) in enumerate(zip(chain.layers, rows)):
        fixed = {COLUMN: getattr(new, COLUMN)}
        for col in CHECKED:
            a, b = getattr(old, col), getattr(new, col)
            if a is not None and b is not None and abs(a - b) > 1e-6 * max(abs(a), 1.0):
                if col in ("grad_bytes", "max_param_bytes") and abs(a - b - shared.get(i, 0.0)) <= 1e-6 * max(a, 1.0):
                    fixed[col] = b           # the tie counted once, in its owner
                    continue
                raise SystemExit(f"{chain.name}: layer {old.name}: {col} {a} in the profile, {b} measured now")
        layers.append(dataclasses.replace(old, **fixed))
    return dataclasses.replace(chain, layers=tuple(layers))


def default_files() -> list[Path]:
    return (sorted(PROFILES_DIR.glob("*.csv")) + sorted((PROFILES_DIR / "gpt-family").glob("*.csv"))
            + sorted((PROFILES_DIR / "fake").glob("*.csv")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="profile CSV files (default: the bundled ones)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    measured: dict[tuple, Chain] = {}
    for path in [Path(f) for f in args.files] or default_files():
        chain = load_profile(path)
        if all(getattr(l, COLUMN) is not None for l in chain.layers):
            print(f"{path}: has {COLUMN} already")
            continue
        key = (chain.meta.get("module"), chain.meta.get("model"), chain.meta.get("model_config"),
               chain.meta.get("batch_size"), chain.meta.get("dtype"))
        if key not in measured or "fake tensors" not in str(chain.meta.get("device", "")):
            measured[key] = with_fresh_peaks(chain, path)
        done = dataclasses.replace(chain, layers=tuple(dataclasses.replace(
            l, **{c: getattr(m, c) for c in (COLUMN, "grad_bytes", "max_param_bytes")})
            for l, m in zip(chain.layers, measured[key].layers)))
        write_profile(done, path)
        print(f"{path}: {COLUMN} added", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
