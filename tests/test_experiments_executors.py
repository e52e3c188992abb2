"""workbench.experiments.executors: units on Dask's distributed scheduler give the serial run's results,
through the same cache (resume), with the workers' times in the sidecars."""

from __future__ import annotations

import itertools
import json
import math
import re

import pandas as pd
import pytest

from test_experiments import tiny_settings
from workbench import experiments as ex
from workbench.experiments.executors import Executor, finish_unit, makespan, unit_csv
from workbench.front.cli import main

#: columns that hold wall-clock times; a note's "... 0.05 s ..." figures too
TIME_COLUMNS = ("seconds", "solve_seconds")
_SECONDS = re.compile(r"\d+(\.\d+)?(e-?\d+)? ?s\b")


def _without_times(df: pd.DataFrame) -> pd.DataFrame:
    df = df.drop(columns=[c for c in df.columns if c in TIME_COLUMNS or c.endswith("_seconds")])
    if "note" in df:
        df["note"] = df["note"].astype(str).str.replace(_SECONDS, "T s", regex=True)
    return df


def _csvs(folder) -> dict[str, pd.DataFrame]:
    return {p.relative_to(folder).as_posix(): pd.read_csv(p) for p in sorted(folder.rglob("*.csv"))}


@pytest.fixture(scope="module")
def serial_and_dask(tmp_path_factory):
    s = tiny_settings()
    a, b = tmp_path_factory.mktemp("serial"), tmp_path_factory.mktemp("dask")
    ra = ex.reproduce(quick=True, out=a, settings=s, progress=False, png=False)
    rb = ex.reproduce(quick=True, out=b, settings=s, progress=False, png=False,
                      executor=Executor("dask", workers=2))
    return a, ra, b, rb


def test_a_two_worker_dask_cluster_gives_the_serial_results(serial_and_dask):
    """Every CSV (units, tables) equal, every column but the times."""
    a, ra, b, rb = serial_and_dask
    assert rb.executor == "dask (a local cluster of 2 workers)" and "a local cluster of 2 workers" in \
        rb.report_path.read_text()
    assert sorted(ra.computed) == sorted(rb.computed) and len(rb.computed) == len(ex.plan_units(ra.settings))
    left, right = _csvs(a), _csvs(b)
    assert left.keys() == right.keys() and len(left) > 10
    for name in left:
        pd.testing.assert_frame_equal(_without_times(left[name]), _without_times(right[name]), obj=name)
    assert ra.violations == rb.violations == []


def test_sidecars_record_the_workers_seconds_and_a_rerun_resumes_from_the_cache(serial_and_dask, tmp_path):
    _, _, b, rb = serial_and_dask
    units = ex.plan_units(rb.settings)
    for u in units:
        meta = json.loads(u.path(b).with_suffix(".json").read_text())
        assert meta["compute"]["seconds"] >= 0 and meta["compute"]["host"]
        assert meta["settings"] == u.settings
    gone = units[0]
    gone.path(b).unlink()                               # one unit lost: only it is computed again
    again = ex.reproduce(quick=True, out=b, settings=rb.settings, progress=False, png=False,
                         executor=Executor("dask", workers=2))
    assert again.computed == [gone.name] and len(again.skipped) == len(units) - 1


def test_a_worker_with_other_model_code_refuses_the_unit():
    unit = ex.Unit("complexity__family", "family", {"kind": "family", "k": [2], "time_limit": 5.0,
                                                     "code_version": "0000000000000000"})
    with pytest.raises(ValueError, match="runs model code .* the unit's key says 0000000000000000"):
        unit_csv(unit)
    done = finish_unit(ex.Unit("complexity__family", "family", {**unit.settings,
                                                                 "code_version": ex.versions()["code_version"]}))
    assert done.seconds > 0 and pd.read_csv(pd.io.common.StringIO(done.text)).shape[0] > 0


def test_executor_options_are_checked():
    with pytest.raises(ValueError, match="--workers needs --executor dask"):
        Executor("serial", workers=2)
    with pytest.raises(ValueError, match="--scheduler needs --executor dask"):
        Executor("processes", scheduler="tcp://x:1")
    with pytest.raises(ValueError, match="give one of them"):
        Executor("dask", workers=2, scheduler="tcp://x:1")
    assert Executor("dask", scheduler="tcp://h:8786").describe() == "dask (the scheduler at tcp://h:8786)"


def test_the_command_refuses_bad_executor_options_with_one_line(tmp_path, capsys):
    assert main(["reproduce", "--quick", "--out", str(tmp_path / "x"), "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workers needs --executor dask" in err[0]
    assert not (tmp_path / "x").exists()                # refused before any work


def test_makespan_against_every_assignment():
    """Longest-first onto the least loaded worker: never below the exact optimum (all assignments), never
    above 4/3 of it (Graham's bound), and at least the longest unit and the total over the workers."""
    cases = [[5, 4, 3, 3, 3], [7, 1, 1, 1, 1, 1, 1, 1], [2, 2, 2], [10], [3, 3, 2, 2, 2]]
    for times in cases:
        for n in (1, 2, 3):
            best = min(max(sum(t for t, w in zip(times, ws) if w == k) for k in range(n))
                       for ws in itertools.product(range(n), repeat=len(times)))
            got = makespan(times, n)
            assert best - 1e-9 <= got <= best * 4 / 3 + 1e-9
            assert got >= max(max(times), sum(times) / n) - 1e-9
    assert makespan([], 3) == 0 and math.isclose(makespan([1.5, 1.5], 8), 1.5)


def test_local_processes_hand_back_what_a_serial_run_computes():
    from workbench.experiments.executors import run_units

    units = ex.plan_units(tiny_settings(), ["family", "three_partition"])
    serial = {d.unit.name: _without_times(pd.read_csv(pd.io.common.StringIO(d.text)))
              for d in run_units(units, Executor())}
    pooled = {d.unit.name: _without_times(pd.read_csv(pd.io.common.StringIO(d.text)))
              for d in run_units(units, Executor("processes", workers=2))}
    assert serial.keys() == pooled.keys() == {u.name for u in units}
    for name in serial:
        pd.testing.assert_frame_equal(serial[name], pooled[name], obj=name)


def test_a_running_scheduler_takes_the_units(tmp_path):
    """--scheduler ADDRESS: the units go to a cluster someone else started (here a local one with one worker)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        rep = ex.reproduce(quick=True, out=tmp_path, settings=tiny_settings(), only="family", progress=False,
                           png=False, executor=Executor("dask", scheduler=cluster.scheduler_address))
    assert rep.computed == ["complexity__family"] and rep.executor.startswith("dask (the scheduler at tcp://")
    meta = json.loads((tmp_path / "units" / "complexity__family.json").read_text())
    assert meta["compute"]["seconds"] > 0
