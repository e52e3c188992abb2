"""workbench.experiments.largest: the GPT families, their fit, the search for the largest model that fits."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.experiments import largest as lg
from workbench.front.cli import main
from workbench.model.target import Target
from workbench.planners import plan as run_planner


def test_width_fit_checked_on_a_profile_it_did_not_use():
    df = lg.fit_check()
    nbytes = df[~df.column.isin(["forward", "backward"])]
    assert (nbytes.error.abs() < 1e-6).all()                       # byte columns: exact polynomials in d_model
    times = df[df.column.isin(["forward", "backward"]) & df.role.isin(["block", "head"])]
    assert (times.error.abs() < 0.05).all(), times                 # block and head times within 5 %


def test_families_are_what_they_say():
    deep = lg.family_chain("depth", 12)
    wide = lg.family_chain("width", 768)
    assert len(deep) == 14 and len(wide) == 14 and deep[1].name == "block0"
    assert deep.weights.sum() == pytest.approx(wide.weights.sum(), rel=1e-9)     # 768 wide, 12 deep: one model
    assert lg.parameters("depth", 24) > lg.parameters("depth", 12) and lg.parameters("width",
                                                                                     1024) > lg.parameters("width", 768)
    with pytest.raises(ValueError, match="unknown family"):
        lg.family_chain("height", 3)


def test_largest_is_a_boundary():
    size, plan = lg.largest_size("depth", 2, 2 * 2**30, "dp", "contiguous", "keep")
    assert size > 0 and plan.fits
    over = run_planner(lg.family_chain("depth", size + 1), Target.of(2, memory=2 * 2**30), "dp")
    assert not (over.feasible and over.fits)
    fast, fplan = lg.largest_size("depth", 2, 2 * 2**30, "dp", "contiguous", "keep", slowdown=1.1)
    full = lg.full_speed(lg.family_chain("depth", fast), 2, "dp")
    assert 0 < fast <= size and fplan.period <= 1.1 * full * (1 + 1e-9)


def test_table_ratios_and_auto_never_smaller():
    methods = tuple(m for m in lg.METHODS if m[1] in ("pipedream", "dp"))
    df = lg.largest_table(("depth",), (2,), 2 * 2**30, methods)
    assert set(df.criterion) == set(lg.CRITERIA) and len(df) == 2 * len(methods)
    for crit, g in df.groupby("criterion"):
        r = g.set_index("method")
        assert r.vs_pipedream["PipeDream"] == 1.0
        assert r.vs_pipedream["dp"] == pytest.approx(r.parameters["dp"] / r.parameters["PipeDream"])
        assert r["size"]["dp + auto"] >= r["size"]["dp"]


def test_command_line(tmp_path, capsys):
    out = tmp_path / "largest.csv"
    assert main(["largest", "--quick", "--family", "depth", "--devices", "2", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert set(df.method) == {m[0] for m in lg.METHODS if m[1] != "ilp"} and (df["size"] > 0).all()
    assert "PipeDream" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:         # the parser refuses it, before any work
        main(["largest", "--quick", "--family", "depth", "--devices", "2", "--memory", "lots"])
    assert refused.value.code == 2 and "argument --memory: cannot read 'lots'" in capsys.readouterr().err


def test_the_table_refuses_a_memory_that_is_no_limit():
    import math

    for memory in (math.inf, 0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="give a size above 0 and finite"):
            lg.largest_table(("depth",), (2,), memory)


def test_the_training_loop_is_a_setting_of_the_search():
    """Gradients zeroed in place stay resident: under that loop a smaller model fits than under torch's default
    (set to None), and ``largest --zero-grad`` says which loop it searched."""
    none, _ = lg.largest_size("depth", 2, 2 * 2**30, "dp", "contiguous", "keep")
    zeros, plan = lg.largest_size("depth", 2, 2 * 2**30, "dp", "contiguous", "keep", platform_kw={"zero_grad": "zeros"})
    assert 0 < zeros < none and plan.setup["zero_grad"] == "zeros"
    with pytest.raises(SystemExit) as e:               # argparse refuses an unknown loop in one line
        main(["largest", "--quick", "--family", "depth", "--devices", "2", "--zero-grad", "sometimes"])
    assert e.value.code == 2
