"""The explorer: an ipywidgets panel that re-plans as you move the controls.

Pick a profile (bundled or PipeDream's peer profiles), the number of
devices, the memory limit per device (a slider in GiB from the least memory
any contiguous plan needs to the memory the unconstrained optimum uses),
the bandwidth, the weight policy, the allocation and the method. Each
change re-plans with :func:`workbench.planners.plan` (results cached on the
inputs, so going back is instant), simulates a few periods and redraws the
Gantt chart, the memory bars and the summary table. Slow methods (ILP,
brute force) show a busy progress bar and stream the solver's log into the
"solver log" area.

Every control is an attribute (``.profile_dropdown``, ``.devices_slider``,
``.memory_slider``, ``.bandwidth_slider``, ``.weights_toggle``, ``.memory_dropdown`` (what a
device holds: the full memory model with an optimizer, or the paper's rule 7),
``.allocation_toggle``, ``.method_dropdown``) and so are the results
(``.plan``, ``.trace``, ``.gantt_figure``, ``.memory_figure``,
``.summary_text``), so tests and notebooks can drive it.

>>> from workbench.model.chain import Chain, Layer
>>> chain = Chain(tuple(Layer(f"l{i}", 0.001 * (1 + i % 3), 0.002, 2**28, 2**26) for i in range(8)),
...               input_bytes=2**26)
>>> ex = Explorer(chain=chain, devices=2, display_figures=False)
>>> ex.plan.status
'optimal'
>>> ex.memory_slider.value = ex.memory_slider.min
>>> ex.plan.period >= ex.plan.lower_bound
True
"""

from __future__ import annotations

import html
import math
import os
import time
from typing import Any, Callable

import ipywidgets as W
import plotly.graph_objects as go

from workbench.methods import METHODS, flushed, names
from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.trace import Trace
from workbench.model.training_setup import DEFAULT_BANDWIDTH
from workbench.model.units import format_bytes, format_seconds, parse_bandwidth, parse_size
from workbench.planners import plan as run_planner
from workbench.planners.dp.contiguous import least_contiguous_memory
from workbench.schedules.simulate import simulate
from workbench.viz.gantt import gantt
from workbench.viz.memory import memory_bars

__all__ = ["Explorer", "explore", "available_methods", "memory_range", "trace_of", "quick"]

GiB = 2**30
#: methods that show a progress bar and stream their log (the registry's ``slow``)
SLOW_METHODS = set(names(slow=True))
#: methods planned on blocks of a long chain (the registry's ``blocks``: the ILP coarsens by itself; flushed
#: schedules simulate)
COARSE_METHODS = set(names(blocks=True))
_PREFERRED_PROFILES = ("vgg16", "resnet50", "gpt-small", "pipedream/vgg16", "pipedream/resnet50")


def quick() -> bool:
    """True when ``$WORKBENCH_QUICK`` asks for quick settings (CI)."""
    return os.environ.get("WORKBENCH_QUICK", "") not in ("", "0", "false", "no")


def available_methods() -> list[str]:
    """Every planner's name, the DP first."""
    return sorted((m.name for m in METHODS), key=lambda m: (m != "dp", m))


def memory_range(chain: Chain, platform: Target) -> tuple[float, float]:
    """``(lo, hi)`` bytes: the least memory of any contiguous plan, and what the unconstrained optimum uses.

    Below ``lo`` no contiguous plan fits; above ``hi`` more memory does not help the DP.
    """
    lo = float(least_contiguous_memory(chain, platform)[0])
    free = run_planner(chain, platform.with_(memory=math.inf), "dp")
    hi = float(free.peak_memory) if free.feasible else 0.0
    return lo, max(hi * 1.05, lo * 1.5)


def trace_of(plan: Plan, chain: Chain, platform: Target, batches: int | None = None) -> Trace:
    """Simulate ``plan`` for a few mini-batches (:func:`workbench.schedules.simulate.simulate`).

    Periodic plans default to enough mini-batches to show the steady state;
    flushed schedules (GPipe, 1F1B) run their ``micro_batches``.
    """
    if batches is None:
        batches = int(plan.micro_batches or 8) if flushed(plan.schedule) else max(8, 2 * len(plan.stages) + 4)
    return simulate(plan, chain, platform, batches=batches)


