"""workbench.schedules.order_cache: torch's orders kept on disk, read back as torch gave them; planning a plan of
torch's schedules with them kept imports no torch.distributed.pipelining and says what it does as it goes (issue 39:
about 24 s with no progress line)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.schedules.order_cache import cache_folder, load_answer
from workbench.schedules.torch_orders import torch_order

ask = torch_order.__wrapped__        # past the in-process lru_cache


@pytest.mark.parametrize("name,chunks,m", [("zbv", 2, 8), ("interleaved-1f1b", 3, 6), ("dualpipev", 2, 4)])
def test_a_kept_order_is_torchs(tmp_path, monkeypatch, name, chunks, m):
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", "off")
    fresh = ask(name, 2, chunks, m)
    assert cache_folder() is None
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    assert load_answer((name, 2, chunks, m)) is None
    assert ask(name, 2, chunks, m) == fresh                          # asked of torch, and kept
    assert load_answer((name, 2, chunks, m)) == fresh == ask(name, 2, chunks, m)   # read back
    assert len(list(tmp_path.rglob("*.json"))) == 1


def test_a_refusal_is_kept_and_a_damaged_file_asked_again(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="torch's ScheduleDualPipeV refuses") as first:
        ask("dualpipev", 2, 2, 1)
    with pytest.raises(ValueError) as again:
        ask("dualpipev", 2, 2, 1)
    assert str(again.value) == str(first.value)
    kept = next(tmp_path.rglob("zbv-*.json"), None) or (ask("zbv", 2, 2, 4) and next(tmp_path.rglob("zbv-*.json")))
    kept.write_text('{"order": {"0": ["0Q0"]}}')
    assert load_answer(("zbv", 2, 2, 4)) is None
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", "off")
    assert ask("zbv", 2, 2, 4) == ask("zbv", 2, 2, 4)


def test_planning_with_kept_orders_imports_no_pipelining_and_says_what_it_does(tmp_path):
    env = {"WORKBENCH_CACHE_DIR": str(tmp_path)}
    code = ("import sys; from workbench.front.cli import main; rc = main(['plan', '--profile', 'gpt-small', "
            "'--devices', '4', '--method', 'zbv']); print('pipelining imported:', "
            "'torch.distributed.pipelining' in sys.modules); sys.exit(rc)")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**__import__("os").environ, **env}) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert "pipelining imported: True" in runs[0].stdout and "pipelining imported: False" in runs[1].stdout
    assert "importing torch.distributed.pipelining takes seconds" in runs[0].stderr
    for r in runs:
        lines = [l for l in r.stderr.splitlines() if "zbv: " in l and "micro-batches: period" in l]
        assert [l.split("zbv: ")[1].split(" ")[0] for l in lines] == ["16", "8", "4"], r.stderr
    plans = [r.stdout.split("  solved in")[0] for r in runs]
    assert plans[0] == plans[1] and "4 stages" not in plans[0]       # the same plan (8 stages) both times


def test_a_stored_order_and_refusal_round_trip_and_another_torchs_or_a_damaged_file_is_ignored(tmp_path, monkeypatch):
    from workbench.schedules.ops import Op
    from workbench.schedules.order_cache import ENV, is_kept, store_answer

    monkeypatch.setenv(ENV, str(tmp_path))
    order = {0: (Op(0, "F", 0, 0.0), Op(1, "F", 0, 1.0), Op(1, "B", 0, 2.0)), 1: ()}
    assert not is_kept(("zbv", 2, 2, 1))
    store_answer(("zbv", 2, 2, 1), order)
    store_answer(("zbv", 2, 2, 3), "torch's ScheduleZBVZeroBubble refuses 3 micro-batches")
    assert is_kept(("zbv", 2, 2, 1)) and load_answer(("zbv", 2, 2, 1)) == order
    assert load_answer(("zbv", 2, 2, 3)) == "torch's ScheduleZBVZeroBubble refuses 3 micro-batches"
    path = next(tmp_path.rglob("zbv-*-m1.json"))
    elsewhere = path.parent.parent / "0.0" / path.name                 # what another torch version keeps
    elsewhere.parent.mkdir()
    path.rename(elsewhere)
    assert not is_kept(("zbv", 2, 2, 1)) and load_answer(("zbv", 2, 2, 1)) is None
    path.write_text("{not json")
    assert load_answer(("zbv", 2, 2, 1)) is None


def test_nothing_kept_when_the_variable_is_empty_and_an_unwritable_folder_is_ignored(tmp_path, monkeypatch):
    from workbench.schedules.order_cache import ENV, is_kept, store_answer

    monkeypatch.setenv(ENV, "")
    assert cache_folder() is None
    store_answer(("zbv", 2, 2, 1), {0: ()})
    assert load_answer(("zbv", 2, 2, 1)) is None and not is_kept(("zbv", 2, 2, 1))
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(ENV, str(blocker))          # torch-orders/ cannot be made under a file
    store_answer(("zbv", 2, 2, 1), {0: ()})
    assert load_answer(("zbv", 2, 2, 1)) is None
