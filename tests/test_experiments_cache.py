"""Units of the experiments: keyed by everything that determines them, stale ones recomputed, the reason said."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from workbench import experiments as ex
from workbench.experiments import units as units_module
from workbench.experiments.provenance import code_version, file_digest
from workbench.profiles import load_profile, write_profile


def tiny(network: str, **kw):
    base = dict(networks=(network,), devices=(2,), n_levels=2, methods=("dp", "pipedream"))
    base.update(kw)
    return ex.settings_for(quick=True, **base)


@pytest.fixture()
def profile(tmp_path):
    """A copy of the bundled resnet50 profile that the test may re-profile."""
    path = tmp_path / "net.csv"
    write_profile(load_profile("resnet50"), path)
    return path


def slower(path, factor=1.5):
    """Re-profile ``path``: the same layers with slower forward times (memory unchanged)."""
    chain = load_profile(str(path))
    layers = tuple(dataclasses.replace(l, forward=l.forward * factor) for l in chain.layers)
    write_profile(dataclasses.replace(chain, layers=layers), path)


def test_a_sweep_key_names_the_profile_digest_and_code_version(profile):
    u = ex.plan_units(tiny(str(profile)), ["throughput"])[0]
    assert u.settings["profile"]["sha256"] == file_digest(profile)
    assert u.settings["code_version"] == code_version()
    comp = ex.plan_units(tiny(str(profile)), ["family", "gains"])
    assert all(c.settings["code_version"] == code_version() for c in comp)


def test_a_reprofiled_network_makes_its_units_stale_even_with_the_same_memory_levels(profile, tmp_path):
    out = tmp_path / "out"
    s = tiny(str(profile))
    first = ex.reproduce(out=out, settings=s, only="throughput", progress=False, png=False)
    assert sorted(first.computed) == sorted(u.name for u in ex.plan_units(s, ["throughput"]))
    before = ex.plan_units(s, ["throughput"])
    slower(profile)
    after = ex.plan_units(s, ["throughput"])
    assert [u.settings["memory_levels"] for u in after] == [u.settings["memory_levels"] for u in before]
    for u in after:
        df, why = ex.read_unit(u, out)
        assert df is None and "profile" in why
    again = ex.reproduce(out=out, settings=s, only="throughput", progress=False, png=False)
    assert sorted(again.computed) == sorted(u.name for u in after) and again.skipped == []
    assert all("profile" in why for why in again.stale.values())
    assert "Recomputed 2 unit(s)" in again.report_path.read_text()
    # the new results are the slower profile's: one lower bound, and it moved
    sw = again.sweeps
    assert sw["lower_bound"].nunique() == 1 and sw["lower_bound"].iloc[0] > first.sweeps["lower_bound"].iloc[0]
    assert not again.violations


def test_other_model_code_makes_units_stale(profile, tmp_path, monkeypatch):
    out = tmp_path / "out"
    s = tiny(str(profile), methods=("dp",))
    ex.reproduce(out=out, settings=s, only="throughput", progress=False, png=False)
    monkeypatch.setattr(units_module, "code_version", lambda: "0123456789abcdef")
    u = ex.plan_units(s, ["throughput"])[0]
    df, why = ex.read_unit(u, out)
    assert df is None and why == "made with another key (differs in: code_version)"


def test_a_csv_and_a_sidecar_from_different_runs_do_not_make_a_unit(profile, tmp_path):
    out = tmp_path / "out"
    s = tiny(str(profile), methods=("dp",))
    ex.reproduce(out=out, settings=s, only="throughput", progress=False, png=False)
    u = ex.plan_units(s, ["throughput"])[0]
    path = u.path(out)
    df = pd.read_csv(path)
    df.loc[0, "period"] *= 2  # the other run's CSV, same length
    path.write_text(df.to_csv(index=False))
    assert ex.read_unit(u, out) == (None,
                                    "CSV does not match its checksum (changed, cut short, or written by another run)")
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["versions"]["code_version"] == code_version()


def test_reasons_for_missing_and_unreadable_units(tmp_path):
    u = ex.Unit("sweep__x", "sweep", {"kind": "sweep"})
    assert ex.read_unit(u, tmp_path) == (None, "not computed yet")
    u.path(tmp_path).parent.mkdir(parents=True)
    u.path(tmp_path).write_text("a\n1\n")
    u.path(tmp_path).with_suffix(".json").write_text("[1, 2]")
    assert ex.read_unit(u, tmp_path) == (None, "unreadable sidecar")
