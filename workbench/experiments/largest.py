"""The largest model that fits: grow a GPT family until no plan fits, per method (``python -m workbench largest``).

**Families** (docs/model.md, "Activation policies"): the zoo GPT (pre-LN blocks, GPT-2's
vocabulary, batch 8 of 256 tokens, heads = d_model / 64), grown

* **by depth**: d_model 768 (GPT-2 small's width), n blocks; the chain is the measured
  embedding, n copies of the measured block and the measured head (with the loss) of the
  profile ``data/profiles/gpt-family/gpt-d768.csv``: a deeper GPT repeats the same block;
* **by width**: 12 blocks, d_model = 64 m; every column of the embedding, the block and the
  head is a quadratic in d_model fitted (least squares) on profiles at d_model 256, 384, 512
  and 640 (:data:`FIT`) and checked against the profile at 768 (:data:`CHECK`, not used in the
  fit; :func:`fit_check` gives every column's error). Byte columns are polynomials in d_model
  of degree at most 2 (parameters 12 d^2, activations linear in d for a fixed batch and
  sequence), so their fit is exact up to the allocator's rounding; times follow the flops
  (quadratic), up to the CPU's noise. Widths beyond 640 are extrapolated.

Profiles come from ``scripts/make_family_profiles.py`` (the workbench's profiler, CPU).

**Search.** For each family, device count P and method (PipeDream's partition, mcap, dp,
the general ILP, each with activations ``keep`` and ``auto``), the size grows by doubling
until the method's plan no longer fits M per device, then bisection finds the largest size
that fits. Two criteria (:data:`CRITERIA`): a plan that fits at *any period* (planners may
slow down, holding fewer mini-batches in flight, down to one: no pipelining), or one that
also stays *within 10 % of the method's full speed* (its period without a memory limit,
every layer kept: :func:`full_speed`; mCAP's setting, where the pipeline runs at full
throughput). At that size the table gives the parameters, the ratio of the parameters to
PipeDream's (keep) largest under the same criterion, and the throughput paid: the plan's
period over the lower bound (1 = perfect pipelining).

>>> round(family_config(512)["heads"]), family_config(512)["seq_len"]
(8, 256)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from workbench.methods import lineup, method, variant
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.paths import PROFILES_DIR

__all__ = ["FAMILY_DIR", "FIT", "CHECK", "FAMILIES", "METHODS", "CRITERIA", "family_config", "family_chain",
           "fit_check",
           "family_files", "full_speed",
           "parameters", "largest_size", "largest_table", "Result"]

FAMILY_DIR = PROFILES_DIR / "gpt-family"
FIT = (256, 384, 512, 640)
CHECK = 768
DEPTH_WIDTH = 768
WIDTH_BLOCKS = 12
FAMILIES = ("depth", "width")
#: (label, planner, allocation, activations)
#: (the registry's line-up "largest", each with every layer kept and with policies chosen per layer)
METHODS: tuple[tuple[str, str, str, str], ...] = tuple(
    (variant(name, alloc).short + suffix, name, alloc, policy)
    for name, alloc in lineup("largest") for policy, suffix in (("keep", ""), ("auto", " + auto")))
_COLUMNS = ("forward", "backward", "weight_bytes", "activation_bytes", "saved_bytes", "grad_bytes", "max_param_bytes",
            "saved_input_bytes", "saved_output_bytes", "forward_peak_bytes", "backward_peak_bytes",
            "backward_fresh_peak_bytes")


def family_config(d_model: int) -> dict:
    """The zoo GPT options (and batch size) of the family at width ``d_model``, with one block."""
    return {"batch_size": 8, "layers": 1, "d_model": int(d_model), "heads": max(1, int(d_model) // 64),
            "seq_len": 256, "vocab": 50257}


def family_files() -> dict[str, Path]:
    """The profile files the families are made of, by name (their digests key the cached results).

    >>> sorted(family_files())[:2]
    ['gpt-d256', 'gpt-d384']
    """
    return {f"gpt-d{d}": FAMILY_DIR / f"gpt-d{d}.csv" for d in FIT + (CHECK,)}


@lru_cache(maxsize=None)
def _profile(d_model: int) -> Chain:
    from workbench.profiles import load_profile

    path = FAMILY_DIR / f"gpt-d{d_model}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run scripts/make_family_profiles.py")
    return load_profile(str(path))


def _rows(chain: Chain) -> dict[str, Layer]:
    """The embedding, the block and the head of a one-block profile."""
    if len(chain) != 3:
        raise ValueError(f"{chain.name}: a family profile has 3 layers (embedding, block, head), not {len(chain)}")
    return dict(zip(("embed", "block", "head"), chain.layers))


@lru_cache(maxsize=None)
def _fit() -> dict[tuple[str, str], np.ndarray]:
    """(role, column) -> quadratic coefficients in d_model, least squares over :data:`FIT`."""
    rows = {d: _rows(_profile(d)) for d in FIT}
    out = {}
    for role in ("embed", "block", "head"):
        for col in _COLUMNS:
            y = np.array([float(getattr(rows[d][role], col) or 0.0) for d in FIT])
            out[(role, col)] = np.polyfit(np.array(FIT, dtype=float), y, 2)
    return out


def _fitted_layer(role: str, name: str, d_model: int) -> Layer:
    coef = _fit()
    vals = {c: max(float(np.polyval(coef[(role, c)], d_model)), 0.0) for c in _COLUMNS}
    return Layer(name, **vals)


def fit_check() -> pd.DataFrame:
    """Every fitted column at :data:`CHECK` against the profile there (not used in the fit): role, column,
    fitted, measured, relative error."""
    measured = _rows(_profile(CHECK))
    rows = []
    for role in ("embed", "block", "head"):
        fitted = _fitted_layer(role, role, CHECK)
        for col in _COLUMNS:
            m = float(getattr(measured[role], col) or 0.0)
            f = float(getattr(fitted, col))
            rows.append({"role": role, "column": col, "fitted": f, "measured": m,
                         "error": (f - m) / m if m else (0.0 if f == 0 else math.inf)})
    return pd.DataFrame(rows)


def family_chain(family: str, size: int) -> Chain:
    """The chain of ``family`` at ``size`` (blocks for depth, d_model for width)."""
    if family == "depth":
        rows = _rows(_profile(DEPTH_WIDTH))
        width, blocks = DEPTH_WIDTH, int(size)
        embed, block, head = rows["embed"], rows["block"], rows["head"]
        make = lambda i: Layer(f"block{i}", **{c: getattr(block, c) for c in _COLUMNS})  # noqa: E731
    elif family == "width":
        width, blocks = int(size), WIDTH_BLOCKS
        embed, head = _fitted_layer("embed", "embed", width), _fitted_layer("head", "head", width)
        block = _fitted_layer("block", "block", width)
        make = lambda i: Layer(f"block{i}", **{c: getattr(block, c) for c in _COLUMNS})  # noqa: E731
    else:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    if blocks < 1 or width < 64:
        raise ValueError(f"a {family} family member needs at least one block and d_model >= 64")
    base = _profile(DEPTH_WIDTH)
    layers = (Layer("embed", **{c: getattr(embed, c) for c in _COLUMNS}),) + tuple(make(i) for i in range(blocks)) \
        + (Layer("head", **{c: getattr(head, c) for c in _COLUMNS}),)
    meta = {**base.meta, "network": f"gpt-{family}-{size}", "family": family, "d_model": str(width),
            "blocks": str(blocks)}
    return Chain(layers, base.input_bytes, None, meta)


def parameters(family: str, size: int) -> float:
    """Parameters of the family member (bytes of weights / 4: float32)."""
    return float(family_chain(family, size).weights.sum()) / 4.0


@dataclass(frozen=True)
class Result:
    """The largest size a method fits, and what its plan there pays."""

    family: str
    devices: int
    method: str
    size: int
    parameters: float
    period_over_bound: float
    activations: str
    seconds: float


def _fits(plan) -> bool:
    return bool(plan.feasible and plan.fits)


def full_speed(chain: Chain, devices: int, planner: str) -> float:
    """The period the method reaches without a memory limit, with every layer kept: PipeDream's and
    mcap's own; dp's contiguous optimum for dp and the ILP (a general plan may be faster still)."""
    from workbench.planners import plan as run_planner
    from workbench.planners.partition import unconstrained_period

    if method(planner).exact:
        return unconstrained_period(chain, Target.of(devices))[0]
    return run_planner(chain, Target.of(devices), planner).period


def largest_size(family: str, devices: int, memory: float, planner: str, allocation: str, activations: str, *,
                 time_limit: float | None = None, start: int | None = None, limit: int | None = None,
                 slowdown: float | None = None, platform_kw: dict | None = None,
                 varied: list[bool] | None = None) -> tuple[int, object]:
    """The largest size of ``family`` whose plan fits, and that plan (0 and None when even the
    smallest does not): doubling, then bisection. Sizes are blocks (depth) or multiples of 64 (width).
    ``slowdown``: the plan must also keep its period within that factor of :func:`full_speed`. ``varied``:
    gets True appended for each attempt whose plan the time limit stopped (another run may answer otherwise)."""
    from workbench.planners import plan as run_planner

    step = 1 if family == "depth" else 64
    lo_size = step
    hi_cap = (limit or (4096 if family == "depth" else 64 * 256))
    plat = Target.of(devices, memory=memory, **(platform_kw or {}))

    def attempt(size: int):
        chain = family_chain(family, size)
        p = run_planner(chain, plat, planner, allocation=allocation, time_limit=time_limit, activations=activations)
        if varied is not None and (p.status == "timeout" or p.extra.get("may_vary")):
            varied.append(True)
        if not _fits(p):
            return None
        if slowdown is not None and p.period > slowdown * full_speed(chain, devices, planner) * (1 + 1e-9):
            return None
        return p

    best_size, best = 0, None
    size = max(lo_size, (start or lo_size) // step * step)
    first = attempt(size)
    if first is None:
        size, first = lo_size, attempt(lo_size)
        if first is None:
            return 0, None
    best_size, best = size, first
    bad = None
    while bad is None:                     # doubling
        nxt = min(best_size * 2, hi_cap)
        if nxt <= best_size:
            return best_size, best
        got = attempt(nxt)
        if got is None:
            bad = nxt
        else:
            best_size, best = nxt, got
    while bad - best_size > step:          # bisection
        mid = (best_size + bad) // 2 // step * step
        if mid <= best_size:
            break
        got = attempt(mid)
        if got is None:
            bad = mid
        else:
            best_size, best = mid, got
    return best_size, best


#: the two questions: any throughput, or within 10 % of the method's own full speed (mCAP's setting)
CRITERIA: dict[str, float | None] = {"any period": None, "within 10 % of full speed": 1.1}


def largest_table(families: Sequence[str] = FAMILIES, devices: Sequence[int] = (2, 4, 8), memory: float = 2 * 2**30,
                  methods: Sequence[tuple[str, str, str, str]] = METHODS, *, time_limit: float | None = 10.0,
                  criteria: dict[str, float | None] = CRITERIA,
                  progress: Callable[[str], None] | None = None, platform_kw: dict | None = None) -> pd.DataFrame:
    """One row per (family, P, criterion, method): the largest size that fits (at any period, or within a
    slowdown of the method's full speed), its parameters, the ratio to PipeDream's (keep) largest under the
    same criterion, the period over the lower bound there, and the policies used. ``platform_kw``: the
    training set-up (e.g. ``{"zero_grad": "zeros"}``)."""
    from workbench.model.activations import describe

    if not 0 < memory < math.inf:
        raise ValueError(f"memory {memory!r}: give a size above 0 and finite (at no limit every size fits)")
    rows = []
    for family in families:
        for P in devices:
            for crit, slow in criteria.items():
                hint = None
                for label, planner, allocation, activations in methods:
                    t0 = time.perf_counter()
                    varied: list[bool] = []
                    size, plan = largest_size(family, P, memory, planner, allocation, activations,
                                              time_limit=time_limit, start=hint, slowdown=slow,
                                              platform_kw=platform_kw, varied=varied)
                    hint = hint or size
                    rows.append({"family": family, "devices": P, "criterion": crit, "method": label, "size": size,
                                 "parameters": parameters(family, size) if size else 0.0,
                                 "period_over_bound": plan.period / plan.lower_bound if plan is not None else math.nan,
                                 "activations": describe(plan.activations) if plan is not None and plan.activations
                                 else ("keep" if plan is not None else "-"),
                                 "seconds": time.perf_counter() - t0, "may_vary": bool(varied)})
                    if progress:
                        r = rows[-1]
                        progress(f"{family} P={P} {crit} {label}: " + (
                            f"size {size} ({r['parameters'] / 1e6:.0f} M parameters), period/bound "
                            f"{r['period_over_bound']:.2f}" if size else "not even the smallest size fits")
                            + f", {r['seconds']:.1f} s")
    df = pd.DataFrame(rows)
    ref = df[df.method == "PipeDream"].set_index(["family", "devices", "criterion"])["parameters"]
    df["vs_pipedream"] = [p / ref.get(k, math.nan) if ref.get(k, 0) else math.nan
                          for k, p in zip(zip(df.family, df.devices, df.criterion), df.parameters)]
    ref_varies = df[df.method == "PipeDream"].set_index(["family", "devices", "criterion"])["may_vary"]
    df["may_vary"] = [bool(v) or bool(ref_varies.get(k, False))       # the ratio to PipeDream's varies with it
                      for k, v in zip(zip(df.family, df.devices, df.criterion), df.may_vary)]
    return df
