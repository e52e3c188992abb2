"""scripts/launch_overhead.py on the CPU: one forward of zoo layers, the profiler's way and the runtime's."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import launch_overhead  # noqa: E402


def test_both_ways_for_each_chosen_layer(tmp_path):
    out = tmp_path / "o.csv"
    assert launch_overhead.main(["--model", "tiny-gpt", "--batch-size", "2", "--repeats", "2", "--device", "cpu",
                                 "--layers", "0", "3", "--set", "layers=2", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert list(df["layer"]) == ["embed", "embed", "head", "head"]
    assert df["way"].str.startswith("profiler").sum() == 2 and df["way"].str.startswith("runtime").sum() == 2
    assert (df["forward"] > 0).all() and (df["launch_cpu"] > 0).all()
    assert (df["dtype"] == "float32").all() and (df["device"] == "cpu").all()
