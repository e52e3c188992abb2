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


def _run_and_get_killed(code: str, *args: str) -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


KILLED_MID_WRITE = """
import os, signal, sys
from workbench.io import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half of the ne")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_the_old_file_and_an_orphan_the_next_run_removes(tmp_path):
    from workbench.io import is_temporary, remove_orphans

    p = tmp_path / "x.csv"
    write_text_atomic(p, "old")
    _run_and_get_killed(KILLED_MID_WRITE, str(p))
    assert p.read_text() == "old"
    orphans = [q for q in tmp_path.iterdir() if q != p]
    assert len(orphans) == 1 and is_temporary(orphans[0].name) and orphans[0].read_bytes() == b"half of the ne"
    # a live writer's temporary file (this process's) is kept; the dead one's goes
    from workbench.io import atomic_path

    with atomic_path(tmp_path / "sub" / "y.csv") as live:
        live.write_text("in progress")
        assert remove_orphans(tmp_path) == orphans
        assert live.exists()
    assert sorted(q.name for q in tmp_path.rglob("*") if q.is_file()) == ["x.csv", "y.csv"]


def test_an_empty_result_never_replaces_a_file(tmp_path):
    from workbench.io import atomic_path

    p = tmp_path / "f.png"
    write_text_atomic(p, "good")
    with pytest.raises(OSError, match="empty file"):
        with atomic_path(p):
            pass  # the writer wrote nothing
    assert p.read_text() == "good" and [q.name for q in tmp_path.iterdir()] == ["f.png"]


def test_legacy_temporaries_are_removed_only_when_old(tmp_path):
    from workbench.io import LEGACY_AGE, remove_orphans

    old, new, mine = tmp_path / ".x.csv.ab12cd34.tmp", tmp_path / "f.html.tmp", tmp_path / "notes.tmp"
    for q in (old, new, mine):
        q.write_text("x")
    past = os.stat(old).st_mtime - LEGACY_AGE - 10
    os.utime(old, (past, past))
    os.utime(mine, (past, past))
    assert remove_orphans(tmp_path) == [old]
    assert new.exists() and mine.exists()  # too young / not ours
