"""The explorer widget: controls re-plan, results are cached, figures follow the plan."""

import math

import ipywidgets as W
import pytest

from workbench.model.chain import Chain, Layer
from workbench.planners import plan as real_plan
from workbench.viz.explorer import Explorer, available_methods, explore, memory_range
from workbench.viz.gantt import bar_durations, lanes

GiB = 2**30


def chain():
    return Chain(tuple(Layer(f"l{i}", 0.001 * (1 + i % 3), 0.002 * (1 + i % 2), 0.25 * GiB, 0.05 * GiB)
                       for i in range(10)), input_bytes=0.05 * GiB)


class Counting:
    def __init__(self):
        self.calls = []

    def __call__(self, ch, plat, method, **kw):
        self.calls.append((method, plat.memory, kw))
        return real_plan(ch, plat, method, **{k: v for k, v in kw.items() if k != "log"})


def make(**kw):
    counter = Counting()
    ex = Explorer(chain=chain(), devices=3, display_figures=False, planner=counter, **kw)
    return ex, counter


def test_is_a_widget_with_addressable_controls():
    ex, _ = make()
    assert isinstance(ex, W.VBox)
    for name in ("profile_dropdown", "devices_slider", "memory_slider", "bandwidth_slider", "weights_toggle",
                 "allocation_toggle", "method_dropdown", "summary", "gantt_out", "memory_out", "log_out", "progress"):
        assert isinstance(getattr(ex, name), W.Widget), name
    assert ex.method_dropdown.value == "dp" and "dp" in ex.method_dropdown.options
    assert available_methods()[0] == "dp"


def test_memory_range_spans_least_to_unconstrained():
    ex, _ = make()
    lo, hi = memory_range(ex.chain, ex.platform(memory=math.inf))
    assert ex.memory_slider.min == pytest.approx(math.ceil(lo / GiB * 100) / 100)
    assert ex.memory_slider.max >= hi / GiB - 0.01
    assert ex.memory_slider.min <= ex.memory_slider.value <= ex.memory_slider.max
    # the least memory is enough for some plan
    ex.memory_slider.value = ex.memory_slider.min
    assert ex.plan.feasible


def test_slider_replans_and_redraws():
    ex, counter = make()
    first = ex.plan
    text = ex.summary_text
    assert "period" in text and "status: optimal" in text
    ex.memory_slider.value = ex.memory_slider.min
    assert len(counter.calls) == 2
    assert counter.calls[-1][1] == pytest.approx(ex.memory_slider.min * GiB)
    assert ex.plan.period > first.period
    assert ex.summary_text != text
    # the figures follow the plan: one lane per device, one bar per F/B of the simulated trace
    assert lanes(ex.gantt_figure) == ["GPU 0", "GPU 1", "GPU 2"]
    comp = ex.trace.ops[ex.trace.ops["kind"].isin(["F", "B"])]
    assert len(bar_durations(ex.gantt_figure)) == len(comp)
    bars = [t for t in ex.memory_figure.data if t.type == "bar"]
    assert list(bars[0].x) == ["GPU 0", "GPU 1", "GPU 2"]


def test_cache_makes_going_back_free():
    ex, counter = make()
    v0 = ex.memory_slider.value
    ex.memory_slider.value = ex.memory_slider.min
    ex.memory_slider.value = v0
    assert len(counter.calls) == 2
    assert "cached" in ex.status_label.value


def test_platform_controls_replan():
    ex, counter = make()
    ex.weights_toggle.value = "single"
    assert counter.calls[-1][0] == "dp"
    ex.devices_slider.value = 2
    assert ex.plan.devices == 2 and lanes(ex.gantt_figure) == ["GPU 0", "GPU 1"]
    ex.bandwidth_slider.value = 1.0
    assert ex.platform().bandwidth == pytest.approx(1e9)
    ex.method_dropdown.value = "pipedream" if "pipedream" in available_methods() else "dp"
    assert ex.plan is not None


def test_slow_method_streams_log_and_shows_progress():
    seen = {}

    def fake(ch, plat, method, **kw):
        seen.update(kw)
        kw["log"].write("Running HiGHS\n")
        return real_plan(ch, plat, "dp")

    ex = Explorer(chain=chain(), devices=3, display_figures=False, planner=fake)
    if "ilp" not in ex.method_dropdown.options:
        ex.method_dropdown.options = list(ex.method_dropdown.options) + ["ilp"]
    ex.method_dropdown.value = "ilp"
    assert "log" in seen and seen["time_limit"] == ex.time_limit
    assert "Running HiGHS" in "".join(ex.log_text)
    assert ex.progress.value == ex.progress.max and ex.progress.bar_style == "success"


