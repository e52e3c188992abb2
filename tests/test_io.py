import os
import stat

import pandas as pd
import pytest

from workbench.io import write_frame_atomic, write_text_atomic


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "x.txt"
    write_text_atomic(p, "one")
    write_text_atomic(p, "two")
    assert p.read_text() == "two"
    assert [q.name for q in p.parent.iterdir()] == ["x.txt"]


def test_atomic_write_has_ordinary_permissions(tmp_path):
    p = tmp_path / "x.txt"
    write_text_atomic(p, "x")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert stat.S_IMODE(os.stat(p).st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


def test_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "x.csv"
    write_text_atomic(p, "old")

    class Boom:
        def to_csv(self, index=False):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_frame_atomic(p, Boom())  # type: ignore[arg-type]
    assert p.read_text() == "old"


def test_frames_round_trip_csv_and_parquet(tmp_path):
    df = pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})
    for name in ("f.csv", "f.parquet"):
        write_frame_atomic(tmp_path / name, df)
    assert pd.read_csv(tmp_path / "f.csv").equals(df)
    assert pd.read_parquet(tmp_path / "f.parquet").equals(df)
