"""Complexity experiments: instance generators, the 3-PARTITION reduction, scaling and gain studies.

What makes planning hard (docs/model.md):

* without a memory limit the *contiguous* problem is chains-on-chains
  partitioning (polynomial, the DP) and the *general* one is P||Cmax with
  link loads (NP-hard): :func:`three_partition_instance` maps a 3-PARTITION
  instance to it, so the optimal period is the bound B exactly when the
  instance is a yes;
* with a memory limit, general allocations can beat contiguous ones by an
  unbounded factor: :func:`general_beats_contiguous_family`;
* :func:`scaling_study` measures solve time against layers and devices and
  :func:`gain_distribution` the gains over many random instances.

>>> ch = random_chain(6, heterogeneity=0.5, seed=1)
>>> len(ch), ch.name
(6, 'random-6-h0.5-s1')
>>> chain, plat = general_beats_contiguous_family(3)
>>> family_factor(3)
3.0
>>> is_three_partition_yes([6, 7, 7, 6, 6, 8], 20)
True
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from workbench.methods import lineup
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.model.training_setup import DEFAULT_BANDWIDTH
from workbench.planners.sweep import Unavailable, run_method, solve

__all__ = [
    "random_chain", "memory_levels", "least_contiguous_memory", "general_beats_contiguous_family",
    "family_factor", "three_partition_instance", "is_three_partition_yes", "three_partition_yes_instance",
    "three_partition_no_instance", "scaling_study", "gain_distribution", "SCALING_METHODS",
]

MiB = float(2**20)


# --------------------------------------------------------------------------------------------
# Random chains
# --------------------------------------------------------------------------------------------
def random_chain(n_layers: int, *, heterogeneity: float = 0.5, seed: int | None = None,
                 compute_ms: float = 10.0, weight_mib: float = 64.0, activation_mib: float = 32.0,
                 backward_ratio: float = 2.0, trend: float = 0.0, name: str | None = None) -> Chain:
    """A random chain of ``n_layers`` layers with controlled heterogeneity.

    Forward times, weights and activations are independent log-normal draws
    with median ``compute_ms`` (ms), ``weight_mib`` and ``activation_mib``
    (MiB) and log-standard-deviation ``heterogeneity`` (0 gives identical
    layers; 1 gives values spread over about a factor e each way). Backward =
    ``backward_ratio`` x forward. ``trend`` > 0 makes activations shrink and
    weights grow along the chain by a factor ``exp(trend)`` end to end, as in
    convolutional networks. ``saved_bytes`` is left to its default (the
    layer's input).

    >>> c = random_chain(4, heterogeneity=0.0, seed=0)
    >>> [round(l.forward * 1e3, 6) for l in c.layers]
    [10.0, 10.0, 10.0, 10.0]
    >>> random_chain(5, seed=3) == random_chain(5, seed=3)
    True
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if heterogeneity < 0:
        raise ValueError(f"heterogeneity must be >= 0, got {heterogeneity}")
    rng = np.random.default_rng(seed)
    h = float(heterogeneity)
    draw = lambda: np.exp(rng.normal(0.0, h, n_layers)) if h > 0 else np.ones(n_layers)  # noqa: E731
    fwd, w, a = draw(), draw(), draw()
    pos = np.linspace(-0.5, 0.5, n_layers) if n_layers > 1 else np.zeros(1)
    w = w * np.exp(trend * pos)
    a = a * np.exp(-trend * pos)
    layers = tuple(
        Layer(f"l{i}", float(fwd[i] * compute_ms * 1e-3), float(fwd[i] * compute_ms * 1e-3 * backward_ratio),
              float(round(w[i] * weight_mib * MiB)), float(round(a[i] * activation_mib * MiB)))
        for i in range(n_layers)
    )
    input_bytes = float(round(activation_mib * MiB * (np.exp(-trend * 0.5) if n_layers > 1 else 1.0)))
    nm = name or f"random-{n_layers}-h{heterogeneity:g}-s{seed}"
    return Chain(layers, input_bytes=input_bytes,
                 meta={"network": nm, "source": "workbench.experiments.complexity.random_chain",
                       "heterogeneity": f"{heterogeneity:g}", "seed": str(seed)})


# --------------------------------------------------------------------------------------------
# Memory levels
# --------------------------------------------------------------------------------------------
def least_contiguous_memory(chain: Chain, platform: Target) -> float:
    """The least memory per device with which *some* contiguous plan exists.

    Every stage has at least one mini-batch in flight, so a device needs at
    least the footprint (saved + phi * weights) of its layers; with every
    k = 1 (a long enough period) exactly that. So the answer is the min-max
    partition of the footprints into at most P intervals: the DP planner's
    :func:`~workbench.planners.dp.contiguous.least_contiguous_memory`.

    >>> ch = Chain(tuple(Layer(f"l{i}", 1, 1, 10 * (i + 1), 0) for i in range(4)))
    >>> least_contiguous_memory(ch, Target.of(2, memory_model="paper"))
    60.0
    """
    from workbench.planners.dp.contiguous import least_contiguous_memory

    return least_contiguous_memory(chain, platform)[0]


def memory_levels(chain: Chain, platform: Target, n: int, *, methods: Sequence[str] = ("dp",),
                  margin: float = 1e-4) -> list[float]:
    """``n`` memory limits from the least feasible (contiguous) to "unlimited", geometrically spaced.

    The lowest is :func:`least_contiguous_memory` (times ``1 + margin``):
    below it no contiguous plan exists. The highest is the largest peak
    memory of the unconstrained plans of ``methods`` (the memory at which
    each of them reaches its unconstrained throughput), so the last level is
    "unlimited" for every method listed. Levels are increasing and distinct
    (fewer than ``n`` when the range collapses).

    >>> ch = random_chain(6, seed=0)
    >>> lv = memory_levels(ch, Target.of(2, memory_model="paper"), 4)
    >>> len(lv), lv == sorted(lv)
    (4, True)
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    lo = least_contiguous_memory(chain, platform) * (1 + margin)
    free = platform.with_(memory=math.inf)
    hi = lo
    for m in methods:
        try:
            p = solve(chain, free, m)
        except Unavailable:
            continue
        if p.feasible and p.memory:
            hi = max(hi, p.peak_memory * (1 + margin))
    if n == 1 or hi <= lo * (1 + 1e-9):
        return [hi]
    levels = list(np.geomspace(lo, hi, n))
    levels[-1] = hi
    out: list[float] = []
    for v in levels:
        if not out or v > out[-1] * (1 + 1e-9):
            out.append(float(v))
    return out


# --------------------------------------------------------------------------------------------
# A family where general allocations win by a factor k
# --------------------------------------------------------------------------------------------
def general_beats_contiguous_family(k: int, *, compute: float = 1.0, weight: float = 1.0) -> tuple[Chain, Target]:
    """P = k devices, a chain of k compute layers followed by k weight layers.

    Compute layers: forward ``compute/3``, backward ``2 compute/3``, no
    weights. Weight layers: no compute, ``weight`` bytes each. No
    activations (no communication, nothing saved), a single weight version
    (``weights="single"``), memory ``weight`` per device. So memory does not
    depend on the schedule and each device holds at most one weight layer.

    Contiguous: the k weight layers are the last k layers and need k
    distinct devices, so every one of the k intervals holds one of them;
    the intervals of the 2nd..kth start at their weight layer, and the first
    holds every compute layer: period ``k * compute``.
    General: one compute layer and one weight layer per device: period
    ``compute`` (the lower bound). The factor is exactly k
    (:func:`family_factor`); tests recompute both optima independently.

    >>> ch, pl = general_beats_contiguous_family(2)
    >>> len(ch), pl.devices, pl.memory
    (4, 2, 1.0)
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    f, b = compute / 3.0, compute - compute / 3.0
    layers = [Layer(f"c{i}", f, b, 0.0, 0.0, 0.0) for i in range(k)]
    layers += [Layer(f"w{i}", 0.0, 0.0, float(weight), 0.0, 0.0) for i in range(k)]
    chain = Chain(tuple(layers), input_bytes=0.0,
                  meta={"network": f"general-beats-contiguous-{k}", "source": "workbench.experiments.complexity"})
    return chain, Target.of(k, memory=float(weight), weights="single", memory_model="paper")


def family_factor(k: int) -> float:
    """Contiguous optimum / general optimum of :func:`general_beats_contiguous_family` (= k)."""
    return float(Fraction(k, 1))


# --------------------------------------------------------------------------------------------
# 3-PARTITION
# --------------------------------------------------------------------------------------------
def _check_three_partition(numbers: Sequence[int], bound: int) -> None:
    n = len(numbers)
    if n == 0 or n % 3:
        raise ValueError(f"3-PARTITION needs 3m numbers, got {n}")
    m = n // 3
    if sum(numbers) != m * bound:
        raise ValueError(f"the numbers must sum to m*B = {m * bound}, got {sum(numbers)}")
    bad = [x for x in numbers if not (4 * x > bound and 2 * x < bound)]
    if bad:
        raise ValueError(f"every number must lie strictly between B/4 and B/2 (B={bound}); not {bad}")


def three_partition_instance(numbers: Sequence[int], bound: int) -> tuple[Chain, Target]:
    """Map a 3-PARTITION instance to the no-memory general planning problem.

    One layer per number x (forward x/2, backward x/2, nothing sent, no
    weights), m = len(numbers)/3 devices, unlimited memory and bandwidth. A
    device's load is the sum of its numbers and, without memory, any
    allocation reaches period = max device load (docs/model.md, "Plan"), so
    the optimal general period is the P||Cmax optimum: it equals B iff the
    numbers split into m groups of sum B (each then a triple, since every
    number lies strictly between B/4 and B/2): a yes instance.

    >>> ch, pl = three_partition_instance([6, 7, 7, 6, 6, 8], 20)
    >>> pl.devices, ch.total_compute
    (2, 40.0)
    """
    _check_three_partition(numbers, bound)
    layers = tuple(Layer(f"x{i}", x / 2.0, x / 2.0, 0.0, 0.0, 0.0) for i, x in enumerate(numbers))
    chain = Chain(layers, input_bytes=0.0,
                  meta={"network": f"3partition-m{len(numbers) // 3}-B{bound}",
                        "source": "workbench.experiments.complexity"})
    return chain, Target.of(len(numbers) // 3, memory_model="paper")


def is_three_partition_yes(numbers: Sequence[int], bound: int) -> bool:
    """Exhaustive search: can the numbers be split into triples of sum ``bound``?

    Independent of any planner: take the first remaining number, try every
    pair of the others that completes it, recurse.

    >>> is_three_partition_yes([6, 6, 6, 6, 7, 9], 20)
    False
    """
    _check_three_partition(numbers, bound)

    def solve(rest: tuple[int, ...]) -> bool:
        if not rest:
            return True
        a, others = rest[0], rest[1:]
        tried: set[tuple[int, int]] = set()
        for i, j in itertools.combinations(range(len(others)), 2):
            if a + others[i] + others[j] != bound:
                continue
            key = (others[i], others[j])
            if key in tried:
                continue
            tried.add(key)
            left = tuple(x for t, x in enumerate(others) if t not in (i, j))
            if solve(left):
                return True
        return False

    return solve(tuple(sorted(numbers)))


def three_partition_yes_instance(m: int, bound: int = 20, *, seed: int | None = None) -> list[int]:
    """3m numbers forming m triples of sum ``bound``, shuffled (each strictly in (B/4, B/2)).

    >>> nums = three_partition_yes_instance(2, 20, seed=0)
    >>> len(nums), sum(nums), is_three_partition_yes(nums, 20)
    (6, 40, True)
    """
    rng = np.random.default_rng(seed)
    lo, hi = bound // 4 + 1, (bound - 1) // 2  # strict: 4x > B and 2x < B
    out: list[int] = []
    for _ in range(m):
        for _attempt in range(10_000):
            a, b = int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))
            c = bound - a - b
            if lo <= c <= hi:
                out += [a, b, c]
                break
        else:  # pragma: no cover
            raise ValueError(f"no triple of sum {bound} with numbers in ({bound}/4, {bound}/2)")
    rng.shuffle(out)
    return [int(x) for x in out]


