"""Figures of plans and traces (plotly) and the ipywidgets explorer.

Everything here takes plain values (a :class:`~workbench.model.trace.Trace`, a
:class:`~workbench.model.plan.Plan`, a results DataFrame) and returns a plotly
figure, so each chart can be used on its own from a notebook.
"""

from workbench.viz.compare import allocation_map, period_vs_bound, throughput_vs_memory
from workbench.viz.explorer import Explorer, explore
from workbench.viz.export import ChromiumNotFound, save_html, save_image
from workbench.viz.gantt import bar_durations, gantt, gantt_compare, lanes, steady_window
from workbench.viz.memory import memory_bars, memory_bars_compare, memory_split, memory_timeline, memory_timelines

__all__ = [
    "gantt", "gantt_compare", "lanes", "bar_durations", "steady_window",
    "memory_bars", "memory_bars_compare", "memory_split", "memory_timeline", "memory_timelines",
    "throughput_vs_memory", "period_vs_bound", "allocation_map",
    "save_html", "save_image", "ChromiumNotFound",
    "Explorer", "explore",
]
