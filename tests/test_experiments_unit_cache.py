"""Tests for workbench.experiments.cache: a unit's CSV and sidecar, reused only when key and checksum match.

(tests/test_experiments_cache.py tests the units' keys end to end through the experiments.)"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

import workbench.experiments.cache as cache
from workbench.experiments.cache import load_unit, read_unit, run_unit, store_unit, unit_is_current
from workbench.experiments.units import Unit

TEXT = "level,period\n0,1.5\n1,2.25\n"


def unit(**settings) -> Unit:
    return Unit("net-dp", "sweep", {"kind": "sweep", "devices": 2, **settings})


def sidecar(out, u: Unit) -> dict:
    return json.loads(u.path(out).with_suffix(".json").read_text())


def test_store_then_read_gives_the_frame_and_a_sidecar_that_says_what_it_is(tmp_path):
    u = unit()
    df = store_unit(u, tmp_path, TEXT, seconds=1.23456, host="worker-1")
    assert df.to_dict("list") == {"level": [0, 1], "period": [1.5, 2.25]}
    again, why = read_unit(u, tmp_path)
    assert why == "" and again.equals(df)
    meta = sidecar(tmp_path, u)
    assert meta["sha256"] == hashlib.sha256(TEXT.encode()).hexdigest()
    assert (meta["rows"], meta["unit"], meta["settings"]) == (2, "net-dp", u.settings)
    assert meta["compute"] == {"seconds": 1.235, "host": "worker-1"}
    assert u.path(tmp_path).read_text() == TEXT
    assert unit_is_current(u, tmp_path) and load_unit(u, tmp_path).equals(df)


def test_not_computed_yet(tmp_path):
    assert read_unit(unit(), tmp_path) == (None, "not computed yet")
    store_unit(unit(), tmp_path, TEXT)
    unit().path(tmp_path).unlink()                     # the sidecar alone
    assert read_unit(unit(), tmp_path) == (None, "not computed yet")


def test_another_key_names_the_settings_that_differ(tmp_path):
    store_unit(unit(devices=2, bandwidth="12GB/s"), tmp_path, TEXT)
    df, why = read_unit(unit(devices=4, bandwidth="12GB/s", seed=0), tmp_path)
    assert df is None and why == "made with another key (differs in: devices, seed)"
    assert not unit_is_current(unit(devices=4), tmp_path)


@pytest.mark.parametrize("change, reason", [
    (lambda csv, meta: csv.write_text(TEXT + "2,3.0\n"), "CSV does not match its checksum"),
    (lambda csv, meta: csv.write_text(TEXT[:-6]), "CSV does not match its checksum"),
    (lambda csv, meta: meta.write_text(json.dumps({**json.loads(meta.read_text()), "rows": 3})),
     "row count differs from the sidecar"),
    (lambda csv, meta: meta.write_text("{not json"), "unreadable (JSONDecodeError)"),
    (lambda csv, meta: meta.write_text("[1, 2]"), "unreadable sidecar"),
])
def test_a_changed_file_is_not_reused(tmp_path, change, reason):
    u = unit()
    store_unit(u, tmp_path, TEXT)
    csv = u.path(tmp_path)
    change(csv, csv.with_suffix(".json"))
    df, why = read_unit(u, tmp_path)
    assert df is None and why.startswith(reason)


def test_run_unit_computes_once_and_again_when_forced_or_rekeyed(tmp_path, monkeypatch):
    calls = []

    def compute(u):
        calls.append(u.settings["devices"])
        return pd.DataFrame({"devices": [u.settings["devices"]], "n": [len(calls)]})

    monkeypatch.setattr(cache, "compute_unit", compute)
    df, computed = run_unit(unit(), tmp_path)
    assert computed and df.to_dict("list") == {"devices": [2], "n": [1]}
    df, computed = run_unit(unit(), tmp_path)
    assert not computed and df.n.tolist() == [1] and calls == [2]
    df, computed = run_unit(unit(), tmp_path, force=True)
    assert computed and df.n.tolist() == [2]
    df, computed = run_unit(unit(devices=8), tmp_path)         # same file, another key: recomputed
    assert computed and df.to_dict("list") == {"devices": [8], "n": [3]}
    assert calls == [2, 2, 8]


def test_a_store_cut_short_leaves_no_unit_that_looks_finished(tmp_path, disk_full_at):
    old, new = unit(devices=2), unit(devices=4)
    store_unit(old, tmp_path, TEXT)
    disk_full_at(2)                       # fsyncs: the new CSV, then its sidecar, which fails
    with pytest.raises(OSError):
        store_unit(new, tmp_path, "level,period\n0,9.0\n")
    assert read_unit(new, tmp_path)[0] is None
    df, why = read_unit(old, tmp_path)    # the old sidecar no longer matches the CSV it sits beside
    assert df is None and why.startswith("CSV does not match its checksum")