def three_partition_no_instance(m: int, bound: int = 20, *, seed: int | None = None,
                                tries: int = 100_000) -> list[int]:
    """3m numbers in (B/4, B/2) summing to m*B that do *not* split into triples of sum B.

    Random draws, rejected until :func:`is_three_partition_yes` says no.

    >>> nums = three_partition_no_instance(2, 20, seed=0)
    >>> sum(nums), is_three_partition_yes(nums, 20)
    (40, False)
    """
    rng = np.random.default_rng(seed)
    lo, hi = bound // 4 + 1, (bound - 1) // 2
    n = 3 * m
    for _ in range(tries):
        nums = [int(x) for x in rng.integers(lo, hi + 1, n - 1)]
        last = m * bound - sum(nums)
        if not (lo <= last <= hi):
            continue
        nums.append(last)
        if not is_three_partition_yes(nums, bound):
            rng.shuffle(nums)
            return [int(x) for x in nums]
    raise ValueError(f"found no 'no' instance with m={m}, B={bound} in {tries} draws")


# --------------------------------------------------------------------------------------------
# Studies
# --------------------------------------------------------------------------------------------
#: (method, allocation) pairs the scaling study solves (the registry's line-up)
SCALING_METHODS: tuple[tuple[str, str], ...] = lineup("scaling")


