"""The experiments' figures say what they plot: titles agree with axes, log ticks are explicit, nothing vanishes
unsaid."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.experiments import METHOD_LABELS
from workbench.experiments import figures as R

GiB = 2**30


def sweeps(devices=(8, 2, 4)):
    """A sweep table as the units give it, device counts deliberately out of order."""
    rows = []
    for P in devices:
        for lvl, M in enumerate((0.5, 1.25, 3.0)):
            for mk, per in (("dp", 2.0 - lvl * 0.4), ("ilp-contiguous", 2.0 - lvl * 0.4),
                            ("ilp-general", 1.5 - lvl * 0.2), ("pipedream", None if lvl == 0 else 1.5),
                            ("gpipe", 1.1), ("1f1b", 1.05)):
                fits = per is not None and (mk not in ("gpipe",) or lvl == 2)
                rows.append({"network": "net", "devices": P, "level": lvl, "method_key": mk, "label": METHOD_LABELS[mk],
                             "memory_limit": M * GiB, "least_memory": 0.5 * GiB, "period": per if per else float("nan"),
                             "fits": fits, "throughput": 1 / per if per else 0.0, "lower_bound": 1.0,
                             "normalised_throughput": 1 / per if per else 0.0,
                             "status": "optimal" if mk in ("dp", "ilp-contiguous") else "feasible",
                             "memory_per_device": ";".join([str(0.4 * M * GiB)] * P) if per else "",
                             "seconds": 0.01, "timed_out": False})
    return pd.DataFrame(rows)


def test_throughput_title_and_axis_say_the_same_and_panels_run_p_up():
    info = R.throughput_figure(sweeps())
    fig = info.figs[0]
    assert info.stems == ["throughput_net"]
    assert "lower bound / period" in fig.layout.title.text and "upper bound" not in fig.layout.title.text
    assert fig.layout.yaxis.title.text == "lower bound / period"
    assert [a.text for a in fig.layout.annotations[:3]] == ["P = 2", "P = 4", "P = 8"]


def test_throughput_log_ticks_are_the_levels_written_out():
    fig = R.throughput_figure(sweeps()).figs[0]
    for ax in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.xaxis3):
        assert ax.type == "log" and list(ax.tickvals) == [0.5, 1.25, 3.0] and list(ax.ticktext) == ["0.5", "1.25", "3"]
        assert "GiB" in ax.title.text


def test_the_contiguous_ilp_is_visible_over_the_dp_and_says_so():
    fig = R.throughput_figure(sweeps()).figs[0]
    names = [t.name for t in fig.data if t.showlegend]
    dp = next(i for i, t in enumerate(fig.data) if t.legendgroup == "dp")
    con = next(i for i, t in enumerate(fig.data) if t.legendgroup == "ilp-contiguous")
    assert con > dp and fig.data[con].line.dash == "dash" and fig.data[con].marker.symbol == "square-open"
    assert fig.data[dp].line.width > fig.data[con].line.width
    assert any("dashed: equals the DP" in n for n in names)
    # the legend keeps the methods' order whatever the drawing order
    ranks = {t.legendgroup: t.legendrank for t in fig.data if t.showlegend}
    assert sorted(ranks, key=ranks.get) == [k for k in METHOD_LABELS if k in ranks]


def test_log_axes_of_solve_times_are_labelled_at_powers_of_ten():
    fig = R.solve_times_figure(sweeps()).figs[0]
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1


def test_a_method_without_a_plan_is_named_not_just_missing():
    sw = sweeps(devices=(4,))
    sw.loc[sw.method_key == "pipedream", ["memory_per_device", "fits"]] = ["", False]
    info = R.memory_figure(sw)
    fig = info.figs[0]
    assert "No plan, so no bars: PipeDream." == fig.layout.title.subtitle.text
    assert info.headlines[0].endswith("; no plan: PipeDream")


def test_min_memory_has_one_y_title_not_one_per_row():
    fig = R.min_memory_figure(sweeps()).figs[0]
    assert all(not ax.title.text for ax in (fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3))
    assert any(a.text == "memory / least feasible memory" for a in fig.layout.annotations)
    assert "missing bar" in fig.layout.title.subtitle.text


@pytest.mark.parametrize("values,text", [([1e-3, 0.01], ["0.001", "0.01"]),
                                         ([2.04, 4.35, 0.958], ["0.958", "2.04", "4.35"])])
def test_log_axis_ticks(values, text):
    assert R.log_axis_ticks(values)["ticktext"] == text


def test_min_memory_gives_bar_slots_only_to_methods_that_reach_and_each_row_its_scale():
    sw = sweeps()
    sw.loc[sw.method_key == "1f1b", "fits"] = False           # 1F1B-flush never fits: never within 95 %
    info = R.min_memory_figure(sw)
    fig, t = info.figs[0], info.tables["min_memory.csv"]
    reached = set(t[t.min_memory_relative < float("inf")].label)
    never = [m for m in METHOD_LABELS.values() if m in set(t.label) - reached]
    assert "1F1B-flush" in never
    assert not {tr.name for tr in fig.data} & set(never)          # no empty slot in every group
    assert fig.layout.title.subtitle.text.endswith(f"<br>Never within 95% anywhere: {', '.join(never)}.")
    assert all(ax.matches is None for ax in (fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3))
