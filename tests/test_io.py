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


# ---------------------------------------------------------------------------------------------
# read-only and full disks: the error names the user's path, and comes before the work
# ---------------------------------------------------------------------------------------------
import contextlib  # noqa: E402
import errno  # noqa: E402
import subprocess  # noqa: E402

from workbench.io import check_writable, write_files_atomic  # noqa: E402


@contextlib.contextmanager
def _tmpfs(where, options):
    """A small tmpfs at ``where`` (root and a mount-capable machine only; else the test is skipped)."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def read_only(tmp_path):
    with _tmpfs(tmp_path / "ro", "size=64k,ro") as d:
        yield d


@pytest.fixture
def full(tmp_path):
    with _tmpfs(tmp_path / "full", "size=16k") as d:
        with contextlib.suppress(OSError):
            (d / "filler").write_bytes(b"x" * 64 * 1024)
        yield d


def test_a_read_only_disk_is_named_by_the_users_path(read_only):
    pair = lambda p: write_files_atomic({p: b"a", p.with_suffix(".m"): b"b"})  # noqa: E731
    for write in (lambda p: write_text_atomic(p, "x"), pair, check_writable):
        with pytest.raises(OSError) as e:
            write(read_only / "plan.json")
        assert str(e.value) == f"{read_only / 'plan.json'}: cannot write it (a read-only file system)"
        assert e.value.errno == errno.EROFS and ".tmp" not in str(e.value)


def test_a_full_disk_is_named_by_the_users_path_and_no_file_of_a_pair_is_replaced(full):
    (full / "filler").unlink()
    write_files_atomic({full / "t.csv": b"old ops", full / "t.memory.csv": b"old memory"})
    with contextlib.suppress(OSError):
        (full / "filler").write_bytes(b"x" * 64 * 1024)
    with pytest.raises(OSError, match=r"t\.csv: cannot write it \(no space left on the device\)"):
        check_writable(full / "t.csv")
    with pytest.raises(OSError, match=r"cannot write it \(no space left on the device\)") as e:
        write_files_atomic({full / "t.csv": b"new" * 4096, full / "t.memory.csv": b"new" * 4096})
    assert ".tmp" not in str(e.value)
    assert (full / "t.csv").read_bytes() == b"old ops" and (full / "t.memory.csv").read_bytes() == b"old memory"
    assert not [p for p in full.iterdir() if p.name.endswith(".tmp")]


def test_a_pair_is_all_or_nothing_when_the_second_write_fails(tmp_path, disk_full_at):
    """Without a real full disk: the second file's write fails, the first target keeps its old bytes."""
    a, b = tmp_path / "t.csv", tmp_path / "t.memory.csv"
    write_files_atomic({a: b"old a", b: b"old b"})
    disk_full_at(2)
    with pytest.raises(OSError, match=r"t\.memory\.csv: cannot write it \(no space left on the device\)"):
        write_files_atomic({a: b"new a", b: b"new b"})
    assert a.read_bytes() == b"old a" and b.read_bytes() == b"old b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.memory.csv"]