def _mid_memory(chain: Chain, platform: Target, where: float) -> float:
    """A memory limit at fraction ``where`` (0 = least feasible, 1 = unlimited) on a log scale."""
    lv = memory_levels(chain, platform, 2)
    if len(lv) == 1:
        return lv[0]
    lo, hi = lv[0], lv[-1]
    return float(lo * (hi / lo) ** where)


def scaling_study(layers: Iterable[int] = (4, 8, 12, 16, 24, 32), devices: Iterable[int] = (2, 4, 8), *,
                  methods: Sequence[tuple[str, str]] = SCALING_METHODS, time_limit: float = 30.0,
                  seeds: Iterable[int] = (0,), heterogeneity: float = 0.5, memory_position: float = 0.3,
                  progress: Any = None) -> pd.DataFrame:
    """Solve time against the number of layers and devices, one row per (L, P, seed, method).

    Random chains (:func:`random_chain`) with a memory limit at
    ``memory_position`` of the way (log scale) from the least feasible to
    unlimited, so memory binds. Every solve gets ``time_limit`` seconds;
    rows with ``timed_out`` True are time-outs (their ``seconds`` is the
    limit, roughly). ILPs are not coarsened (``coarsen=False``) so the size
    is the real one. Instances with P > L are skipped.
    """
    rows = []
    for L in layers:
        for P in devices:
            if P > L:
                continue
            for seed in seeds:
                chain = random_chain(L, heterogeneity=heterogeneity, seed=seed)
                base = Target.of(P, bandwidth=DEFAULT_BANDWIDTH, memory_model="paper")
                M = _mid_memory(chain, base, memory_position)
                plat = base.with_(memory=M)
                for method, alloc in methods:
                    opts = {"coarsen": False} if method == "ilp" else {}
                    r = run_method(chain, plat, method, allocation=alloc, time_limit=time_limit, **opts)
                    rows.append({"n_layers": L, "devices": P, "seed": seed, "memory_limit": M,
                                 "time_limit": time_limit, "heterogeneity": heterogeneity, **r})
                    if progress is not None:
                        progress(1)
    return pd.DataFrame(rows)