def _summary_html(plan: Plan, chain: Chain, platform: Target) -> str:
    rows: list[tuple[str, str]] = [("method", f"{plan.method} ({plan.allocation}, {plan.schedule})"),
                                   ("status", plan.status)]
    if plan.feasible:
        rows += [
            ("period", format_seconds(plan.period)),
            ("throughput", f"{plan.throughput:.2f} mini-batches/s"),
            ("lower bound", f"{format_seconds(plan.lower_bound)} (ratio {plan.ratio_to_bound():.3f})"),
            ("stages", ", ".join(f"{s.first}–{s.last}→GPU{s.device} (k={s.in_flight})" for s in plan.stages)),
            ("peak memory", f"{format_bytes(plan.peak_memory)} of {format_bytes(plan.memory_limit)}"),
        ]
        if plan.gap:
            rows.append(("gap", f"{plan.gap:.2%}"))
    rows.append(("solve time", f"{plan.solve_seconds:.3f} s"))
    for n in plan.notes:
        rows.append(("note", n))
    body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
                   f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table class='wb-summary'>{body}</table>"


class _OutputWriter:
    """A file-like object appending text to an Output widget (for the solver log)."""

    def __init__(self, out: W.Output, sink: list[str]):
        self.out, self.sink = out, sink

    def write(self, text: str) -> int:
        if text:
            self.sink.append(text)
            self.out.append_stdout(text)
        return len(text)

    def flush(self) -> None:
        pass


