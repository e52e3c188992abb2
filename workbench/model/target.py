"""What a plan is made for: the hardware and the training set-up (docs/model.md, "Instance").

A :class:`Target` pairs a :class:`~workbench.model.chain.Platform` (the devices, their memory, the links, the
nodes) with a :class:`~workbench.model.training_setup.TrainingSetup` (what a device's memory holds besides the
activations). Planners, the checker, the simulator and the memory model take one; they read the hardware through
the platform's accessors (``memory_of``, ``memory_limit``, ``comm_time``, ``host_time``, which the target
passes on) and the set-up as ``target.setup``. A plan records both (its ``memory_setup``: the set-up's keys and
the links it was made for).

>>> t = Target.of(4, memory="16GiB", optimizer="sgd")
>>> t.platform.devices, t.setup.optimizer, t.memory_limit == 16 * 2**30
(4, 'sgd', True)
>>> t.with_(memory=1.0, zero_grad="zeros").setup.zero_grad
'zeros'
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from workbench.model.chain import Platform
from workbench.model.training_setup import SETUP_KEYS, TrainingSetup

__all__ = ["Target", "HARDWARE_KEYS"]

#: the keywords of :class:`~workbench.model.chain.Platform`
HARDWARE_KEYS = tuple(f.name for f in fields(Platform))


def _split(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kw`` as (the platform's keywords, the set-up's); a keyword of neither is an error naming it."""
    unknown = sorted(set(kw) - set(HARDWARE_KEYS) - set(SETUP_KEYS))
    if unknown:
        raise TypeError(f"unknown platform or set-up keyword(s): {', '.join(unknown)}")
    return ({k: v for k, v in kw.items() if k in HARDWARE_KEYS}, {k: v for k, v in kw.items() if k in SETUP_KEYS})


@dataclass(frozen=True)
class Target:
    """A platform (hardware) and a training set-up; the set-up's defaults are :class:`TrainingSetup`'s."""

    platform: Platform
    setup: TrainingSetup = field(default_factory=TrainingSetup)

    def __post_init__(self) -> None:
        if not isinstance(self.platform, Platform):
            raise TypeError(f"a Target's platform must be a Platform, got {type(self.platform).__name__}")
        if not isinstance(self.setup, TrainingSetup):
            raise TypeError(f"a Target's setup must be a TrainingSetup, got {type(self.setup).__name__}")

    @classmethod
    def of(cls, devices: int, **kw: Any) -> "Target":
        """``devices`` devices, ``kw`` split between the platform's keywords and the set-up's (a shorthand for
        notebooks and tests: ``Target(Platform(devices, ...), TrainingSetup(...))``).

        >>> Target.of(2, memory_model="paper", weight_factor=2.0).setup.weight_factor
        2.0
        """
        hardware, setup = _split(kw)
        return cls(Platform(devices, **hardware), TrainingSetup(**setup))

    @classmethod
    def on(cls, gpu: str, devices: int, **kw: Any) -> "Target":
        """``devices`` of the named GPU (:meth:`Platform.on`), ``kw`` split as in :meth:`of`."""
        hardware, setup = _split(kw)
        return cls(Platform.on(gpu, devices, **hardware), TrainingSetup(**setup))

    def with_(self, **kw: Any) -> "Target":
        """This target with some platform and set-up fields changed (each key goes where it belongs)."""
        hardware, setup = _split(kw)
        return replace(self, platform=self.platform.with_(**hardware) if hardware else self.platform,
                       setup=self.setup.with_(**setup) if setup else self.setup)

    # ----- the hardware, read through the platform -----------------------
    @property
    def devices(self) -> int:
        return self.platform.devices

    @property
    def memory(self) -> float:
        return self.platform.memory

    @property
    def bandwidth(self) -> float:
        return self.platform.bandwidth

    @property
    def latency(self) -> float:
        return self.platform.latency

    @property
    def host_bandwidth(self) -> float:
        return self.platform.host_bandwidth

    @property
    def node_bandwidth(self) -> float:
        return self.platform.node_bandwidth

    @property
    def devices_per_node(self) -> int | None:
        return self.platform.devices_per_node

    @property
    def gpu(self) -> str | None:
        return self.platform.gpu

    @property
    def multi_node(self) -> bool:
        return self.platform.multi_node

    @property
    def memory_limit(self) -> float:
        return self.platform.memory_limit

    def memory_of(self, device: int) -> float:
        return self.platform.memory_of(device)

    def node_of(self, device: int) -> int:
        return self.platform.node_of(device)

    def comm_time(self, nbytes: float, src: int | None = None, dst: int | None = None) -> float:
        return self.platform.comm_time(nbytes, src, dst)

    def host_time(self, nbytes: Any, device: int | None = None) -> Any:
        return self.platform.host_time(nbytes, device)
