"""The code version changes with what the model code does, not with its comments; profile digests are file hashes."""

from __future__ import annotations

import hashlib

from workbench.experiments import provenance as pv


def test_docstrings_comments_and_layout_do_not_count_but_code_does():
    a = 'def f(x):\n    """Doc."""\n    return x + 1\n'
    b = 'def f(x):\n    # a comment\n    return (x +\n            1)\n'
    c = 'def f(x):\n    return x + 2\n'
    assert pv._normalised_source(a) == pv._normalised_source(b) != pv._normalised_source(c)
    klass = 'class K:\n    """Doc only."""\n'
    assert pv._normalised_source(klass) == pv._normalised_source("class K:\n    pass\n")


def test_the_hashed_sources_are_the_model_not_the_presentation():
    rel = {p.relative_to(pv._PACKAGE).as_posix() for p in pv.model_sources()}
    for must in ("model/chain.py", "model/plan.py", "schedules/builder.py", "verify/check.py", "schedules/simulate.py",
                 "experiments/complexity.py",
                 "experiments/units.py", "experiments/sweeps.py", "experiments/cache.py", "methods.py",
                 "planners/sweep.py", "planners/dp/contiguous.py", "planners/ilp/planner.py", "profiles/pipedream.py",
                 "profiles/csvio.py"):
        assert must in rel, must
    for never in ("front/cli.py", "experiments/report.py", "experiments/analyses.py", "experiments/executors.py",
                  "io.py", "viz/gantt.py", "runtime/engine.py"):
        assert never not in rel, never


def test_code_version_follows_the_sources(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "planners").mkdir(parents=True)
    (pkg / "front").mkdir()
    (pkg / "planners" / "dp.py").write_text("X = 1\n")
    (pkg / "front" / "cli.py").write_text("Y = 1\n")
    monkeypatch.setattr(pv, "_PACKAGE", pkg)
    versions = []
    for change in (None, ("front/cli.py", "Y = 2\n"), ("planners/dp.py", '"""Doc."""\nX = 1  # same\n'),
                   ("planners/dp.py", "X = 2\n")):
        if change:
            (pkg / change[0]).write_text(change[1])
        pv.code_version.cache_clear()
        versions.append(pv.code_version())
    pv.code_version.cache_clear()
    assert versions[0] == versions[1] == versions[2] != versions[3]


def test_file_digest_and_versions(tmp_path):
    p = tmp_path / "f.csv"
    p.write_bytes(b"a,b\n1,2\n")
    assert pv.file_digest(p) == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    v = pv.versions()
    assert v["code_version"] == pv.code_version() and {"pyomo", "highspy", "git", "date"} <= set(v)
