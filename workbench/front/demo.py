"""``make demo``: the main job without a browser.

For every bundled profile: a summary, plans by several methods on 4 devices
at a memory limit that binds, each plan re-checked against the rules,
simulated, and drawn; writes ``report.md``, one Gantt HTML per profile and
``plans/*.json`` under ``--out``.

Each method's row has one *result* (:func:`plan_result`), so that a plan
that does not fit never looks usable:

* ``optimal``: fits, passes the checker, and its method proves it the best
  of the plans it searches (dp: every contiguous *periodic* plan);
* ``fits``: fits and passes the checker (flushed schedules: their simulated
  peak fits), no proof of optimality;
* ``over the limit``: a plan, but a device needs more memory than the limit;
* ``invalid``: fits, but breaks another rule of docs/model.md (a bug);
* ``no plan``: the method found none under this limit.

>>> from workbench.model.plan import Plan
>>> plan_result(Plan(period=float("inf"), assignment=(0,), stages=(), devices=1, status="infeasible"), None, None)
('no plan', '')
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from workbench.io import remove_orphans, write_text_atomic
from workbench.methods import lineup
from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.training_setup import DEFAULT_BANDWIDTH
from workbench.model.units import format_bytes, format_seconds
from workbench.schedules.registry import schedule_of

__all__ = ["run_demo", "demo_command", "demo_memory_limit", "plan_result", "DEMO_METHODS", "LEGEND"]

#: the methods the demo runs (the registry's line-up, :data:`workbench.methods.LINEUPS`)
DEMO_METHODS = tuple(name for name, _ in lineup("demo"))

LEGEND = """How to read the tables:

