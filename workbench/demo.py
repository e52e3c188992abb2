"""``make demo``: the main job without a browser.

For every bundled profile: a summary, plans by several methods on 4 devices
at a memory limit that binds, each plan re-checked against the rules,
simulated, and drawn; writes ``report.md``, one Gantt HTML per profile and
``plans/*.json`` under ``--out``.

>>> from workbench.demo import demo_memory_limit  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from .chain import Chain, Platform
from .io import write_text_atomic
from .plan import Plan
from .units import format_bytes, format_seconds

__all__ = ["run_demo", "demo_command", "demo_memory_limit", "DEMO_METHODS"]

DEMO_METHODS = ("dp", "pipedream", "uniform", "1f1b", "gpipe")


def demo_memory_limit(chain: Chain, platform: Platform) -> float:
    """A limit that binds: halfway between the least memory any contiguous plan needs and what dp uses unconstrained."""
    from .planners import plan as run_planner
    from .planners.dp import least_memory

    peak = run_planner(chain, platform.with_(memory=math.inf), "dp").peak_memory
    return (least_memory(chain, platform)[0] + peak) / 2


def run_demo(out: Path, devices: int = 4, profiles: list[str] | None = None, methods=DEMO_METHODS) -> Path:
    """Run the demo into ``out``; returns the report's path."""
    from .check import check
    from .planners import plan as run_planner
    from .profiles import available_profiles, load_profile
    from .simulate import simulate
    from .viz.export import save_html
    from .viz.gantt import gantt

    out.mkdir(parents=True, exist_ok=True)
    names = profiles or [n for n in available_profiles() if "/" not in n]  # the CPU-made bundled ones
    if not names:
        raise ValueError("no bundled profiles in data/profiles")
    lines = ["# Workbench demo", "", f"{devices} devices, 12 GB/s links, PipeDream weight stashing.", ""]
    t0 = time.perf_counter()
    for name in names:
        chain = load_profile(name)
        base = Platform(devices, bandwidth="12GB/s")
        limit = demo_memory_limit(chain, base)
        platform = base.with_(memory=limit)
        lines += [f"## {name}", "", chain.summary(), "",
                  f"Memory limit: {format_bytes(limit)} per device (binding for the DP's unconstrained plan).", "",
                  "| method | status | period | ratio to bound | peak memory | fits | valid | solve time |",
                  "|---|---|---|---|---|---|---|---|"]
        best: Plan | None = None
        for method in methods:
            plan = run_planner(chain, platform, method)
            valid = "n/a (flushed)" if plan.schedule != "periodic" else ("yes" if plan.feasible and not check(plan, chain, platform) else "NO")
            if not plan.feasible:
                valid = "-"
            lines.append(
                f"| {method} | {plan.status} | {format_seconds(plan.period)} | {plan.ratio_to_bound():.3f} | "
                f"{format_bytes(plan.peak_memory)} | {'yes' if plan.fits else 'no'} | {valid} | {plan.solve_seconds:.3f} s |"
            )
            plan.to_json(out / "plans" / f"{name}-{method}.json")
            if plan.schedule == "periodic" and plan.fits and (best is None or plan.period < best.period):
                best = plan
        if best is not None:
            trace = simulate(best, chain, platform, batches=4 * devices)
            fig = gantt(trace, title=f"{name}: {best.method}, period {format_seconds(best.period)}")
            html = out / f"{name}-gantt.html"
            save_html(fig, html)
            lines += ["", f"Best periodic plan: **{best.method}**, period {format_seconds(best.period)}; "
                      f"Gantt chart: [{html.name}]({html.name})"]
        lines.append("")
    lines.append(f"_Made in {time.perf_counter() - t0:.1f} s by `python -m workbench demo`._")
    report = out / "report.md"
    write_text_atomic(report, "\n".join(lines) + "\n")
    return report


def demo_command(args: argparse.Namespace) -> int:
    report = run_demo(Path(args.out))
    print(report.read_text())
    print(f"wrote {report}")
    return 0
