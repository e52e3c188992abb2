"""``python -m workbench reproduce``: run the units, check them, have :mod:`workbench.experiments.figures` draw the
figures, write everything and ``report.md`` (the steps are in :mod:`workbench.experiments`).

>>> render_report(Report(out=Path("out"), settings=settings_for(quick=True, networks=()))).splitlines()[0]
'# Experiments: pipelined model parallelism under memory limits'
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from workbench.experiments.analyses import bound_violations, sweep_table
from workbench.experiments.cache import read_unit, store_unit
from workbench.experiments.executors import Executor, run_units
from workbench.experiments.provenance import code_version, versions
from workbench.experiments.settings import COMPLEXITY_FIGURES, FIGURES, SWEEP_FIGURES, Settings, settings_for
from workbench.experiments.units import Unit, plan_units
from workbench.io import folder_lock, remove_orphans, write_frame_atomic, write_text_atomic
from workbench.paths import RESULTS_DIR
from workbench.planners.budget import MAY_VARY

if TYPE_CHECKING:  # the figures are drawn by workbench.viz, which reads this package's analyses
    from workbench.experiments.figures import FigureInfo

__all__ = ["Report", "QUICK_OUT", "reproduce", "notebook_report", "render_report"]

#: where ``reproduce --quick`` writes without ``--out`` (relative to the working folder; never ``data/results``)
QUICK_OUT = Path("build") / "reproduce-quick"


@dataclass
class Report:
    """What :func:`reproduce` did, found and wrote."""

    out: Path
    settings: Settings
    figures: list[FigureInfo] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # loaded from the cache
    missing: list[str] = field(default_factory=list)  # not current and not computed (compute=False, or not asked for)
    stale: dict[str, str] = field(default_factory=dict)  # recomputed units that were on disk: why
    left_out: dict[str, str] = field(default_factory=dict)  # units the figures leave out: why
    violations: list[str] = field(default_factory=list)
    checked_groups: int = 0  # (network, P) groups the checks ran on
    warnings: list[str] = field(default_factory=list)
    sweeps: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    profiles: dict[str, dict] = field(default_factory=dict)  # network -> {"file", "sha256"}
    seconds: float = 0.0
    png: bool = True
    executor: str = "serial"  # where the units ran (Executor.describe)

    @property
    def report_path(self) -> Path:
        return Path(self.out) / "report.md"


def _parse_only(only: str | None) -> tuple[str, ...]:
    if not only:
        return FIGURES
    names = tuple(n.strip() for n in only.split(",") if n.strip())
    bad = [n for n in names if n not in FIGURES]
    if bad:
        raise ValueError(f"unknown figure(s) {bad}; choose from {', '.join(FIGURES)}")
    return names


def _run_units(todo: list[Unit], out: Path, executor: Executor, report: Report, total: int, progress: bool) -> None:
    """Run ``todo`` on ``executor``; store each unit here as it comes back (one writer, under the lock)."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc="reproduce", unit="unit",
                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
    try:
        for done in run_units(todo, executor):
            store_unit(done.unit, out, done.text, seconds=done.seconds, host=done.host)
            report.computed.append(done.unit.name)
            if bar is not None:
                bar.set_postfix_str(done.unit.name[-40:])
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def _load_all(units: list[Unit], out: Path, report: Report) -> dict[str, pd.DataFrame]:
    """Every unit's frame as the figures will use it; the others go to ``report.left_out`` with the reason."""
    frames = {}
    for u in units:
        df, why = read_unit(u, out)
        if df is None:
            report.left_out[u.name] = why
        else:
            frames[u.name] = df
    return frames


def _figures(units: list[Unit], frames: dict[str, pd.DataFrame], figs: tuple[str, ...], report: Report) -> None:
    from workbench.experiments import figures as R
    from workbench.experiments.schedules import schedules_figure

    sweep_units = [u for u in units if u.kind == "sweep" and u.name in frames]
    if sweep_units:
        sw = sweep_table((u, frames[u.name]) for u in sweep_units)
        report.sweeps = sw
        report.violations = bound_violations(sw)
        report.checked_groups = int(sw.groupby(["network", "devices"]).ngroups)
        makers = {"throughput": R.throughput_figure, "memory": R.memory_figure, "min_memory": R.min_memory_figure,
                  "solve_times": R.solve_times_figure, "schedules": schedules_figure}
        report.figures += [makers[n](sw) for n in SWEEP_FIGURES if n in figs]
    comp = {"three_partition": R.three_partition_figure, "family": R.family_figure, "gains": R.gains_figure,
            "scaling": R.scaling_figure, "largest": R.largest_figure}
    for name in COMPLEXITY_FIGURES:
        if name in figs:
            parts = [frames[u.name] for u in units if u.kind == name and u.name in frames]
            if parts:
                report.figures.append(comp[name](pd.concat(parts, ignore_index=True)))


