"""Random instances shared by the tests: one generator per kind of instance, so each is written once.

Each generator draws from the random generator it is given, in a fixed order
(per layer: forward, backward, weights, saved activations; then the chain's
input), so a test that passes the same seeded generator gets the same
instances every run. Two families:

* :func:`uniform_chain` (``numpy.random.Generator``): times uniform, bytes
  whole numbers; its presets :func:`baseline_chain` (the baselines' and flushed
  schedules' tests), :func:`small_chain` (PipeDream's partitioner) and
  :func:`ilp_chain` (the ILP's tests, with :func:`footprint_limit` for a memory
  limit that binds);
* :func:`py_chain`, :func:`py_contiguous` and :func:`py_general`
  (``random.Random``): the schedule builder's and the simulator's instances.

Activation policies have their own: ``tests/policy_instances.py``.

>>> import numpy as np, random
>>> ilp_chain(np.random.default_rng(0), 3) == ilp_chain(np.random.default_rng(0), 3)
True
>>> py_contiguous(random.Random(5), 6, 3)   # three stages: layers 0-2, 3-4, 5
[2, 2, 2, 0, 0, 1]
"""

from __future__ import annotations

import itertools
import random

import numpy as np

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.schedules.builder import best_schedule

__all__ = ["uniform_chain", "baseline_chain", "small_chain", "ilp_chain", "footprint_limit", "py_chain",
           "py_contiguous", "py_general", "compositions", "runtime_chain", "runtime_plans"]


def uniform_chain(rng: np.random.Generator, L: int, *, forward: tuple[float, float], backward: tuple[float, float],
                  weights: tuple[int, int], saved: tuple[int, int], input_bytes: float | tuple[int, int]) -> Chain:
    """``L`` layers: forward and backward times uniform in their ranges, weight and saved bytes whole numbers in
    ``[lo, hi)``; ``input_bytes`` fixed, or drawn like the bytes after the layers."""
    layers = tuple(Layer(f"l{i}", float(rng.uniform(*forward)), float(rng.uniform(*backward)),
                         float(rng.integers(*weights)), float(rng.integers(*saved))) for i in range(L))
    first = float(input_bytes) if isinstance(input_bytes, (int, float)) else float(rng.integers(*input_bytes))
    return Chain(layers, input_bytes=first)


def baseline_chain(rng: np.random.Generator, L: int) -> Chain:
    """Weights up to 1000 bytes against activations up to 100: stages differ a lot in memory."""
    return uniform_chain(rng, L, forward=(0.1, 2), backward=(0.2, 4), weights=(0, 1000), saved=(1, 100),
                         input_bytes=10.0)


def small_chain(rng: np.random.Generator, L: int) -> Chain:
    """Weights and activations of the same size (up to 100 and 60 bytes)."""
    return uniform_chain(rng, L, forward=(0.1, 2), backward=(0.2, 4), weights=(0, 100), saved=(1, 60),
                         input_bytes=(1, 50))


def ilp_chain(rng: np.random.Generator, L: int) -> Chain:
    """Times spread over a factor 20, every layer with some weights and activations."""
    return uniform_chain(rng, L, forward=(0.5, 10), backward=(0.5, 20), weights=(1, 60), saved=(1, 40),
                         input_bytes=(1, 40))


def footprint_limit(chain: Chain, P: int, rng: np.random.Generator, lo: float, hi: float) -> float:
    """A memory limit ``lo..hi`` times the least any allocation could need: the largest layer's footprint
    (saved + weights) or an even share of all footprints."""
    foot = chain.saved_array + chain.weights
    return max(float(foot.max()), float(foot.sum()) / P) * float(rng.uniform(lo, hi))


def py_chain(rng: random.Random, L: int) -> Chain:
    """Whole-number bytes, some layers saving more than their input (``saved_bytes``), the rest the default."""
    return Chain(tuple(Layer(f"l{i}", rng.uniform(0.5, 3.0), rng.uniform(0.5, 5.0), rng.randint(1, 50),
                             rng.randint(1, 20), rng.choice([None, rng.randint(1, 30)])) for i in range(L)),
                 input_bytes=rng.randint(1, 20))


def py_contiguous(rng: random.Random, L: int, P: int) -> list[int]:
    """A random contiguous allocation: 1..min(L, P) stages at random cuts, on distinct random devices."""
    S = rng.randint(1, min(L, P))
    cuts = set(rng.sample(range(1, L), S - 1))
    devs = rng.sample(range(P), S)
    out, s = [], 0
    for layer in range(L):
        s += layer in cuts
        out.append(devs[s])
    return out


def py_general(rng: random.Random, L: int, P: int) -> list[int]:
    """A random general allocation: each layer on any device."""
    return [rng.randrange(P) for _ in range(L)]


def compositions(L: int, P: int):
    """Every partition of 0..L-1 into at most P contiguous runs, as (first, last) lists.

    >>> list(compositions(3, 2))
    [[(0, 2)], [(0, 0), (1, 2)], [(0, 1), (2, 2)]]
    """
    for q in range(1, min(L, P) + 1):
        for cuts in itertools.combinations(range(1, L), q - 1):
            edges = (0,) + cuts + (L,)
            yield [(edges[s], edges[s + 1] - 1) for s in range(q)]


def runtime_chain(n: int = 6) -> Chain:
    """A small chain for the runtime's program, message and export tests (times alternate, sizes fixed)."""
    return Chain(tuple(Layer(f"l{i}", 0.001 * (1 + i % 3), 0.002 * (1 + i % 2), 100, 50) for i in range(n)))


def runtime_plans():
    """Three plans of :func:`runtime_chain`: 2 and 3 contiguous stages, and 4 stages on 2 ranks (rank 0 holds
    stages 0 and 2, rank 1 stages 1 and 3)."""
    chain = runtime_chain()
    yield best_schedule(chain, Target.of(2), [0, 0, 0, 1, 1, 1])
    yield best_schedule(chain, Target.of(3), [0, 0, 1, 1, 2, 2])
    yield best_schedule(chain, Target.of(2), [0, 0, 1, 1, 0, 1])


def block_chain(rng: np.random.Generator, L: int) -> Chain:
    """The coarsening tests' chain: times over a factor 20, whole-number weights and activations."""
    return Chain(tuple(Layer(f"l{i}", float(rng.uniform(0.5, 10)), float(rng.uniform(0.5, 20)),
                             float(rng.integers(1, 60)), float(rng.integers(1, 40))) for i in range(L)),
                 input_bytes=8.0)


def covers(groups, L: int) -> bool:
    """Whether ``groups`` (first, last) cover layers 0..L-1 in order, without gaps or overlaps."""
    return groups[0][0] == 0 and groups[-1][1] == L - 1 and all(
        b + 1 == a for (_, b), (a, _) in zip(groups, groups[1:])) and all(a <= b for a, b in groups)
