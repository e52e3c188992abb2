"""What each unit of the experiments computes: a method's sweep over the memory levels, or a piece of the
complexity study (:mod:`workbench.experiments.complexity`, :mod:`workbench.experiments.largest`).

Sweeps go through the one sweep helper, :func:`workbench.planners.sweep.sweep`
(robust: a failed solve is a row with status ``error`` or ``unavailable``,
never a stopped run), with work budgets instead of wall-clock ones
(``deterministic=True``) so that a unit gives the same plans every run.
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from workbench.experiments.complexity import (
    family_factor,
    gain_distribution,
    general_beats_contiguous_family,
    is_three_partition_yes,
    scaling_study,
    three_partition_instance,
    three_partition_no_instance,
    three_partition_yes_instance,
)
from workbench.experiments.settings import TOL
from workbench.experiments.units import Unit, profile_key
from workbench.methods import lineup
from workbench.model.target import Target
from workbench.planners.sweep import plan_row, run_method, sweep

__all__ = ["compute_unit"]


def compute_unit(unit: Unit) -> pd.DataFrame:
    """Compute a unit's frame from its settings (no cache)."""
    st = unit.settings
    kind = unit.kind
    if kind == "sweep":
        return _sweep_frame(st)
    if kind == "three_partition":
        return _three_partition_frame(st["m"], st["count"], st["bound"], st["time_limit"])
    if kind == "family":
        return _family_frame(st["k"], st["time_limit"])
    if kind == "gains":
        return gain_distribution(st["instances"], n_layers=st["layers"], devices=st["devices"],
                                 heterogeneity=st["heterogeneity"], memory_positions=tuple(st["positions"]),
                                 general_method=st["general_method"], time_limit=st["time_limit"])
    if kind == "largest":
        from workbench.experiments.largest import METHODS as LARGEST_METHODS
        from workbench.experiments.largest import largest_table

        methods = tuple(m for m in LARGEST_METHODS if st["ilp"] or m[1] != "ilp")
        return largest_table((st["family"],), (st["devices"],), st["memory"], methods, time_limit=st["time_limit"])
    if kind == "scaling":
        return scaling_study((st["layers"],), tuple(st["devices"]), time_limit=st["time_limit"],
                             seeds=tuple(st["seeds"]), heterogeneity=st["heterogeneity"],
                             memory_position=st["memory_position"])
    raise ValueError(f"unknown unit kind {kind!r}")



def _sweep_frame(st: dict[str, Any]) -> pd.DataFrame:
    """One method over the memory levels (:func:`workbench.planners.sweep.sweep`), a row per level."""
    from workbench.profiles import load_profile

    digest = profile_key(st["network"])["sha256"]
    if digest != st["profile"]["sha256"]:  # the file changed since the units were planned
        raise ValueError(f"{st['network']}: the profile file changed while the run was going on; run again")
    chain = load_profile(st["network"])
    base = Target.of(st["devices"], bandwidth=st["bandwidth"], weight_factor=st["weight_factor"], weights=st["weights"],
                    memory_model=st.get("memory_model", "paper"))
    least = float(st["memory_levels"][0])
    results = sweep(chain, base, [float(M) for M in st["memory_levels"]], st["method"], allocation=st["allocation"],
                    time_limit=st["time_limit"], robust=True, deterministic=True)  # work budgets: same plans every run
    rows = []
    for i, (M, result) in enumerate(results):
        rows.append({"network": st["network"], "devices": st["devices"], "method_key": st["method_key"],
                     "level": i, "memory_limit": M, "least_memory": least, "memory_relative": M / least,
                     "n_layers": len(chain), "time_limit": st["time_limit"], "method": st["method"],
                     "allocation": st["allocation"], **plan_row(result, chain, base.with_(memory=M))})
    return pd.DataFrame(rows)


def _three_partition_frame(ms: Sequence[int], count: int, bound: int, time_limit: float) -> pd.DataFrame:
    rows = []
    for m in ms:
        for seed in range(count):
            for answer, gen in (("yes", three_partition_yes_instance), ("no", three_partition_no_instance)):
                nums = gen(m, bound, seed=seed)
                chain, plat = three_partition_instance(nums, bound)
                truth = is_three_partition_yes(nums, bound)
                for method, allocation in lineup("three_partition"):
                    if method == "brute" and len(nums) > 8:
                        continue
                    r = run_method(chain, plat, method, allocation=allocation, time_limit=time_limit)
                    rows.append({"m": m, "seed": seed, "numbers": " ".join(map(str, nums)), "bound": bound,
                                 "generated_as": answer, "exhaustive_yes": truth, "method": method,
                                 "status": r["status"], "period": r["period"], "seconds": r["seconds"],
                                 "planner_says_yes": bool(abs(r["period"] - bound) <= TOL * bound)
                                 if r["status"] == "optimal" else None})
    return pd.DataFrame(rows)


def _family_frame(ks: Sequence[int], time_limit: float) -> pd.DataFrame:
    rows = []
    for k in ks:
        chain, plat = general_beats_contiguous_family(k)
        for method, alloc in lineup("family"):
            if method == "brute" and (len(chain) > 8 or plat.devices > 3):
                continue
            r = run_method(chain, plat, method, allocation=alloc, time_limit=time_limit)
            rows.append({"k": k, "n_layers": len(chain), "devices": plat.devices, "method": method,
                         "allocation": alloc, "status": r["status"], "period": r["period"], "seconds": r["seconds"],
                         "predicted_factor": family_factor(k), "lower_bound": r["lower_bound"]})
    return pd.DataFrame(rows)
