"""The step time of FSDP (fully sharded data parallelism) from per-layer times: the calibration's arithmetic.

``benchmarks/roofline.py`` calibrates the time model on torchtitan's Llama-3.1-8B trained with FSDP on 8
H100s, and ``benchmarks/large_models.py`` prints it: both need a whole training step from the fake profile's
per-layer times. One step of FSDP (torch's ``fully_shard``, FSDP2) on ``n`` GPUs, each its own micro-batch:

* the model is cut into **units** (each ``fully_shard``-ed module: the transformer blocks, and the root with
  the embedding, final norm and output), each holding 1/n of its parameters;
* **forward**: before a unit runs, its parameters are all-gathered (bf16 under torchtitan's mixed precision);
  the first unit's all-gather is exposed, every later one is prefetched behind the previous unit's compute:
  ``max(F_i, AG_{i+1})``;
* **backward**, units in reverse: a unit resharded after its forward is all-gathered again, prefetched
  behind the next unit's backward, whose gradients' reduce-scatter (float32) runs behind it too:
  ``max(B_j, AG_{j-1} + RS_{j+1})``; the last reduce-scatter is exposed;
* then the **optimizer step** on the local shard (:mod:`workbench.profiles.optimizer_time`) and gradient-norm
  clipping.

Collectives are priced as rings over the node's links (:func:`ring_seconds`): an all-gather or a
reduce-scatter of B bytes moves (n-1)/n B through each GPU's link, an all-reduce 2(n-1)/n B, at the
link's one-way bandwidth times :data:`COLLECTIVE_EFFICIENCY`. This is a stand-in for the shared collective
prices of ``workbench.parallel`` (the layouts' model) and is meant to be swapped for them. Contention of
the collectives with the compute kernels is not modelled (the calibration's ``sustained`` takes it in).

>>> units = [Unit("block", 0.010, 0.020, 200e6)] * 4
>>> step = fsdp_step(units, 8, 450e9)
>>> step.compute == 4 * 0.030, 0 < step.exposed < 0.003
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["COLLECTIVE_EFFICIENCY", "ring_seconds", "Unit", "FsdpStep", "fsdp_step"]

#: NCCL on 8 H100s through NVSwitch reaches 78 % of the one-way NVLink bandwidth (450 GB/s) in large all-gathers:
#: openxla/xla, xla/service/gpu/model/collective_interpolator_data.h (key "sm_90", all-gather of 2^27 to 2^29
#: float32 elements over 8 devices: 386-402 GB/s of algorithm bandwidth, i.e. 338-352 GB/s through each link)
COLLECTIVE_EFFICIENCY = 0.78
_RING_FACTOR = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0}


def ring_seconds(kind: str, nbytes: float, n: int, bandwidth: float, efficiency: float = COLLECTIVE_EFFICIENCY,
                 latency: float = 0.0) -> float:
    """Seconds of a ring ``kind`` (all-gather, reduce-scatter: ``nbytes`` the full tensor; all-reduce) over
    ``n`` GPUs on links of ``bandwidth`` bytes/s one way.

    >>> round(ring_seconds("all-reduce", 1e9, 8, 100e9, 1.0) / ring_seconds("all-gather", 1e9, 8, 100e9, 1.0), 6)
    2.0
    >>> ring_seconds("all-gather", 1e9, 1, 100e9)
    0.0
    """
    if kind not in _RING_FACTOR:
        raise ValueError(f"collective {kind!r}: known {sorted(_RING_FACTOR)}")
    if n <= 1 or nbytes <= 0:
        return 0.0
    return latency + _RING_FACTOR[kind] * (n - 1) / n * nbytes / (bandwidth * efficiency)


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard``-ed unit, in forward order: its compute seconds forward and backward (backward with
    any recompute) on one GPU, its parameters (elements), and whether it is all-gathered again for the
    backward (resharded after its forward)."""

    name: str
    forward: float
    backward: float
    params: float
    regather: bool = True


@dataclass(frozen=True)
class FsdpStep:
    """One step's seconds: ``compute`` (forward + backward of every unit), ``exposed`` (collectives not hidden
    behind compute), ``optimizer`` (the step and clipping), ``total``."""

    compute: float
    exposed: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.compute + self.exposed + self.optimizer


def fsdp_step(units: Sequence[Unit], gpus: int, bandwidth: float, *, param_bytes: float = 2.0,
              grad_bytes: float = 4.0, optimizer: float = 0.0,
              efficiency: float = COLLECTIVE_EFFICIENCY) -> FsdpStep:
    """The step of :class:`Unit` ``units`` under FSDP on ``gpus`` GPUs of one node (module docstring);
    ``param_bytes``/``grad_bytes``: bytes per element all-gathered/reduce-scattered; ``optimizer``: its seconds."""
    ag = [ring_seconds("all-gather", u.params * param_bytes, gpus, bandwidth, efficiency) for u in units]
    rs = [ring_seconds("reduce-scatter", u.params * grad_bytes, gpus, bandwidth, efficiency) for u in units]
    n = len(units)
    forward = ag[0] if n else 0.0
    for i, u in enumerate(units):
        forward += max(u.forward, ag[i + 1] if i + 1 < n else 0.0)
    backward = 0.0
    for j in range(n - 1, -1, -1):
        hidden = (ag[j - 1] if j > 0 and units[j - 1].regather else 0.0) + (rs[j + 1] if j + 1 < n else 0.0)
        backward += max(units[j].backward, hidden)
    backward += rs[0] if n else 0.0
    compute = sum(u.forward + u.backward for u in units)
    return FsdpStep(compute, forward + backward - compute, optimizer)