- **family**: *periodic* plans run one forward and one backward of different mini-batches per device per period,
  keeping one weight version per mini-batch in flight (PipeDream's weight stashing). *Flushed* schedules
  (GPipe, 1F1B, and torch's multi-stage schedules: interleaved 1F1B, zero bubble, ZB-V, DualPipeV, with several
  stages per device) run m micro-batches, then flush: one weight version, no stashing, memory simulated. The two
  are separate families and `optimal` never compares across them: a flushed schedule can be faster than the
  optimal periodic plan (1F1B often is), and needs another amount of memory (GPipe keeps every micro-batch's
  activations). The best plan named under each table is the fastest that fits, whatever its family.
- **result**: `optimal` = fits, passes the checker, and the method proves it the best plan of those it searches
  (dp: the best *contiguous periodic* plan under the limit; a general allocation or a flushed schedule may still be
  faster); `fits` = fits and passes the checker, no proof; `over the limit` = some device needs more memory than
  the limit, so the plan cannot run here; `invalid` = breaks another rule of docs/model.md; `no plan` = the method
  found none.
- **ratio to bound**: period / lower bound, where the lower bound max(sum of compute / P, largest layer's
  compute) holds for every plan of either family; 1.000 means no plan can be faster, and an optimal plan can be
  above 1 when memory or transfers make the bound unreachable.
- **peak memory**: the most any one device holds, by the memory model of docs/model.md ("Memory": parameters,
  gradients, Adam's state, stashed versions, activations, the largest transient; periodic: its peak over the
  period; flushed: the simulated peak).
"""


def demo_memory_limit(chain: Chain, platform: Target) -> float:
    """A limit that binds: halfway between the least memory any contiguous plan needs and what dp uses unconstrained."""
    from workbench.planners import plan as run_planner
    from workbench.planners.dp.contiguous import least_contiguous_memory

    peak = run_planner(chain, platform.with_(memory=math.inf), "dp").peak_memory
    return (least_contiguous_memory(chain, platform)[0] + peak) / 2


def plan_result(plan: Plan, chain: Chain | None, platform: Target | None) -> tuple[str, str]:
    """The plan's one-word result (see the module docstring) and, for ``over the limit``/``invalid``, why."""
    if not plan.feasible:
        return "no plan", ""
    if not plan.fits:
        over = plan.peak_memory - plan.memory_limit
        return "over the limit", f"peak {format_bytes(plan.peak_memory)}, {format_bytes(over)} over"
    from workbench.verify.check import check

    problems = check(plan, chain, platform)      # flushed schedules are replayed (layout, order, period, memory)
    if problems:
        return "invalid", str(problems[0])
    return ("optimal" if plan.status == "optimal" else "fits"), ""


def _row(method: str, plan: Plan, result: str, why: str) -> str:
    usable = plan.feasible
    family = f"flushed ({plan.schedule})" if schedule_of(plan.schedule).flushed else "periodic"
    cells = [method, family, result + (f" ({why})" if why else ""),
             format_seconds(plan.period) if usable else "-",
             f"{plan.ratio_to_bound():.3f}" if usable else "-",
             format_bytes(plan.peak_memory) if usable else "-", f"{plan.solve_seconds:.3f} s"]
    return "| " + " | ".join(cells) + " |"


def _profile_section(name: str, chain: Chain, devices: int, methods, out: Path) -> list[str]:
    from workbench.planners import plan as run_planner
    from workbench.schedules.simulate import simulate
    from workbench.viz.export import save_html
    from workbench.viz.gantt import gantt

    base = Target.of(devices, bandwidth=DEFAULT_BANDWIDTH)
    limit = demo_memory_limit(chain, base)
    platform = base.with_(memory=limit)
    lines = [f"## {name}", "", chain.summary(), "",
             f"Memory limit: {format_bytes(limit)} per device (binding for the DP's unconstrained plan).", "",
             "| method | family | result | period | ratio to bound | peak memory | solve time |",
             "|---|---|---|---|---|---|---|"]
    usable: dict[str, Plan] = {}
    for method in methods:
        plan = run_planner(chain, platform, method)
        result, why = plan_result(plan, chain, platform)
        lines.append(_row(method, plan, result, why))
        plan.to_json(out / "plans" / f"{name.replace('/', '-')}-{method}.json")
        if result in ("optimal", "fits"):
            usable[method] = plan
    if not usable:
        return lines + ["", "No plan of any method fits this limit.", ""]
    m, best = min(usable.items(), key=lambda kv: kv[1].period)
    fig = gantt(simulate(best, chain, platform, batches=4 * devices),
                title=f"{name}: {best.method}, period {format_seconds(best.period)}")
    html = out / f"{name.replace('/', '-')}-gantt.html"
    save_html(fig, html)
    lines += ["", f"Best plan that fits, across families: **{m}** ({_family(best)}), period "
                  f"{format_seconds(best.period)}, peak {format_bytes(best.peak_memory)}; Gantt chart: "
                  f"[{html.name}]({html.name})"]
    periodic = {k: p for k, p in usable.items() if not schedule_of(p.schedule).flushed}
    if schedule_of(best.schedule).flushed and periodic:
        k, p = min(periodic.items(), key=lambda kv: kv[1].period)
        lines.append(f"\nThe fastest periodic plan, **{k}**, takes {format_seconds(p.period)} "
                     f"({p.period / best.period:.3g}x), peak {format_bytes(p.peak_memory)}: another family, see the "
                     "legend.")
    return lines + [""]


def _family(plan: Plan) -> str:
    return f"flushed, {plan.schedule}" if schedule_of(plan.schedule).flushed else "periodic"


def run_demo(out: Path, devices: int = 4, profiles: list[str] | None = None, methods=DEMO_METHODS) -> Path:
    """Run the demo into ``out``; returns the report's path."""
    from workbench.profiles import available_profiles, load_profile

    out.mkdir(parents=True, exist_ok=True)
    remove_orphans(out)
    names = profiles or [n for n in available_profiles() if "/" not in n]  # the CPU-made bundled ones
    if not names:
        raise ValueError("no bundled profiles in data/profiles")
    lines = ["# Workbench demo", "",
             f"{devices} devices, 12 GB/s links, PipeDream weight stashing, Adam in fp32 (memory: docs/model.md).", "",
             LEGEND]
    t0 = time.perf_counter()
    for name in names:
        lines += _profile_section(name, load_profile(name), devices, methods, out)
    lines.append(f"_Made in {time.perf_counter() - t0:.1f} s by `python -m workbench demo`._")
    report = out / "report.md"
    write_text_atomic(report, "\n".join(lines) + "\n")
    return report


def demo_command(args: argparse.Namespace) -> int:
    report = run_demo(Path(args.out))
    print(report.read_text())
    print(f"wrote {report}")
    return 0
