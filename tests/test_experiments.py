"""Tests of workbench.experiments: a tiny reproduce run, its outputs and bounds, resume, helpers."""

from __future__ import annotations

import argparse
import json
import math

import pandas as pd
import pytest

from workbench import experiments as ex
from workbench.experiments import report as report_module
from workbench.front.studies import reproduce_command
from workbench.model.plan import lower_bound
from workbench.model.target import Target
from workbench.profiles import load_profile

TOL = 1e-6


def tiny_settings(**kw):
    base = dict(networks=("resnet50",), devices=(2,), n_levels=2, time_limit=3.0, scaling_layers=(4,),
                scaling_devices=(2,), scaling_time_limit=5.0, gain_instances=3, gain_layers=5, gain_devices=2,
                gain_positions=(0.0, 0.5), three_partition_m=(2,), three_partition_count=1, family_k=(2,))
    base.update(kw)
    return ex.settings_for(quick=True, **base)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    rep = ex.reproduce(quick=True, out=out, settings=tiny_settings(), progress=False, png=False)
    return out, rep


def test_outputs_exist(tiny):
    out, rep = tiny
    assert rep.report_path.exists()
    text = rep.report_path.read_text()
    for name in ex.FIGURES:
        assert f"## {name}:" in text, name
        assert any(f.name == name for f in rep.figures)
    for f in ("throughput.csv", "throughput_resnet50.html", "memory_per_device.csv", "min_memory.csv",
              "solve_times.csv", "three_partition.csv", "family.csv", "scaling.csv", "gains.csv", "plotly.min.js"):
        assert (out / f).exists(), f
    units = ex.plan_units(rep.settings)
    assert len(rep.computed) == len(units) and not rep.skipped
    for u in units:
        meta = json.loads(u.path(out).with_suffix(".json").read_text())
        assert meta["settings"] == u.settings and meta["rows"] == len(pd.read_csv(u.path(out)))
        assert {"workbench", "pyomo", "highspy", "date"} <= set(meta["versions"])
    # one unit per (network, P, method)
    assert {u.name for u in units if u.kind == "sweep"} == {f"sweep__resnet50__P2__{m}" for m in ex.METHOD_KEYS}


def test_sweep_numbers_satisfy_bounds(tiny):
    out, rep = tiny
    sw = ex.sweep_frame(out)
    assert set(sw.method_key) == set(ex.METHOD_KEYS)
    assert not rep.violations and ex.bound_violations(sw) == []
    chain = load_profile("resnet50")
    lb = lower_bound(chain, Target.of(2))
    comp = chain.forward + chain.backward
    assert lb == pytest.approx(max(comp.sum() / 2, comp.max()))
    fits = sw[sw.fits.astype(bool)]
    assert len(fits) > 0
    assert (fits.period >= lb * (1 - TOL)).all()  # no plan beats the lower bound
    assert (fits.normalised_throughput <= 1 + TOL).all()
    # every plan that "fits" is within the limit
    for _, r in fits.iterrows():
        assert max(float(x) for x in r.memory_per_device.split(";")) <= r.memory_limit * (1 + TOL)
    for lvl, g in fits.groupby("level"):
        by = {r.method_key: r for _, r in g.iterrows()}
        gen, con = by.get("ilp-general"), by.get("ilp-contiguous")
        if gen is not None and con is not None and gen.status == con.status == "optimal":
            assert gen.throughput >= con.throughput * (1 - 1e-5)
        for k in ("ilp-general", "ilp-contiguous"):
            ilp = by.get(k)
            if ilp is None or ilp.status != "optimal":
                continue
            for base in ("dp", "pipedream"):
                if base in by:
                    assert ilp.throughput >= by[base].throughput * (1 - 1e-5)
    # the exact contiguous DP and an optimal contiguous ILP agree
    both = sw[(sw.method_key.isin(["dp", "ilp-contiguous"])) & (sw.status == "optimal")]
    for lvl, g in both.groupby("level"):
        if len(g) == 2:
            assert g.period.iloc[0] == pytest.approx(g.period.iloc[1], rel=1e-5)
    # the lowest level is feasible for the exact DP; the top one reaches its unconstrained period
    dp = sw[sw.method_key == "dp"].sort_values("level")
    assert bool(dp.fits.iloc[0])
    from workbench.planners import plan

    free = plan(chain, Target.of(2, bandwidth="12GB/s"), "dp")
    assert dp.period.iloc[-1] == pytest.approx(free.period, rel=1e-6)


