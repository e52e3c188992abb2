"""Predicted against measured (workbench.runtime.compare): the steady window, the calibration, and
when a measurement is not meaningful. Traces are built by hand (no torch run)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.model.trace import Trace
from workbench.runtime.compare import (
    calibrate,
    calibration_report,
    compare,
    measurement_warnings,
    stage_times,
    steady_warmup,
)
from workbench.schedules.builder import best_schedule, build_schedule
from workbench.schedules.program import predicted_ops

MS = 1e-3


def _setup(n: int = 16):
    chain = Chain(tuple(Layer(f"l{i}", 1 * MS, 2 * MS, 100, 10) for i in range(6)), input_bytes=10)
    plat = Target.of(3, memory=1000, bandwidth=20000, memory_model="paper")
    plan = best_schedule(chain, plat, [0, 0, 1, 1, 2, 2])   # the allocation's best schedule: re-scheduling keeps it
    ops = predicted_ops(plan, chain, n)
    return chain, plat, plan, ops


def _trace(ops: pd.DataFrame, devices: int = 3) -> Trace:
    mem = pd.DataFrame({"device": list(range(devices)), "time": [0.0] * devices, "activations": [0.0] * devices,
                        "weights": [0.0] * devices, "total": [0.0] * devices})
    return Trace(ops.sort_values(["device", "start"]).reset_index(drop=True), mem, devices, source="measured")


def test_the_plans_own_times_compare_and_calibrate_to_themselves():
    chain, plat, plan, ops = _setup()
    df = compare(plan, chain, plat, _trace(ops))
    assert df.attrs["period_error"] == pytest.approx(0, abs=1e-9) and np.allclose(df["busy_error"], 0, atol=1e-9)
    rep = calibration_report(plan, chain, plat, _trace(ops), replan=False)
    assert rep["error_after"] == pytest.approx(0, abs=1e-9) and rep["calibration_helps"]


def test_calibration_uses_the_mean_so_stretched_operations_count():
    """Three of every eight backwards of stage 2 take 4x as long (time-sharing): the device's time
    per mini-batch, and so the period, follow the mean; the median ignored them."""
    chain, plat, plan, ops = _setup(24)
    stretched = ops.copy()
    hit = (stretched["stage"] == 2) & (stretched["kind"] == "B") & (stretched["batch"] % 8 < 3)
    took = stretched.loc[hit, "end"] - stretched.loc[hit, "start"]
    stretched.loc[hit, "end"] = stretched.loc[hit, "start"] + 4 * took
    tr = _trace(stretched)
    st = stage_times(plan, chain, tr)
    assert st.loc[2, "mean_backward"] > st.loc[2, "measured_backward"]     # mean above the median
    cal = calibrate(chain, plan, tr)
    B2 = cal.stage_costs(4, 5).backward
    assert B2 == pytest.approx(st.loc[2, "mean_backward"])
    busy = compare(plan, chain, plat, tr)["measured_busy"]
    rep = calibration_report(plan, chain, plat, tr, replan=False)
    assert rep["calibrated_period"] >= busy.max() * (1 - 1e-9)   # the calibrated model can carry the load


def test_the_steady_window_skips_the_first_stages_run_ahead():
    """A run executes as soon as it can: the first stage runs k_0 = 6 forwards back to back before
    the next waits for a backward. With 12 mini-batches the first quarter (3) is not enough."""
    chain = Chain(tuple(Layer(f"l{i}", 1 * MS, 2 * MS, 100, 10) for i in range(6)), input_bytes=10)
    plat = Target.of(3, bandwidth=20000, memory_model="paper")
    plan = build_schedule(chain, plat, [0, 0, 1, 1, 2, 2], 8 * MS, method="builder")
    plan = plan.with_(stages=tuple(st.__class__(st.first, st.last, st.device, st.fwd_start, st.bwd_start,
                                                6 if i == 0 else st.in_flight) for i, st in enumerate(plan.stages)))
    ops = predicted_ops(plan, chain, 12)
    f0 = (ops["stage"] == 0) & (ops["kind"] == "F")
    early = f0 & (ops["batch"] < 6)        # forwards 0..5: 2 ms apart instead of 8
    shift = ops.loc[early, "batch"] * (8 * MS - 2 * MS)
    ops.loc[early, "start"] -= shift
    ops.loc[early, "end"] -= shift
    tr = _trace(ops)
    assert steady_warmup(plan, tr) == 6
    assert compare(plan, chain, plat, tr).attrs["measured_period"] == pytest.approx(8 * MS)


def test_a_contradictory_measurement_is_flagged_and_calibration_says_it_does_not_help():
    """The issue's run: the period measured 28 % below the prediction while every device is busy
    three times its prediction (a window that is not steady, a plan made on another profile)."""
    chain, plat, plan, ops = _setup(16)
    odd = ops.copy()
    odd["end"] = odd["start"] + 3 * (odd["end"] - odd["start"])
    f0 = (odd["stage"] == 0) & (odd["kind"] == "F")
    odd.loc[f0, "start"] = odd.loc[f0, "batch"] * 0.72 * plan.period
    tr = _trace(odd)
    df = compare(plan, chain, plat, tr, cores=2, load=5.0)
    assert df.attrs["period_error"] == pytest.approx(-0.28, abs=1e-6)
    w = " | ".join(df.attrs["warnings"])
    assert "busier than the measured period" in w and "3 ranks share 2 cores" in w and "load average 5.0" in w
    rep = calibration_report(plan, chain, plat, tr, replan=False)
    assert abs(rep["error_after"]) > abs(rep["error_before"]) and rep["calibration_helps"] is False
    assert "not what set the measured period" in rep["note"]


def test_other_reasons_a_measurement_is_not_meaningful():
    chain, plat, plan, ops = _setup(5)
    tr = _trace(ops)
    df = compare(plan, chain, plat, tr, cpu=pd.DataFrame({"device": [0, 1, 2] * 5,
                                                          "batch": sum([[i] * 3 for i in range(5)], []),
                                                        "cpu": [0.4 * 3 * MS] * 15}))
    w = " | ".join(df.attrs["warnings"])
    assert "time-shared ranks" in w and "only 2 steady mini-batches after 3 of warm-up" in w
    other = Chain(tuple(Layer(f"l{i}", 3 * MS, 6 * MS, 100, 10) for i in range(6)), input_bytes=10)
    w = measurement_warnings(plan, other, plat, tr, compare(plan, other, plat, tr), warmup=1)
    assert any("not valid on this profile" in x for x in w)
    _, _, plan16, ops16 = _setup(16)
    assert compare(plan16, chain, plat, _trace(ops16), cores=4, load=1.0).attrs["warnings"] == []
