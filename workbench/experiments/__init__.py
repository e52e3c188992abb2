"""Paper-style experiments: resumable sweeps, cached results, figures, checks and a report (one command).

The package, one module per step: :mod:`~workbench.experiments.settings`
(what the user chooses), :mod:`~workbench.experiments.units` (the units of
work and their keys), :mod:`~workbench.experiments.cache` (finished units on
disk), :mod:`~workbench.experiments.sweeps` (what a unit computes),
:mod:`~workbench.experiments.analyses` (tables and checks over the results)
and :mod:`~workbench.experiments.report` (the run and ``report.md``; its command-line handler is
:mod:`workbench.front.studies`). The studies beside them: :mod:`~workbench.experiments.complexity`,
:mod:`~workbench.experiments.largest`, :mod:`~workbench.experiments.schedules` (which schedule wins at
which memory), the figures (:mod:`~workbench.experiments.figures`) and what made a
result (:mod:`~workbench.experiments.provenance`).

``python -m workbench reproduce [--quick] [--only NAME] [--out DIR]`` runs
:func:`reproduce` (into ``data/results``; with ``--quick`` into ``build/reproduce-quick``):

1. it locks ``OUT`` (a second run into the same folder is refused, naming
   the first one's pid) and removes temporary files a killed run left;
2. it plans the units of work (:mod:`~workbench.experiments.units`) and
   recomputes (:mod:`~workbench.experiments.sweeps`) every unit that is missing
   or stale in the cache (:mod:`~workbench.experiments.cache`): its key
   (settings, the profile's SHA-256, the model code's version) differs from
   the one on disk, or its CSV does not match its checksum. The report says
   which units were recomputed and why;
3. it has :mod:`workbench.experiments.figures` draw the figures from the units,
   listing every unit it leaves out and why, and runs the checks
   (:func:`~workbench.experiments.analyses.bound_violations`): one profile, one code version
   and one lower bound per (network, P) group, and the bounds. A failed
   check is at the top of ``OUT/report.md`` and makes the command exit 1;
4. it writes tidy CSV tables, HTML (plotly, offline) and PNG (kaleido;
   skipped with a warning when no browser is available), every file atomically.

Figures (names for ``--only``, comma-separated): ``throughput``, ``memory``,
``min_memory``, ``solve_times`` (from the sweeps), ``three_partition``,
``family``, ``scaling``, ``gains`` (the complexity study), ``largest`` (the
largest GPT each method fits, :mod:`workbench.experiments.largest`). ``--only`` recomputes
those figures' units alone; ``report.md`` still shows every figure, the others from their units
on disk that are current (``reproduce(..., others=True)``).

Where the units run: :mod:`~workbench.experiments.executors` (``--executor serial|processes|dask``,
``--workers N``, ``--scheduler ADDRESS``); the results are the same whichever runs them.

Environment: ``WORKBENCH_JOBS`` (worker processes for the units, default 1),
``WORKBENCH_QUICK=1`` (notebooks: the quick settings), ``WORKBENCH_NO_PNG=1``.

>>> sorted(FIGURES)[:4]
['family', 'gains', 'largest', 'memory']
>>> settings_for(quick=True).devices
(2, 4)
"""

from __future__ import annotations

from workbench.experiments.analyses import (
    bound_violations,
    consistency_violations,
    headline_gains,
    min_memory_table,
    sweep_frame,
    sweep_table,
)
from workbench.experiments.cache import load_unit, read_unit, run_unit, unit_is_current
from workbench.experiments.provenance import versions
from workbench.experiments.report import Report, notebook_report, render_report, reproduce
from workbench.experiments.settings import (
    COMPLEXITY_FIGURES,
    FIGURES,
    METHOD_KEYS,
    METHOD_LABELS,
    SWEEP_FIGURES,
    Settings,
    settings_for,
)
from workbench.experiments.sweeps import compute_unit
from workbench.experiments.units import Unit, plan_units, profile_key, slug
from workbench.io import FolderBusy

__all__ = [
    "Settings", "Report", "Unit", "METHOD_KEYS", "METHOD_LABELS", "FIGURES", "SWEEP_FIGURES", "COMPLEXITY_FIGURES",
    "settings_for", "plan_units", "profile_key", "slug", "compute_unit", "run_unit", "load_unit", "read_unit",
    "unit_is_current", "reproduce", "sweep_frame", "sweep_table", "min_memory_table",
    "bound_violations", "consistency_violations", "headline_gains", "versions", "notebook_report", "render_report",
    "FolderBusy",
]