def gain_distribution(n_instances: int = 50, *, n_layers: int = 8, devices: int = 3,
                      heterogeneity: float = 1.0, memory_positions: Sequence[float] = (0.0, 0.25, 0.5),
                      general_method: str = "brute", time_limit: float | None = 30.0, seed0: int = 0,
                      progress: Any = None) -> pd.DataFrame:
    """Gains over many random instances, one row per (instance, memory position).

    * ``gain_general`` = contiguous optimum period / general optimum period
      (contiguous: the exact DP; general: ``general_method``, by default the
      exhaustive ``brute`` planner, exact for L <= 8 and P <= 3; with
      ``"ilp"`` a time-out is flagged in ``general_status``). >= 1 when
      both are optimal.
    * ``gain_dp_over_pipedream`` = PipeDream's period / the memory-aware
      DP's (inf where PipeDream's partitioner finds nothing that fits and
      the DP does; ``pipedream_fits`` says which).

    ``memory_positions``: where the limit lies between the least feasible
    (0) and unlimited (1), log scale.
    """
    rows = []
    for i in range(n_instances):
        seed = seed0 + i
        chain = random_chain(n_layers, heterogeneity=heterogeneity, seed=seed)
        base = Target.of(devices, bandwidth=DEFAULT_BANDWIDTH, memory_model="paper")
        lv = memory_levels(chain, base, 2)
        lo, hi = lv[0], lv[-1]
        for pos in memory_positions:
            M = float(lo * (hi / lo) ** pos)
            plat = base.with_(memory=M)
            dp = run_method(chain, plat, "dp")
            gen = run_method(chain, plat, general_method, allocation="general", time_limit=time_limit)
            pd_ = run_method(chain, plat, "pipedream")
            dp_ok = dp["fits"]
            gen_ok = gen["fits"]
            pd_ok = pd_["fits"]
            rows.append({
                "instance": i, "seed": seed, "n_layers": n_layers, "devices": devices,
                "heterogeneity": heterogeneity, "memory_position": pos, "memory_limit": M,
                "lower_bound": dp["lower_bound"],
                "dp_period": dp["period"], "dp_status": dp["status"],
                "general_method": general_method, "general_period": gen["period"], "general_status": gen["status"],
                "pipedream_period": pd_["period"], "pipedream_status": pd_["status"], "pipedream_fits": pd_ok,
                "gain_general": (dp["period"] / gen["period"]) if (dp_ok and gen_ok) else math.nan,
                "gain_dp_over_pipedream": (pd_["period"] / dp["period"] if pd_ok else math.inf) if dp_ok else math.nan,
            })
            if progress is not None:
                progress(1)
    return pd.DataFrame(rows)