def test_complexity_outputs(tiny):
    out, _ = tiny
    tp = pd.read_csv(out / "three_partition.csv")
    dec = tp[tp.status == "optimal"]
    assert len(dec) > 0
    assert (dec.planner_says_yes.astype(bool) == dec.exhaustive_yes.astype(bool)).all()
    assert ((dec.period >= dec.bound * (1 - TOL))).all()
    fam = pd.read_csv(out / "family.csv")
    dp = fam[(fam.method == "dp")].set_index("k").period
    gen = fam[(fam.method == "brute") & (fam.status == "optimal")].set_index("k").period
    for k in gen.index:
        assert dp[k] / gen[k] == pytest.approx(k, rel=1e-6)
    gains = pd.read_csv(out / "gains.csv")
    ok = gains[(gains.general_status == "optimal")].gain_general.dropna()
    assert (ok >= 1 - TOL).all()
    sc = pd.read_csv(out / "scaling.csv")
    assert {"seconds", "timed_out"} <= set(sc.columns) and (sc.seconds >= 0).all()


def test_resume_skips_and_recomputes(tiny, tmp_path):
    out, _ = tiny
    s = tiny_settings()
    rep2 = ex.reproduce(quick=True, out=out, settings=s, progress=False, png=False, only="throughput")
    assert rep2.computed == [] and len(rep2.skipped) == len(ex.METHOD_KEYS)
    sweep_units = [u for u in ex.plan_units(s, ["throughput"])]
    # a partial file (cut mid-write) and a lost sidecar are recomputed; the rest is kept
    a, b = sweep_units[0], sweep_units[1]
    data = a.path(out).read_bytes()
    a.path(out).write_bytes(data[: len(data) // 2])
    b.path(out).with_suffix(".json").unlink()
    before = {u.name: u.path(out).stat().st_mtime_ns for u in sweep_units[2:]}
    rep3 = ex.reproduce(quick=True, out=out, settings=s, progress=False, png=False, only="throughput")
    assert sorted(rep3.computed) == sorted([a.name, b.name])
    assert {u.name: u.path(out).stat().st_mtime_ns for u in sweep_units[2:]} == before
    assert ex.load_unit(a, out) is not None
    # other settings: only the units they change are recomputed (the contiguous ILP's time limit)
    s2 = tiny_settings(time_limit=2.0)
    rep4 = ex.reproduce(quick=True, out=out, settings=s2, progress=False, png=False, only="throughput")
    contiguous_ilp = [u.name for u in ex.plan_units(s2, ["throughput"])
                      if u.settings["method"] == "ilp" and u.settings["allocation"] == "contiguous"]
    assert sorted(rep4.computed) == sorted(contiguous_ilp)
    # the general ILP has its own limit
    s3 = s2.with_(general_time_limit=s2.general_time_limit + 1)
    rep5 = ex.reproduce(quick=True, out=out, settings=s3, progress=False, png=False, only="throughput")
    assert rep5.computed and sorted(rep5.computed) == sorted(
        u.name for u in ex.plan_units(s3, ["throughput"]) if u.settings["allocation"] == "general"
        and u.settings["method"] == "ilp")


def test_load_unit_rejects_mismatch(tiny):
    out, rep = tiny
    u = ex.plan_units(rep.settings, ["family"])[0]
    assert ex.load_unit(u, out) is not None
    other = ex.Unit(u.name, u.kind, {**u.settings, "time_limit": 12345})
    assert ex.load_unit(other, out) is None
    corrupt = u.path(out).read_text().replace("optimal", "optimall", 1)
    u.path(out).write_text(corrupt)  # same length class of damage: checksum catches it
    assert ex.load_unit(u, out) is None


def test_png_failure_is_a_warning(tmp_path, monkeypatch):
    import plotly.io as pio

    def boom(*a, **k):
        raise RuntimeError("Chrome not found")

    monkeypatch.setattr(pio, "write_images", boom, raising=False)
    monkeypatch.setattr(pio, "write_image", boom, raising=False)
    s = tiny_settings()
    rep = ex.reproduce(quick=True, out=tmp_path, settings=s, progress=False, only="family")
    assert rep.png is False and any("PNG export skipped" in w for w in rep.warnings)
    assert (tmp_path / "family.html").exists() and not (tmp_path / "family.png").exists()
    assert "PNG export skipped" in rep.report_path.read_text()


def test_only_and_command_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown figure"):
        ex.reproduce(quick=True, out=tmp_path, only="nope", progress=False)
    args = argparse.Namespace(quick=True, only="nope", out=str(tmp_path))
    assert reproduce_command(args) == 2
    assert "unknown figure" in capsys.readouterr().err


def hand_sweeps():
    rows = []
    for lvl, M in enumerate([1.0, 2.0, 4.0]):
        for mk, per, fits in (("ilp-general", [2.0, 1.5, 1.0], True), ("dp", [3.0, 2.0, 1.0], True),
                              ("pipedream", [None, 3.0, 1.25], None)):
            p = per[lvl]
            ok = fits if fits is not None else p is not None
            rows.append({"network": "n", "devices": 2, "method_key": mk, "level": lvl, "memory_limit": M,
                         "least_memory": 1.0, "period": p if p else math.nan, "fits": ok,
                         "throughput": 1 / p if p else 0.0, "lower_bound": 1.0,
                         "status": "optimal" if mk != "pipedream" else "feasible"})
    return pd.DataFrame(rows)


def test_min_memory_and_headlines_on_hand_frame():
    sw = hand_sweeps()
    t = ex.min_memory_table(sw).set_index("method_key")
    # best throughput 1.0 (period 1); 95% of it: period <= 1/0.95 = 1.0526
    assert t.loc["ilp-general", "min_memory"] == 4.0 and t.loc["dp", "min_memory"] == 4.0
    assert math.isnan(t.loc["pipedream", "min_memory"])  # 1.25 never reaches 95%
    h = ex.headline_gains(sw).iloc[0]  # tight: lower half of 3 levels = levels 0, 1
    assert h.cases == 2 and h.over_does_not_fit == 1
    assert h.median_gain == pytest.approx(3.0 / 1.5) and h.best_gain == pytest.approx(2.0)


def test_bound_violations_detects_planted_errors():
    sw = hand_sweeps()
    assert ex.bound_violations(sw) == []
    bad = sw.copy()
    bad.loc[(bad.method_key == "dp") & (bad.level == 0), "period"] = 0.5  # beats the bound
    bad.loc[(bad.method_key == "ilp-general") & (bad.level == 1), "period"] = 2.5  # worse than dp (2.0)
    v = ex.bound_violations(bad)
    assert any("< bound" in x for x in v)
    assert any("worse than dp" in x for x in v)
    assert any("grow with memory" in x for x in v)


def test_compute_false_reports_missing_units(tiny, tmp_path):
    out, rep = tiny
    s = tiny_settings()
    empty = ex.reproduce(quick=True, out=tmp_path, settings=s, progress=False, png=False, only="family", compute=False)
    assert empty.computed == [] and empty.missing == ["complexity__family"] and empty.figures == []
    assert "Partial results" in empty.report_path.read_text()
    # (the family unit of the shared run is corrupted by another test: use the gains)
    full = ex.reproduce(quick=True, out=out, settings=s, progress=False, png=False, only="gains", compute=False)
    assert full.missing == [] and [f.name for f in full.figures] == ["gains"]


def test_only_with_others_keeps_every_figure_in_the_report(tmp_path):
    # the command line's --only: recompute one figure, show the others from the units on disk
    s = tiny_settings()
    first = ex.reproduce(quick=True, out=tmp_path, settings=s, progress=False, png=False, only="gains")
    assert first.computed == ["complexity__gains"]
    again = ex.reproduce(quick=True, out=tmp_path, settings=s, progress=False, png=False, only="family", others=True)
    assert again.computed == ["complexity__family"]                       # gains is read, not recomputed
    assert {f.name for f in again.figures} == {"gains", "family"}
    assert "complexity__three_partition" in again.missing and "complexity__gains" not in again.missing
    text = again.report_path.read_text()
    assert "## gains:" in text and "## family:" in text and "Partial results" in text


def small_run(out, **kw):
    s = tiny_settings(methods=("dp", "pipedream"))
    return s, ex.reproduce(quick=True, out=out, settings=s, progress=False, png=False, only="throughput,family", **kw)


HOLD_THE_LOCK = """
import sys, time
from workbench.io import folder_lock
with folder_lock(sys.argv[1], what="reproduce"):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_second_run_into_the_same_folder_is_refused_naming_the_first(tmp_path, capsys):
    import signal
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ex.FolderBusy, match=f"in use by reproduce \\(pid {holder.pid} on "):
            small_run(tmp_path, wait=0.3)
        args = argparse.Namespace(quick=True, only="family", out=str(tmp_path))
        assert reproduce_command(args) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert not (tmp_path / "units").exists() and not (tmp_path / "report.md").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    _, rep = small_run(tmp_path)  # the kernel dropped the killed holder's lock
    assert rep.computed and rep.report_path.exists()


def test_a_unit_lost_before_the_figures_is_named_with_the_reason(tmp_path, monkeypatch):
    real = ex.read_unit
    calls: dict[str, int] = {}

    def second_read_fails(unit, out):  # another writer replaced its CSV after the run checked it
        calls[unit.name] = calls.get(unit.name, 0) + 1
        if unit.name == "complexity__family" and calls[unit.name] > 1:
            return None, "CSV does not match its checksum (changed, cut short, or written by another run)"
        return real(unit, out)

    monkeypatch.setattr(report_module, "read_unit", second_read_fails)
    _, rep = small_run(tmp_path)
    assert rep.left_out == {"complexity__family": "CSV does not match its checksum (changed, cut short, or written "
                                                  "by another run)"}
    assert [f.name for f in rep.figures] == ["throughput"]
    text = rep.report_path.read_text()
    assert "**Partial results**: 1 of 3 units are left out" in text
    assert "- `complexity__family`: CSV does not match its checksum" in text


def test_a_failed_check_is_at_the_top_of_the_report_and_fails_the_command(tmp_path, monkeypatch, capsys):
    import hashlib

    s, _ = small_run(tmp_path)
    u = next(u for u in ex.plan_units(s, ["throughput"]) if u.settings["method_key"] == "pipedream")
    df = pd.read_csv(u.path(tmp_path))
    df["lower_bound"] *= 0.5  # as if this unit had been made from another profile version
    text = df.to_csv(index=False)
    u.path(tmp_path).write_text(text)
    side = u.path(tmp_path).with_suffix(".json")
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({**meta, "sha256": hashlib.sha256(text.encode()).hexdigest()}))
    _, rep = small_run(tmp_path)
    assert rep.computed == [] and any("disagree on lower_bound" in v for v in rep.violations)
    report = rep.report_path.read_text()
    assert report.index("## CHECKS FAILED") < report.index("Settings:") and "All checks pass" not in report
    monkeypatch.setattr("workbench.front.studies.reproduce", lambda **kw: rep)
    assert reproduce_command(argparse.Namespace(quick=True, only=None, out=str(tmp_path))) == 1
    assert "CHECKS FAILED" in capsys.readouterr().err


def test_an_honest_pass_says_how_many_groups_were_checked(tmp_path):
    _, rep = small_run(tmp_path)
    assert rep.checked_groups == 1 and not rep.violations
    text = rep.report_path.read_text()
    assert "All checks pass on the 1 (network, P) groups" in text and "SHA-256" in text


def test_orphans_of_a_killed_run_are_removed_and_said(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)  # a process that has exited: what a killed run's temporary file names
    (tmp_path / f".report.md.{dead}.abcd1234.tmp").write_text("half")
    _, rep = small_run(tmp_path)
    assert not list(tmp_path.glob(".*.tmp")) and any("left by a killed run" in w for w in rep.warnings)


def test_notebooks_reading_results_write_nothing(tmp_path):
    small_run(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    rep = ex.reproduce(quick=True, out=tmp_path, settings=tiny_settings(methods=("dp", "pipedream")), progress=False,
                       png=False, only="throughput", compute=False, write=False)
    assert rep.figures and rep.computed == []
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


def test_quick_writes_under_build_and_never_touches_the_committed_results(tmp_path, monkeypatch, capsys):
    """`reproduce --quick` without --out: build/reproduce-quick under the working folder; data/results as it was."""
    import hashlib

    from workbench.front.cli import main
    from workbench.paths import RESULTS_DIR

    def digest():
        return {p.relative_to(RESULTS_DIR).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(RESULTS_DIR.rglob("*")) if p.is_file()}

    before = digest()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(report_module, "settings_for", lambda quick: tiny_settings())
    monkeypatch.setenv("WORKBENCH_NO_PNG", "1")
    assert main(["reproduce", "--quick", "--only", "family"]) == 0
    assert "build/reproduce-quick/report.md" in capsys.readouterr().out
    assert (tmp_path / "build" / "reproduce-quick" / "units" / "complexity__family.csv").exists()
    assert digest() == before


def test_three_partition_figure_shows_every_method():
    """brute force and the ILP agree, so their points coincide: the figure sets them side by side."""
    from workbench.experiments.figures import three_partition_figure

    df = pd.DataFrame({"method": ["brute", "ilp"], "status": ["optimal"] * 2, "generated_as": ["yes"] * 2,
                       "m": [2, 2], "seed": [0, 0], "period": [20.0, 20.0], "bound": [20, 20],
                       "planner_says_yes": [True, True], "exhaustive_yes": [True, True]})
    fig = three_partition_figure(df).figs[0]
    assert fig.layout.scattermode == "group"
    assert sorted(t.name.split(",")[0] for t in fig.data) == ["brute", "ilp"]