class Explorer(W.VBox):
    """The explorer panel (an ipywidgets ``VBox``); see the module docstring.

    Pass ``profile`` (a name from :func:`~workbench.profiles.available_profiles`)
    or ``chain`` (a :class:`~workbench.model.chain.Chain`); ``memory`` in bytes or a
    size string (default: 60% of the slider range); ``bandwidth`` as bytes/s
    or a string (default :data:`~workbench.model.training_setup.DEFAULT_BANDWIDTH`). ``display_figures=False``
    computes the figures without displaying them (tests).
    """

    def __init__(self, profile: str | None = None, *, chain: Chain | None = None, devices: int = 4,
                 memory: float | str | None = None, bandwidth: float | str = DEFAULT_BANDWIDTH, weights: str = "stash",
                 weight_factor: float = 1.0, method: str = "dp", allocation: str = "contiguous",
                 optimizer: str = "adam",
                 time_limit: float | None = None, batches: int | None = None, color_by: str = "kind",
                 display_figures: bool = True, planner: Callable[..., Plan] | None = None,
                 max_layers: int | None = 200):
        from workbench.profiles import available_profiles, load_profile

        self._load_profile = load_profile
        self._planner = planner or run_planner
        self._display = display_figures
        self._cache: dict[tuple, tuple[Plan, Trace | None]] = {}
        self._chains: dict[str, Chain] = {}
        self._busy = False
        self._groups: dict[tuple, list[tuple[int, int]]] = {}
        self.max_layers = max_layers
        self.time_limit = time_limit if time_limit is not None else (5.0 if quick() else 30.0)
        self.batches, self.color_by, self.weight_factor = batches, color_by, float(weight_factor)
        self.plan: Plan | None = None
        self.trace: Trace | None = None
        self.gantt_figure: go.Figure | None = None
        self.memory_figure: go.Figure | None = None
        self.error: str | None = None
        self.replans = 0
        self.log_text: list[str] = []  # the solver log of the plan shown (empty when its method has none)
        self._logs: dict[tuple, str] = {}  # solver log per cached plan

        names, profile = self._profile_choices(profile, chain, list(available_profiles()))
        top = self._make_controls(names, profile, devices, bandwidth, weights, optimizer, allocation, method)
        super().__init__([top, self.gantt_out, self.memory_out, self.log_accordion])
        self.add_class("wb-explorer")

        self._reset_memory_range(memory)
        for w in (self.profile_dropdown, self.devices_slider, self.bandwidth_slider, self.weights_toggle,
                  self.memory_dropdown):
            w.observe(self._on_platform_change, names="value")
        for w in (self.memory_slider, self.allocation_toggle, self.method_dropdown):
            w.observe(self._on_change, names="value")
        self.replan()

    def _profile_choices(self, profile: str | None, chain: Chain | None, names: list[str]) -> tuple[list[str], str]:
        """The profile dropdown's names and the one shown first (a given chain, the given name, a preferred one)."""
        if chain is not None:
            label = profile or chain.name or "custom chain"
            self._chains[label] = chain
            names = [label] + [n for n in names if n != label]
            profile = label
        if profile is None:
            profile = next((p for p in _PREFERRED_PROFILES if p in names), names[0] if names else None)
        if profile is None:
            raise ValueError("no profiles found: pass chain= or add CSV profiles to data/profiles")
        if profile not in names:
            names = [profile] + names
        return names, profile

    def _make_controls(self, names: list[str], profile: str, devices: int, bandwidth: float | str, weights: str,
                       optimizer: str, allocation: str, method: str) -> W.HBox:
        """Every control and output area (attributes of the explorer); returns the top row: controls, summary."""
        style = {"description_width": "110px"}
        lay = W.Layout(width="420px")
        self.profile_dropdown = W.Dropdown(options=names, value=profile, description="profile", style=style, layout=lay)
        self.devices_slider = W.IntSlider(value=devices, min=1, max=max(16, devices), description="devices",
                                          style=style, layout=lay, continuous_update=False)
        bw = parse_bandwidth(bandwidth)
        bw_gb = bw / 1e9 if math.isfinite(bw) else 1000.0
        self.bandwidth_slider = W.FloatLogSlider(value=bw_gb, base=10, min=-1, max=3, step=0.05,
                                                 description="bandwidth GB/s", style=style, layout=lay,
                                                 readout_format=".3g", continuous_update=False)
        self.memory_slider = W.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.01, description="memory GiB",
                                           style=style, layout=lay, readout_format=".2f", continuous_update=False)
        self.weights_toggle = W.ToggleButtons(options=["stash", "single"], value=weights, description="weights",
                                              style={**style, "button_width": "80px"})
        # what a device holds (workbench.model.memory): the full model with an optimizer, or the paper's rule 7
        self.memory_dropdown = W.Dropdown(options=[("Adam", "adam"), ("AdamW", "adamw"), ("SGD + momentum", "momentum"),
                                                   ("SGD", "sgd"), ("no optimizer", "none"),
                                                   ("paper's rule 7", "paper")],
                                          value=optimizer, description="memory of", style=style, layout=lay)
        self.allocation_toggle = W.ToggleButtons(options=["contiguous", "general"], value=allocation,
                                                 description="allocation", style={**style, "button_width": "105px"})
        methods = available_methods()
        if method not in methods:
            methods = [method] + methods
        self.method_dropdown = W.Dropdown(options=methods, value=method, description="method", style=style, layout=lay)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="", bar_style="",
                                      layout=W.Layout(width="200px", visibility="hidden"))
        self.status_label = W.HTML(value="")
        self.summary = W.HTML(value="")
        self.gantt_out = W.Output(layout=W.Layout(min_height="260px"))
        self.memory_out = W.Output(layout=W.Layout(min_height="300px"))
        self.log_out = W.Output(layout=W.Layout(max_height="180px", overflow="auto", border="1px solid #ddd"))
        self.log_accordion = W.Accordion(children=[self.log_out], titles=("solver log",))
        self.log_accordion.selected_index = None

        controls = W.VBox([self.profile_dropdown, self.devices_slider, self.memory_slider, self.bandwidth_slider,
                           self.weights_toggle, self.memory_dropdown, self.allocation_toggle, self.method_dropdown,
                           W.HBox([self.progress, self.status_label])],
                          layout=W.Layout(width="450px"))
        return W.HBox([controls, W.VBox([self.summary], layout=W.Layout(flex="1", padding="0 0 0 1em"))])

    # ----- inputs --------------------------------------------------------
    @property
    def chain(self) -> Chain:
        name = self.profile_dropdown.value
        if name not in self._chains:
            self._chains[name] = self._load_profile(name)
        return self._chains[name]

    def groups(self) -> list[tuple[int, int]] | None:
        """Blocks of layers the DP-style methods plan on when the chain is longer than ``max_layers``.

        Planning a chain of hundreds of layers exactly takes seconds; on
        ``max_layers`` balanced blocks (:func:`workbench.planners.blocks.block_groups`,
        cached per profile and platform) it stays interactive and the plan is
        expanded back to the layers. ``max_layers=None`` always plans exactly.
        """
        chain = self.chain
        if not self.max_layers or len(chain) <= self.max_layers:
            return None
        key = (self.profile_dropdown.value, self.devices_slider.value, round(self.bandwidth_slider.value, 6),
               self.weights_toggle.value, self.weight_factor, self.memory_dropdown.value)
        if key not in self._groups:
            try:
                from workbench.planners.blocks import block_groups
            except ImportError:
                return None
            self._groups[key] = block_groups(chain, self.max_layers, self.platform(memory=math.inf))
        return self._groups[key]

    def planning_chain(self) -> Chain:
        """The chain the planners see: the profile's, or its blocks (see :meth:`groups`)."""
        g = self.groups()
        return self.chain if g is None else self.chain.coarsen(g)

    def platform(self, memory: float | None = None) -> Target:
        mem = self.memory_slider.value * GiB if memory is None else memory
        setup = self.memory_dropdown.value
        model = ({"memory_model": "paper", "weight_factor": self.weight_factor} if setup == "paper"
                 else {"optimizer": setup})
        return Target.of(self.devices_slider.value, memory=mem, bandwidth=self.bandwidth_slider.value * 1e9,
                        weights=self.weights_toggle.value, **model)

    def _reset_memory_range(self, memory: float | str | None = None) -> None:
        lo, hi = memory_range(self.planning_chain(), self.platform(memory=math.inf))
        lo_g, hi_g = math.ceil(lo / GiB * 100) / 100, math.ceil(hi / GiB * 100) / 100
        if hi_g <= lo_g:
            hi_g = lo_g + 0.1
        step = max(0.01, round((hi_g - lo_g) / 200, 2))
        if memory is not None:
            want = parse_size(memory, what="memory") / GiB
        else:
            old = self.memory_slider.value
            want = old if lo_g <= old <= hi_g and self.replans else lo_g + 0.6 * (hi_g - lo_g)
        self._busy = True
        try:
            s = self.memory_slider
            # widen first so that min/max can be set in any order
            s.max = max(s.max, hi_g, want)
            s.min = min(s.min, lo_g, want)
            s.step = step
            s.value = min(max(want, lo_g), max(hi_g, want))
            s.min, s.max = min(lo_g, s.value), max(hi_g, s.value)
        finally:
            self._busy = False

    def key(self) -> tuple:
        return (self.profile_dropdown.value, self.devices_slider.value, round(self.memory_slider.value, 6),
                round(self.bandwidth_slider.value, 6), self.weights_toggle.value, self.weight_factor,
                self.memory_dropdown.value,
                self.method_dropdown.value, self.allocation_toggle.value, self.max_layers)

    # ----- events --------------------------------------------------------
    def _on_platform_change(self, change: Any) -> None:
        if self._busy:
            return
        self._reset_memory_range()
        self.replan()

    def _on_change(self, change: Any) -> None:
        if self._busy:
            return
        self.replan()

    # ----- work ----------------------------------------------------------
    def replan(self) -> Plan | None:
        """Plan (or fetch from the cache) for the current controls, then redraw."""
        key = self.key()
        method = self.method_dropdown.value
        chain, platform = self.chain, self.platform()
        self.error = None
        if key in self._cache:
            result, trace = self._cache[key]
            self.status_label.value = f"<i>{method}: cached</i>"
            self._show_log(self._logs.get(key, ""), method)
        else:
            slow = method in SLOW_METHODS
            if slow:
                self.progress.layout.visibility = "visible"
                self.progress.bar_style = "info"
                self.progress.max, self.progress.value = 1, 0
                self.status_label.value = f"<b>solving with {html.escape(method)}…</b> (up to {self.time_limit:.0f} s)"
                self.log_accordion.selected_index = 0
            opts: dict[str, Any] = {}
            streamed: list[str] = []
            self._show_log("", method)  # a new plan: the previous method's log goes
            if slow:
                opts["log"] = _OutputWriter(self.log_out, streamed)
            t0 = time.perf_counter()
            groups = self.groups() if method in COARSE_METHODS else None
            try:
                if groups is None:
                    result = self._planner(chain, platform, method, allocation=self.allocation_toggle.value,
                                           time_limit=self.time_limit, **opts)
                else:
                    from workbench.planners.ilp.coarsen import expand_plan

                    coarse = self._planner(chain.coarsen(groups), platform, method,
                                           allocation=self.allocation_toggle.value, time_limit=self.time_limit, **opts)
                    note = (f"planned on {len(groups)} blocks of the {len(chain)} layers to stay interactive "
                            f"(Explorer(max_layers=None) plans layer by layer)")
                    if coarse.feasible:
                        result = expand_plan(coarse, chain, platform, groups)
                        result = result.with_(status="feasible" if result.status == "optimal" else result.status,
                                              notes=tuple(result.notes) + (note,), solve_seconds=coarse.solve_seconds,
                                              lower_bound=coarse.lower_bound)
                    else:
                        result = coarse.with_(notes=tuple(coarse.notes) + (note,))
            except Exception as e:  # noqa: BLE001 - show any planner failure in the panel
                self.error = f"{type(e).__name__}: {e}"
                self._show_log("".join(streamed), method)
                self.status_label.value = f"<span style='color:#b00'>{html.escape(self.error)}</span>"
                self.progress.layout.visibility = "hidden"
                self.summary.value = f"<pre>{html.escape(self.error)}</pre>"
                return None
            finally:
                if slow:
                    self.progress.value = 1
                    self.progress.bar_style = "success"
            trace = None
            if result.feasible:
                try:
                    trace = trace_of(result, chain, platform, self.batches)
                except Exception as e:  # noqa: BLE001
                    self.error = f"simulation failed: {type(e).__name__}: {e}"
            self._cache[key] = (result, trace)
            self._logs[key] = "".join(streamed)
            self._show_log(self._logs[key], method)
            self.status_label.value = f"<i>{html.escape(method)}: {time.perf_counter() - t0:.2f} s</i>"
            if slow:
                self.progress.layout.visibility = "hidden"
        self.replans += 1
        self.plan, self.trace = result, trace
        self._redraw(chain, platform)
        return result

    def _show_log(self, text: str, method: str) -> None:
        """Show ``text`` as the solver log of the plan on screen (``method``'s); nothing left from another plan."""
        self.log_text = [text] if text else []
        self.log_out.outputs = ({"output_type": "stream", "name": "stdout", "text": text},) if text else ()
        self.log_accordion.titles = (f"solver log ({method})" if text else f"solver log (none for {method})",)

    @property
    def summary_text(self) -> str:
        """The summary table as plain text (one ``key: value`` line per row)."""
        import re

        text = re.sub(r"</td></tr>", "\n", self.summary.value)
        text = re.sub(r"</th>", ": ", text)
        return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()

    def _redraw(self, chain: Chain, platform: Target) -> None:
        p = self.plan
        assert p is not None
        self.summary.value = _summary_html(p, chain, platform)
        if p.feasible and self.trace is not None:
            title = (f"{self.profile_dropdown.value}: {p.method}, period {format_seconds(p.period)}, "
                     f"{p.throughput:.1f} mini-batches/s")
            self.gantt_figure = gantt(self.trace, color_by=self.color_by, title=title)
            self.memory_figure = memory_bars(p, chain, platform)
        else:
            self.gantt_figure = self.memory_figure = None
        if not self._display:
            return
        # set the Output widgets' contents directly: capturing with ``with out:`` from a callback
        # makes nbclient (nbmake, CI) wait for ever on the kernel's idle message
        _show(self.gantt_out, self.gantt_figure if self.gantt_figure is not None else W.HTML(
            f"<p style='color:#b00'>no plan: {html.escape('; '.join(p.notes) or p.status)}</p>"))
        _show(self.memory_out, self.memory_figure)


def _show(out: W.Output, obj: Any) -> None:
    """Replace ``out``'s contents with ``obj``; a plotly figure as plotly's MIME bundle (JupyterLab renders it).

    ``Output.append_display_data`` would not do for figures: their
    ``_ipython_display_`` displays into the cell, not into the widget.
    """
    if obj is None:
        out.outputs = ()
    elif isinstance(obj, go.Figure):
        import plotly.io as pio

        bundle = pio.renderers["plotly_mimetype"].to_mimebundle(obj.to_dict())
        bundle["text/plain"] = f"<plotly figure: {obj.layout.title.text or ''}>"
        out.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)
    else:
        out.outputs = ()
        out.append_display_data(obj)


def explore(profile: str | None = None, **kw: Any) -> Explorer:
    """Build the explorer widget (see :class:`Explorer`); display it by leaving it last in a cell."""
    return Explorer(profile, **kw)