def _write_outputs(report: Report, png: bool) -> None:
    from workbench.viz.export import save_html, save_images

    out = Path(report.out)
    pngs = []
    for info in report.figures:
        for name, table in info.tables.items():
            write_frame_atomic(out / name, table)
            info.files.append(name)
        for stem, fig in zip(info.stems, info.figs):
            save_html(fig, out / f"{stem}.html", include_plotlyjs="directory")
            info.files.append(f"{stem}.html")
            fig.layout.height = fig.layout.height or 600
            pngs.append((fig, out / f"{stem}.png", info))
    report.png = bool(png) and os.environ.get("WORKBENCH_NO_PNG", "") not in ("1", "true", "yes")
    if not report.png or not pngs:
        return
    try:
        save_images([(f, p) for f, p, _ in pngs], width=1100)
        for _, p, info in pngs:
            info.files.append(p.name)
    except Exception as e:  # noqa: BLE001 - no Chromium, no kaleido: HTML is still there
        msg = (f"PNG export skipped ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
               "install Chromium (`make chromium`) to get PNGs; HTML and CSV are complete")
        warnings.warn(msg)
        report.warnings.append(msg)
        report.png = False


def reproduce(quick: bool = False, only: str | None = None, out: Path | str | None = None, *,
              settings: Settings | None = None, jobs: int | None = None, executor: Executor | None = None,
              progress: bool = True, png: bool = True, compute: bool = True, write: bool = True,
              wait: float = 0.0, others: bool = False) -> Report:
    """Recompute (or load) every unit the figures need, check them, then write the figures and ``report.md``.

    ``out``: default ``data/results`` for the full settings, :data:`QUICK_OUT` (under ``build/``) for the
    quick ones. ``settings`` overrides :func:`settings_for` (tests use tiny ones); ``executor`` runs
    the units (:mod:`workbench.experiments.executors`; default serial, or ``jobs`` local processes:
    ``$WORKBENCH_JOBS``); ``png=False`` skips the PNG export
    (as does ``$WORKBENCH_NO_PNG=1``). ``compute=False`` computes nothing: the figures show the
    units already on disk that are current. ``write=False`` writes nothing and takes no lock
    (the notebooks reading ``data/results``). ``wait``: seconds to wait for another run's lock
    on ``out`` before giving up with :class:`~workbench.io.FolderBusy`. ``others``: with ``only``, still show
    every other figure, from its units on disk that are current (computing none of them), so that
    ``report.md`` describes every figure (the command line's ``--only``).
    """
    t0 = time.perf_counter()
    out = Path(out) if out is not None else (QUICK_OUT if quick else RESULTS_DIR)
    s = settings or settings_for(quick)
    figs = _parse_only(only)
    shown = FIGURES if others else figs
    if executor is None:
        jobs = int(jobs if jobs is not None else os.environ.get("WORKBENCH_JOBS", "1") or 1)
        executor = Executor("processes", workers=jobs) if jobs > 1 else Executor()
    report = Report(out=out, settings=s, executor=executor.describe())
    lock = folder_lock(out, what="reproduce", wait=wait) if write else contextlib.nullcontext()
    with lock:
        if write:
            report.warnings += [f"removed {p.relative_to(out)}, left by a killed run" for p in remove_orphans(out)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            units = plan_units(s, shown)
            asked = {u.name for u in plan_units(s, figs)} if shown != figs else {u.name for u in units}
        report.warnings += [str(w.message) for w in caught]
        report.profiles = {u.settings["network"]: u.settings["profile"] for u in units if u.kind == "sweep"}
        state = {u.name: read_unit(u, out)[1] for u in units}
        todo = [u for u in units if state[u.name] and u.name in asked] if compute else []
        report.skipped = [u.name for u in units if not state[u.name]]
        queued = {u.name for u in todo}
        report.missing = [u.name for u in units if state[u.name] and u.name not in queued]
        report.stale = {u.name: state[u.name] for u in todo if state[u.name] != "not computed yet"}
        _run_units(todo, out, executor, report, len(units), progress)
        _figures(units, _load_all(units, out, report), shown, report)
        report.seconds = time.perf_counter() - t0
        if write:
            _write_outputs(report, png)
            write_text_atomic(report.report_path, render_report(report))
    return report


def notebook_report(only: str | None = None, *, quick: bool | None = None, out: Path | str | None = None) -> Report:
    """For the notebooks: the figures of ``only``, from cached results or a small quick run.

    ``quick`` (default: ``$WORKBENCH_QUICK`` is set) computes a reduced quick
    setting (one network, P = 2, a small complexity study) into ``out``
    (default a temporary folder), without PNGs. Otherwise it reads the units
    in ``out`` (default ``data/results``) that are current for the full
    settings, computes and writes nothing; run ``python -m workbench reproduce`` to fill them.
    """
    if quick is None:
        quick = os.environ.get("WORKBENCH_QUICK", "") not in ("", "0", "false", "no")
    if quick:
        import tempfile

        base = settings_for(quick=True)
        s = base.with_(networks=base.networks[:1], devices=(2,), scaling_layers=(4, 6), gain_instances=6,
                       gain_layers=5)
        out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="workbench-nb-"))
        return reproduce(True, only, out, settings=s, progress=False, png=False)
    return reproduce(False, only, out, progress=False, png=False, compute=False, write=False)


