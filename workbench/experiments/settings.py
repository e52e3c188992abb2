"""What the user chooses for the experiments: the settings (part of every unit's key) and the figure names.

The methods the sweeps compare are the registry's variants
(:data:`workbench.methods.VARIANTS`): :data:`METHOD_KEYS` maps each key to
its (planner, allocation), :data:`METHOD_LABELS` to its legend label.

>>> settings_for(quick=True, networks=("resnet50",)).devices
(2, 4)
>>> METHOD_KEYS["ilp-general"], METHOD_LABELS["dp"]
(('ilp', 'general'), 'memory-aware DP')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from workbench.methods import VARIANTS
from workbench.model.target import Target
from workbench.model.training_setup import DEFAULT_BANDWIDTH

__all__ = ["Settings", "settings_for", "platform_for", "METHOD_KEYS", "METHOD_LABELS", "SWEEP_FIGURES",
           "COMPLEXITY_FIGURES", "FIGURES", "TOL"]

#: method key -> (planner name, allocation), in legend order
METHOD_KEYS: dict[str, tuple[str, str]] = {v.key: (v.method, v.allocation) for v in VARIANTS}
#: method key -> legend label
METHOD_LABELS: dict[str, str] = {v.key: v.label for v in VARIANTS}
SWEEP_FIGURES = ("throughput", "memory", "min_memory", "solve_times", "schedules")
COMPLEXITY_FIGURES = ("three_partition", "family", "scaling", "gains", "largest")
FIGURES = SWEEP_FIGURES + COMPLEXITY_FIGURES
#: relative tolerance of the experiments' comparisons (equal periods, bounds, memory levels)
TOL = 1e-6


@dataclass(frozen=True)
class Settings:
    """Everything the user chooses that determines the results (part of every unit's key)."""

    networks: tuple[str, ...]
    devices: tuple[int, ...] = (2, 4, 8)
    n_levels: int = 6
    time_limit: float = 60.0
    general_time_limit: float = 20.0  # per general-ILP solve: the time-outs dominate the run
    methods: tuple[str, ...] = tuple(METHOD_KEYS)
    bandwidth: str = DEFAULT_BANDWIDTH
    weight_factor: float = 1.0
    weights: str = "stash"
    memory_model: str = "paper"   # the paper's figures use its rule 7 (model/memory.py); "full" for the device model
    # complexity study
    scaling_layers: tuple[int, ...] = (4, 8, 12, 16, 24, 32)
    scaling_devices: tuple[int, ...] = (2, 4, 8)
    scaling_time_limit: float = 60.0
    scaling_seeds: tuple[int, ...] = (0,)
    gain_instances: int = 100
    gain_layers: int = 8
    gain_devices: int = 3
    gain_positions: tuple[float, ...] = (0.0, 0.25, 0.5)
    three_partition_m: tuple[int, ...] = (2, 3)
    three_partition_count: int = 3
    family_k: tuple[int, ...] = (2, 3, 4, 6, 8)
    # the largest model that fits (workbench.experiments.largest; the full memory model, Adam, fp32)
    largest_families: tuple[str, ...] = ("depth", "width")
    largest_devices: tuple[int, ...] = (2, 4, 8)
    largest_memory: float = 2 * 2**30
    largest_time_limit: float = 10.0
    largest_ilp: bool = True
    quick: bool = False

    def with_(self, **kw: Any) -> "Settings":
        return dataclasses.replace(self, **kw)


def _default_networks(quick: bool) -> tuple[str, ...]:
    from workbench.profiles import available_profiles

    # bundled CPU profiles and PipeDream's; the GPU ones (h100/...) are named explicitly when wanted
    names = [n for n in available_profiles() if "/" not in n or n.startswith("pipedream/")]
    if quick:
        pick = [n for n in ("resnet50", "gpt-small") if n in names]
        return tuple(pick or names[:1])
    return tuple(names)


def settings_for(quick: bool = False, **overrides: Any) -> Settings:
    """The full or quick settings; ``overrides`` replace fields (e.g. ``networks=("resnet50",)``)."""
    if quick:
        s = Settings(networks=(), devices=(2, 4), n_levels=3, time_limit=5.0, general_time_limit=5.0,
                     scaling_layers=(4, 8), scaling_devices=(2, 4), scaling_time_limit=5.0, gain_instances=12,
                     gain_layers=6, gain_devices=2, gain_positions=(0.0, 0.3), three_partition_m=(2,),
                     three_partition_count=2, family_k=(2, 3), largest_devices=(2,), largest_ilp=False, quick=True)
    else:
        s = Settings(networks=())
    if "networks" not in overrides:
        overrides["networks"] = _default_networks(quick)
    return s.with_(**overrides)


def platform_for(s: Settings, devices: int) -> Target:
    """The platform of a sweep on ``devices`` devices under settings ``s`` (no memory limit yet)."""
    return Target.of(devices, bandwidth=s.bandwidth, weight_factor=s.weight_factor, weights=s.weights,
                    memory_model=s.memory_model)
