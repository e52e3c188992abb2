"""workbench.experiments.executors: units on Dask's distributed scheduler give the serial run's results,
through the same cache (resume), with the workers' times in the sidecars."""

from __future__ import annotations

import itertools
import json
import math

import pandas as pd
import pytest

from test_experiments import tiny_settings
from workbench import experiments as ex
from workbench.experiments.executors import Executor, finish_unit, makespan, unit_csv
from workbench.front.cli import main

#: columns that hold wall-clock times, and free text (a planner's notes: what it did, with figures that depend on
#: the machine); never compared
TIME_COLUMNS = ("seconds", "solve_seconds")
TEXT_COLUMNS = ("note",)
#: what a row is (its inputs): equal between runs whatever its result
INPUT_COLUMNS = ("network", "devices", "level", "method_key", "label", "device", "memory_limit", "least_memory",
                 "memory_relative", "n_layers", "time_limit", "method", "allocation", "lower_bound", "profile_sha256",
                 "code_version", "k", "m", "seed", "numbers", "bound", "generated_as", "exhaustive_yes", "instance",
                 "heterogeneity", "memory_position", "family", "criterion", "fraction", "predicted_factor")


def _without_times(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in df.columns if c in TIME_COLUMNS + TEXT_COLUMNS or c.endswith("_seconds")])


def _may_vary(df: pd.DataFrame) -> pd.Series:
    """Per row, whether it says its result may differ between runs: ``may_vary`` (a phase the wall clock
    stopped), ``timed_out``, or a ``status`` column at ``timeout`` (a wall-clock limit ended the solve)."""
    out = pd.Series(False, index=df.index)
    for c in df.columns:
        if c in ("may_vary", "timed_out"):
            out |= df[c].fillna(False).astype(bool)
        elif c == "status" or c.endswith("_status"):
            out |= df[c].astype(str).eq("timeout")
    return out


def _compared(left: pd.DataFrame, right: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two tables as they are meant to be equal: without times and free text; on a row either run says may
    vary, its inputs only (the rest blanked on both sides)."""
    a, b = _without_times(left), _without_times(right)
    if len(a) != len(b):
        return a, b
    varies = (_may_vary(a).to_numpy() | _may_vary(b).to_numpy())
    results = [c for c in a.columns if c not in INPUT_COLUMNS]
    for df in (a, b):
        df[results] = df[results].astype(object)
        df.loc[varies, results] = None
    return a, b


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
        pd.testing.assert_frame_equal(*_compared(left[name], right[name]), obj=name)
    assert ra.violations == rb.violations == []


def test_only_what_is_meant_to_be_equal_is_compared():
    """A row that says it may vary compares its inputs alone; notes and times never; everything else always."""
    a = pd.DataFrame({"network": ["n", "n"], "period": [1.0, 2.0], "may_vary": [False, True], "note": ["x", "y"],
                      "seconds": [1.0, 2.0]})
    b = pd.DataFrame({"network": ["n", "n"], "period": [1.0, 3.0], "may_vary": [False, False], "note": ["z", "w"],
                      "seconds": [5.0, 6.0]})
    pd.testing.assert_frame_equal(*_compared(a, b))
    b.loc[0, "period"] = 1.5                      # a row neither run marks differs: the test sees it
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(*_compared(a, b))
    b.loc[0, "period"], b.loc[1, "network"] = 1.0, "m"   # an input differs on a row that may vary
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(*_compared(a, b))


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
    serial = {d.unit.name: pd.read_csv(pd.io.common.StringIO(d.text)) for d in run_units(units, Executor())}
    pooled = {d.unit.name: pd.read_csv(pd.io.common.StringIO(d.text))
              for d in run_units(units, Executor("processes", workers=2))}
    assert serial.keys() == pooled.keys() == {u.name for u in units}
    for name in serial:
        pd.testing.assert_frame_equal(*_compared(serial[name], pooled[name]), obj=name)


def test_a_running_scheduler_takes_the_units(tmp_path):
    """--scheduler ADDRESS: the units go to a cluster someone else started (here a local one with one worker)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        rep = ex.reproduce(quick=True, out=tmp_path, settings=tiny_settings(), only="family", progress=False,
                           png=False, executor=Executor("dask", scheduler=cluster.scheduler_address))
    assert rep.computed == ["complexity__family"] and rep.executor.startswith("dask (the scheduler at tcp://")
    meta = json.loads((tmp_path / "units" / "complexity__family.json").read_text())
    assert meta["compute"]["seconds"] > 0


def _server(answer: bytes | None):
    """A TCP server on localhost that accepts, then sends ``answer`` at once (None: says nothing); its address."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"tcp://127.0.0.1:{srv.getsockname()[1]}"


@pytest.mark.parametrize("answer,says", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "not as a Dask scheduler"),   # was: error: out of memory
    (None, "nothing answered within 1 s"),                                           # was: a hang, no message
])
def test_a_scheduler_address_where_no_dask_scheduler_answers_is_refused_in_one_line(monkeypatch, capsys, tmp_path,
                                                                                   answer, says):
    import workbench.experiments.executors as executors

    monkeypatch.setattr(executors, "CONNECT_SECONDS", 1.0)
    srv, address = _server(answer)
    try:
        code = main(["reproduce", "--quick", "--executor", "dask", "--scheduler", address, "--out", str(tmp_path)])
    finally:
        srv.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --scheduler {address}: ") and says in err[0]
    assert "out of memory" not in err[0] and not any(tmp_path.iterdir())


def test_a_transport_dask_cannot_use_here_or_nothing_listening_is_refused_in_one_line(capsys, tmp_path):
    """ucx:// without UCX ended in TypeError: Can't instantiate abstract class UCXConnector."""
    for address, says in (("ucx://127.0.0.1:8786", "cannot connect with this transport"),
                          ("tcp://127.0.0.1:1", "cannot reach it")):
        code = main(["reproduce", "--quick", "--executor", "dask", "--scheduler", address, "--out", str(tmp_path)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and says in err[0] and "Traceback" not in err[0], address