def _checks_section(report: Report) -> list[str]:
    if report.violations:
        return [f"## CHECKS FAILED ({len(report.violations)})", "",
                "**Do not use these figures as they are.** Each line is a check that does not hold "
                "(see `workbench.sweeps.bound_violations`):", ""] + [f"- {b}" for b in report.violations] + [""]
    if not report.checked_groups:
        return ["No sweep results, so the checks did not run.", ""]
    return [f"All checks pass on the {report.checked_groups} (network, P) groups: within each group every method ran "
            "on the same profile file, by the same code version, with the same lower bound and memory levels; no plan "
            "beats the lower bound; general ILP >= contiguous ILP where both are optimal; an optimal ILP >= every "
            "periodic baseline that fits; exact methods never lose from more memory.", ""]


#: the note column keeps 300 characters, so MAY_VARY (what a plan's note says when the wall-clock safety net
#: stopped one of its deterministic phases, planners.budget) may be cut: its first words are matched
NOTE_CHARS = 300


def _reproducibility_section(report: Report) -> list[str]:
    """What a rerun may change: plans cut short by the wall clock, and everything timed by it.

    >>> r = Report(Path("."), Settings(networks=("n",)), sweeps=pd.DataFrame({"note": ["ok", MAY_VARY[:30]],
    ...            "network": ["n", "n"], "devices": [2, 2], "method_key": ["ilp-general"] * 2, "level": [0, 1]}))
    >>> text = _reproducibility_section(r)[0]
    >>> "1 of the 2 sweep plans" in text, text.split(": ")[-1].split(".")[0]
    (True, 'n P=2 ilp-general level 1')
    >>> r.sweeps["may_vary"] = [True, False]        # the column, where the results have it, is what counts
    >>> _reproducibility_section(r)[0].split(": ")[-1].split(".")[0]
    'n P=2 ilp-general level 0'
    """
    sw = report.sweeps
    notes = sw["note"].astype(str) if "note" in sw else pd.Series([""] * len(sw), index=sw.index)
    if "may_vary" in sw:             # recorded per plan: exact
        shown = sw["may_vary"].fillna(False).astype(bool)
        cut = 0
    else:                            # results made before the column: the note's first words, a lower bound
        shown = notes.str.contains(MAY_VARY[:21], regex=False)
        cut = int(((notes.str.len() >= NOTE_CHARS) & ~shown).sum())
    varied = sw[shown]
    cases = "; ".join(f"{r.network} P={r.devices} {r.method_key} level {r.level}" for r in varied.itertuples())
    bound = (f" (a lower bound: {cut} notes are cut at {NOTE_CHARS} characters and may hide it)" if cut else "")
    least = "At least " if cut else ""
    where = (f"{least}{len(varied)} of the {len(sw)} sweep plans had a phase stopped by the wall-clock safety net "
             f"(3x its share plus 2 s: the machine was slower than the work budgets assume){bound}, so a rerun may "
             f"plan those differently: {cases}." if len(varied)
             else f"None of the {len(sw)} sweep plans shows a phase stopped by the wall-clock safety net{bound}.")
    return [f"Reproducibility: the sweeps plan with work budgets (`deterministic=True`), so a rerun gives the same "
            f"plans where no phase was stopped by the clock. {where} Solve seconds are wall-clock and differ between "
            "runs; the complexity studies (3-PARTITION, family, gains, scaling) and `largest` give each solve a "
            "wall-clock limit, so a solve that times out there may end on another plan (time-outs are marked).", ""]