def test_infeasible_and_errors_are_shown():
    def boom(ch, plat, method, **kw):
        if method == "brute":
            raise RuntimeError("solver exploded")
        return real_plan(ch, plat, method, **kw)

    ex = Explorer(chain=chain(), devices=3, display_figures=False, planner=boom)
    ex.method_dropdown.options = ["dp", "brute"]
    ex.method_dropdown.value = "brute"
    assert ex.error and "solver exploded" in ex.summary.value
    ex.method_dropdown.value = "dp"
    ex._busy = True
    ex.memory_slider.min = 0.01
    ex.memory_slider.value = 0.01
    ex._busy = False
    ex.replan()
    assert ex.plan.status == "infeasible" and ex.gantt_figure is None
    assert "infeasible" in ex.summary_text


def test_explore_profile_by_name():
    from workbench.profiles import available_profiles

    names = available_profiles()
    if not names:
        pytest.skip("no profiles available")
    ex = explore(display_figures=False)
    assert ex.profile_dropdown.value in names and ex.plan is not None


def test_long_chains_are_planned_on_blocks():
    long = Chain(tuple(Layer(f"l{i}", 0.001 * (1 + i % 4), 0.002, 0.05 * GiB, 0.01 * GiB) for i in range(60)),
                 input_bytes=0.01 * GiB)
    ex = Explorer(chain=long, devices=3, display_figures=False, max_layers=12)
    assert len(ex.groups()) == 12 and len(ex.planning_chain()) == 12
    assert len(ex.plan.assignment) == 60  # expanded back to the layers
    assert ex.plan.status == "feasible" and any("blocks" in n for n in ex.plan.notes)
    assert "12 blocks of the 60 layers" in ex.summary_text
    exact = Explorer(chain=long, devices=3, display_figures=False, max_layers=None,
                     memory=ex.memory_slider.value * GiB)
    assert exact.groups() is None and exact.plan.status == "optimal"
    assert exact.plan.period <= ex.plan.period * (1 + 1e-9)


def test_the_solver_log_belongs_to_the_plan_on_screen():
    def fake(ch, plat, method, **kw):
        if "log" in kw:
            kw["log"].write(f"HiGHS log for {plat.memory / GiB:.2f} GiB\n")
        return real_plan(ch, plat, "dp")

    ex = Explorer(chain=chain(), devices=3, display_figures=False, planner=fake)
    assert ex.log_text == [] and ex.log_out.outputs == ()
    ex.method_dropdown.options = list(dict.fromkeys(list(ex.method_dropdown.options) + ["ilp"]))
    ex.method_dropdown.value = "ilp"
    ilp_log = "".join(ex.log_text)
    assert ilp_log.startswith("HiGHS log for") and ilp_log in ex.log_out.outputs[0]["text"]
    assert ex.log_accordion.titles == ("solver log (ilp)",)
    ex.method_dropdown.value = "dp"  # no solver: the ILP's log must not stay
    assert ex.log_text == [] and ex.log_out.outputs == () and ex.log_accordion.titles == ("solver log (none for dp)",)
    ex.method_dropdown.value = "ilp"  # from the cache: its own log again, once
    assert "".join(ex.log_text) == ilp_log and ex.log_out.outputs[0]["text"] == ilp_log
    ex.memory_slider.value = ex.memory_slider.max  # a new ILP solve: only the new log
    assert "".join(ex.log_text).count("HiGHS log for") == 1 and "".join(ex.log_text) != ilp_log


def test_the_memory_setup_replans_and_is_cached_apart():
    ex = Explorer(chain=chain(), devices=3, display_figures=False)
    assert ex.plan.setup["optimizer"] == "adam"
    adam_range = (ex.memory_slider.min, ex.memory_slider.max)
    ex.memory_dropdown.value = "sgd"           # no optimizer state: the memory range moves down
    assert ex.plan.setup["optimizer"] == "sgd" and ex.memory_slider.max < adam_range[1]
    ex.memory_dropdown.value = "paper"
    assert ex.plan.setup["memory_model"] == "paper" and ex.plan.fits
    ex.memory_dropdown.value = "adam"
    assert ex.plan.setup["optimizer"] == "adam" and ex.plan.fits
    assert (ex.memory_slider.min, ex.memory_slider.max) == adam_range
