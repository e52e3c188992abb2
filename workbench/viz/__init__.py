"""What the notebooks show: plotly figures of plans and traces, the explorer, and the numbers the text states.

* the charts take plain values (a :class:`~workbench.model.trace.Trace`, a :class:`~workbench.model.plan.Plan`,
  a results DataFrame) and return a plotly figure, so each can be used on its own:
  :mod:`~workbench.viz.gantt` (Gantt charts), :mod:`~workbench.viz.memory` (memory over time and split by term),
  :mod:`~workbench.viz.compare` (throughput against memory, period against bound, allocation maps, prediction
  errors), :mod:`~workbench.viz.frontier` (every method's throughput against memory) and
  :mod:`~workbench.viz.policies` (what recompute and offload buy);
* :mod:`~workbench.viz.gpus` plans one model on each GPU people rent and compares them;
* :mod:`~workbench.viz.explorer`: an ipywidgets panel that re-plans as its controls move;
* :mod:`~workbench.viz.lessons`: the numbers the teaching notebooks' text prints and asserts;
  :mod:`~workbench.viz.notebook`: the helpers their cells call (small chains, three schedules side by side);
* :mod:`~workbench.viz.export`: figures to offline HTML and PNG/SVG/PDF.
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