def _inputs_section(report: Report) -> list[str]:
    lines = [f"Model code version `{code_version()}` (a hash of the code that computes results, "
             "`workbench.experiments.provenance.code_version`); profiles:", ""]
    lines += [f"- `{net}`: `{p['file']}`, SHA-256 `{p['sha256'][:16]}`" for net, p in report.profiles.items()]
    return lines + [""]


def _units_section(report: Report) -> list[str]:
    lines = []
    if report.stale:
        lines += [f"Recomputed {len(report.stale)} unit(s) whose cached result was out of date:", ""]
        lines += [f"- `{n}`: {why}" for n, why in sorted(report.stale.items())] + [""]
    if report.left_out:
        total = len(report.left_out) + len(report.skipped) + len(report.computed) - \
            len(set(report.left_out) & (set(report.skipped) | set(report.computed)))
        lines += [f"**Partial results**: {len(report.left_out)} of {total} units are left out of the figures below. "
                  "Run `python -m workbench reproduce` to compute them (it resumes where it stopped):", ""]
        lines += [f"- `{n}`: {why}" for n, why in sorted(report.left_out.items())] + [""]
    return lines


def render_report(report: Report) -> str:
    """``report.md``: how it was made, the checks (failures first), the inputs, the units, then each figure."""
    s = report.settings
    v = versions()
    lines = [
        "# Experiments: pipelined model parallelism under memory limits", "",
        f"Made by `python -m workbench reproduce{' --quick' if s.quick else ''}` on {v['date']} "
        f"(workbench {v['workbench']}, git {v['git']}, pyomo {v['pyomo']}, highspy {v['highspy']}, host {v['host']}); "
        f"{len(report.computed)} units computed ({report.executor}), {len(report.skipped)} loaded from cache, "
        f"{report.seconds:.0f} s.", "",
    ]
    lines += _checks_section(report)
    lines += [
        f"Settings: networks {', '.join(s.networks)}; P in {list(s.devices)}; {s.n_levels} memory levels from the "
        f"least feasible (contiguous) to unlimited; ILP time limit {s.time_limit:g} s per contiguous and "
        f"{s.general_time_limit:g} s per general solve (networks over 32 layers are solved on 32 blocks, see "
        f"workbench.planners.ilp.coarsen); bandwidth "
        f"{s.bandwidth}, weight factor {s.weight_factor:g}, weights {s.weights}. Complexity: scaling L in "
        f"{list(s.scaling_layers)}, P in {list(s.scaling_devices)}, time limit {s.scaling_time_limit:g} s; "
        f"{s.gain_instances} random instances of {s.gain_layers} layers on {s.gain_devices} devices for the gains.", "",
    ]
    lines += _reproducibility_section(report) if report.checked_groups else []
    lines += _inputs_section(report)
    lines += ["Per-unit results (one CSV per unit with a JSON sidecar: its key, versions, checksum) are in `units/`; a "
              "unit is reused only while its key (settings, profile SHA-256, code version) is unchanged.", ""]
    lines += _units_section(report)
    lines += [f"> warning: {w}\n" for w in report.warnings]
    for f in report.figures:
        lines += [f"## {f.name}: {f.title}", "", "Files: " + ", ".join(f"`{x}`" for x in f.files), ""]
        lines += [f"- {h}" for h in f.headlines] + [""]
    return "\n".join(lines)
