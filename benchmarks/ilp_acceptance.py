"""Issue 4's acceptance sweep: the ILP against every baseline on the peer profiles.

    .venv/bin/python benchmarks/ilp_acceptance.py [--profiles alexnet,vgg16] [--devices 2,4,8]
        [--levels 4] [--time-limit 20] [--contiguous-time-limit SECONDS]
        [--bandwidth 12GB/s] [--csv data/results/ilp_acceptance.csv] [--quick]

For every peer profile (``available_profiles()`` names starting with
``pipedream/``), every P in ``--devices`` and every memory limit in
``memory_levels(chain, platform, n)`` (least feasible contiguous memory to the
peak of the unconstrained DP plan) plus "unlimited", it runs

* the ILP, contiguous and general (``--time-limit`` each; chains longer than
  32 layers are coarsened by the ILP itself), and checks every plan it returns
  with :func:`workbench.verify.check.check` (a failure is a bug and is reported);
* the periodic baselines ``dp``, ``pipedream``, ``uniform``, ``parameters``,
  ``torchgpipe`` (PipeDream-style weight stashing, the same memory model as
  the ILP);
* the flushed baselines ``gpipe`` and ``1f1b`` (one weight version, a
  different memory model: reported separately, never part of the verdict).

Per (profile, P, level) it prints the ILP's throughput, status and gap, each
baseline's throughput with ``*`` where it does not fit, and the verdicts:

* ``ok``: best ILP throughput >= every periodic baseline that fits (relative
  tolerance 1e-6); ``ok_c``/``ok_g`` the same for each ILP mode alone;
* ``ilp_only``: the ILP finds a plan and PipeDream's partitioner none;
* ``flush_wins``: a flushed plan that fits beats the ILP (allowed: another
  memory model, one weight version);
* ``reordered``: baselines whose plan uses another topological order of the
  layers than the profile's (``dp`` plans on the model's graph and may pick
  one): a different chain from the one the ILP plans, so such a baseline can
  beat the contiguous ILP without a bug.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.experiments.complexity import memory_levels  # noqa: E402
from workbench.io import write_frame_atomic  # noqa: E402
from workbench.methods import names  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.planners import plan as run_planner  # noqa: E402
from workbench.planners.ilp.planner import plan_ilp  # noqa: E402
from workbench.profiles import available_profiles, load_profile  # noqa: E402
from workbench.verify.check import check  # noqa: E402

PERIODIC = names(baseline=True)  # the checked periodic baselines (workbench.methods)
FLUSHED = names(family="flushed")
TOL = 1e-6


def _tp(p) -> float:
    return p.throughput if p.feasible else 0.0


def run_cell(chain, plat: Target, *, time_limit: float, contiguous_time_limit: float) -> dict:
    """One (profile, P, memory level) cell: the two ILPs, the baselines, the verdicts."""
    row: dict = {}
    ilp = {}
    for alloc, tl in (("contiguous", contiguous_time_limit), ("general", time_limit)):
        t0 = time.perf_counter()
        try:
            p = plan_ilp(chain, plat, allocation=alloc, time_limit=tl)
            err = ""
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, keep the sweep going
            p, err = None, f"{type(exc).__name__}: {exc}"
        key = "ilp_c" if alloc == "contiguous" else "ilp_g"
        row[f"{key}_seconds"] = round(time.perf_counter() - t0, 2)
        if p is None:
            row.update({f"{key}_status": "error", f"{key}_tp": 0.0, f"{key}_gap": None, f"{key}_valid": False,
                        f"{key}_error": err})
            ilp[alloc] = 0.0
            continue
        bad = check(p, chain, plat) if p.feasible else []
        fits = p.fits if p.feasible else False
        row.update({f"{key}_status": p.status, f"{key}_tp": _tp(p), f"{key}_gap": p.gap,
                    f"{key}_valid": (not bad) and (fits or not p.feasible),
                    f"{key}_error": str(bad[0]) if bad else ""})
        ilp[alloc] = _tp(p) if not bad else 0.0
    best = max(ilp.values())
    row["ilp_tp"] = best
    reordered: list[str] = []
    for m in PERIODIC + FLUSHED:
        t0 = time.perf_counter()
        p = run_planner(chain, plat, m)
        row[f"{m}_tp"] = _tp(p)
        row[f"{m}_fits"] = bool(p.feasible and p.fits)
        row[f"{m}_seconds"] = round(time.perf_counter() - t0, 2)
        if p.chain_order is not None and tuple(p.chain_order) != tuple(layer.name for layer in chain.layers):
            reordered.append(m)
    row["reordered"] = ",".join(reordered)
    fitting = [m for m in PERIODIC if row[f"{m}_fits"]]
    top = max((row[f"{m}_tp"] for m in fitting), default=0.0)
    row["best_periodic"] = top
    row["best_periodic_method"] = max(fitting, key=lambda m: row[f"{m}_tp"]) if fitting else ""
    for tag, val in (("ok", best), ("ok_c", ilp["contiguous"]), ("ok_g", ilp["general"])):
        row[tag] = val >= top * (1 - TOL)
    row["ilp_only"] = best > 0 and not row["pipedream_fits"]
    flush = [m for m in FLUSHED if row[f"{m}_fits"] and row[f"{m}_tp"] > best * (1 + TOL)]
    row["flush_wins"] = ",".join(flush)
    row["ilp_general_gain"] = (ilp["general"] / ilp["contiguous"] - 1) if ilp["contiguous"] > 0 else None
    return row


def _fmt_tp(tp: float, fits: bool | None = None) -> str:
    if tp <= 0:
        return "-"
    return f"{tp:.3f}" + ("" if fits in (None, True) else "*")


def print_table(df: pd.DataFrame) -> None:
    cols = ["mem", "ilp_c", "st_c", "gap_c", "ilp_g", "st_g", "gap_g"] + list(PERIODIC) + list(FLUSHED) + \
        ["ok", "ilp_only", "flush_wins"]
    out = []
    for _, r in df.iterrows():
        g = lambda x: "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"  # noqa: E731
        out.append([("inf" if not math.isfinite(r["memory"]) else f"{r['memory'] / 2**30:.3f}G"),
                    _fmt_tp(r["ilp_c_tp"]), r["ilp_c_status"], g(r["ilp_c_gap"]),
                    _fmt_tp(r["ilp_g_tp"]), r["ilp_g_status"], g(r["ilp_g_gap"])]
                   + [_fmt_tp(r[f"{m}_tp"], r[f"{m}_fits"]) for m in PERIODIC + FLUSHED]
                   + ["yes" if r["ok"] else "NO", "yes" if r["ilp_only"] else "", r["flush_wins"]])
    print(pd.DataFrame(out, columns=cols).to_string(index=False))


def summarize(df: pd.DataFrame) -> str:
    n = len(df)
    lines = [f"cells (profile, P, level): {n}",
             f"ILP (best of contiguous, general) >= every periodic baseline that fits: {int(df['ok'].sum())}/{n}",
             f"  contiguous ILP alone: {int(df['ok_c'].sum())}/{n}; general ILP alone: {int(df['ok_g'].sum())}/{n}",
             f"ILP finds a plan, PipeDream's partitioner none: {int(df['ilp_only'].sum())}",
             f"ILP finds no plan: {int((df['ilp_tp'] <= 0).sum())}",
             f"general ILP strictly better than contiguous: {int((df['ilp_general_gain'].fillna(0) > TOL).sum())}",
             f"a fitting flushed plan (one weight version) beats the ILP: {int((df['flush_wins'] != '').sum())}",
             f"ILP plans failing check() or over the limit: "
             f"{int((~df['ilp_c_valid']).sum() + (~df['ilp_g_valid']).sum())}",
             f"ILP status contiguous: {df['ilp_c_status'].value_counts().to_dict()}; "
             f"general: {df['ilp_g_status'].value_counts().to_dict()}"]
    below_c = df[~df["ok_c"]]
    if len(below_c):
        re_c = below_c["reordered"].fillna("").astype(str).str.len().gt(0).sum() if "reordered" in df else 0
        lines.append(f"contiguous ILP below a fitting periodic baseline: {len(below_c)} cells, in {int(re_c)} of them "
                     f"the best baseline planned another topological order of the layers (graph DP)")
    bad = df[~df["ok"]]
    for _, r in bad.iterrows():
        lines.append(f"VIOLATION {r['profile']} P={r['P']} M={r['memory']:.6g}: ILP {r['ilp_tp']:.6g} < "
                     f"{r['best_periodic_method']} {r['best_periodic']:.6g}")
    for col in ("ilp_c_error", "ilp_g_error"):
        for _, r in df[df[col].astype(bool)].iterrows():
            lines.append(f"CHECK {col[:5]} {r['profile']} P={r['P']} M={r['memory']:.6g}: {r[col]}")
    return "\n".join(lines)


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="", help="comma-separated names (without 'pipedream/'); default all")
    ap.add_argument("--devices", default="2,4,8")
    ap.add_argument("--levels", type=int, default=4, help="memory levels from memory_levels(), plus unlimited")
    ap.add_argument("--time-limit", type=float, default=20.0, help="general ILP time limit (s)")
    ap.add_argument("--contiguous-time-limit", type=float, default=None, help="default: --time-limit")
    ap.add_argument("--bandwidth", default="12GB/s")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--quick", action="store_true", help="alexnet and vgg16, P in {2, 4}, 2 levels, 5 s")
    a = ap.parse_args(argv)
    names = [p for p in available_profiles() if p.startswith("pipedream/")]
    if a.profiles:
        want = {w if w.startswith("pipedream/") else f"pipedream/{w}" for w in a.profiles.split(",")}
        names = [p for p in names if p in want]
    devices = [int(x) for x in a.devices.split(",")]
    levels, tl = a.levels, a.time_limit
    if a.quick:
        names = [p for p in names if p in ("pipedream/alexnet", "pipedream/vgg16")] or names[:1]
        devices, levels, tl = [d for d in devices if d <= 4] or [2], min(levels, 2), min(tl, 5.0)
    ctl = a.contiguous_time_limit if a.contiguous_time_limit is not None else tl
    rows: list[dict] = []
    t_all = time.perf_counter()
    for name in sorted(names, key=lambda n: len(load_profile(n))):
        chain = load_profile(name)
        for P in devices:
            base = Target.of(P, bandwidth=a.bandwidth, memory_model="paper")
            mems = memory_levels(chain, base, levels) + [math.inf]
            part = []
            for M in mems:
                r = {"profile": name, "layers": len(chain), "P": P, "memory": M,
                     **run_cell(chain, base.with_(memory=M), time_limit=tl, contiguous_time_limit=ctl)}
                part.append(r)
            rows += part
            print(f"\n== {name} ({len(chain)} layers), P={P}  [throughput in mini-batches/s; * = does not fit; "
                  f"elapsed {time.perf_counter() - t_all:.0f} s]")
            print_table(pd.DataFrame(part))
            sys.stdout.flush()
            if a.csv:
                write_frame_atomic(a.csv, pd.DataFrame(rows))
    df = pd.DataFrame(rows)
    print("\n== summary")
    print(summarize(df))
    return df


if __name__ == "__main__":
    main()
