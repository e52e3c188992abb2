"""What a plan is made for: the hardware, the training set-up and the layout (docs/model.md, "Instance").

A :class:`Target` pairs a :class:`~workbench.model.chain.Platform` (the GPUs, their memory, the links, the
nodes) with a :class:`~workbench.model.training_setup.TrainingSetup` (what a device's memory holds besides the
activations) and a :class:`~workbench.model.layout.Layout` (how the GPUs split the job: tp x pp x dp; by default
every GPU a pipeline stage). Planners, the checker, the simulator and the memory model take one and plan the
layout's pipeline: its ``devices`` (the ``P`` they read) are the layout's ``pp`` pipeline ranks, and the hardware
accessors (``memory_of``, ``memory_limit``, ``node_of``, ``comm_time``, ``host_time``) take a pipeline rank and read
the GPU it sits on (:meth:`Target.device_of`: ranks (p, 0, 0) of the layout's mesh, tp and dp innermost). A plan
records the set-up and links (its ``memory_setup``); :meth:`Target.for_layout` is the target of one layout's
pipeline.

>>> t = Target.of(4, memory="16GiB", optimizer="sgd")
>>> t.platform.devices, t.devices, t.setup.optimizer, t.memory_limit == 16 * 2**30
(4, 4, 'sgd', True)
>>> t.with_(memory=1.0, zero_grad="zeros").setup.zero_grad
'zeros'
>>> lay = Target.on("h100-sxm", 16, devices_per_node=8).for_layout(Layout(tp=2, pp=4, dp=2, schedule="1f1b"))
>>> lay.devices, [lay.device_of(p) for p in range(4)], [lay.node_of(p) for p in range(4)], lay.layout.dp
(4, [0, 4, 8, 12], [0, 0, 1, 1], 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from workbench.model.chain import Platform
from workbench.model.layout import Layout
from workbench.model.training_setup import DATA_PARALLEL_KEYS, SETUP_KEYS, TrainingSetup

__all__ = ["Target", "HARDWARE_KEYS"]

#: the keywords of :class:`~workbench.model.chain.Platform`
HARDWARE_KEYS = tuple(f.name for f in fields(Platform))


def _split(kw: dict[str, Any], layout: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kw`` as (the platform's keywords, the set-up's), and with ``layout`` the layout's data-parallel group
    (``dp``, ``zero``) among the set-up's; a keyword of none is an error naming it."""
    known = set(SETUP_KEYS) | (set(DATA_PARALLEL_KEYS) if layout else set())
    unknown = sorted(set(kw) - set(HARDWARE_KEYS) - known)
    if unknown:
        raise TypeError(f"unknown platform or set-up keyword(s): {', '.join(unknown)}")
    return ({k: v for k, v in kw.items() if k in HARDWARE_KEYS}, {k: v for k, v in kw.items() if k in known})


def _replicated(platform: Platform, setup: dict[str, Any]) -> tuple[Platform, Layout]:
    """The platform's devices as pipeline ranks, each a data-parallel group of ``setup``'s ``dp`` (popped, with
    ``zero``): the platform of every GPU (its nodes widened to ``dp`` GPUs per rank) and the layout."""
    dp, zero = (int(setup.pop(k, d)) for k, d in (("dp", 1), ("zero", 0)))
    if zero and dp == 1:
        raise ValueError(f"zero={zero} shards over the data-parallel group, but dp=1")
    if dp > 1 and setup.get("memory_model", "full") != "full":
        raise ValueError("data parallelism (dp > 1) needs the full memory model, not --memory-model paper")
    layout = Layout(pp=platform.devices, dp=dp, zero=zero)
    if dp == 1:
        return platform, layout
    per_node = platform.devices_per_node
    return platform.with_(devices=layout.devices, devices_per_node=None if per_node is None else per_node * dp), layout


@dataclass(frozen=True)
class Target:
    """A platform (hardware), a training set-up (defaults: :class:`TrainingSetup`'s) and a layout of the
    platform's GPUs (default ``Layout(pp=platform.devices)``: every GPU a pipeline stage, as a plan without a layout
    is made). The layout uses every GPU of the platform (``tp x pp x dp = platform.devices``)."""

    platform: Platform
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    layout: Layout = None  # type: ignore[assignment]   # None: every GPU a pipeline stage

    def __post_init__(self) -> None:
        if not isinstance(self.platform, Platform):
            raise TypeError(f"a Target's platform must be a Platform, got {type(self.platform).__name__}")
        if not isinstance(self.setup, TrainingSetup):
            raise TypeError(f"a Target's setup must be a TrainingSetup, got {type(self.setup).__name__}")
        if self.layout is None:
            object.__setattr__(self, "layout", Layout(pp=self.platform.devices))
        if not isinstance(self.layout, Layout):
            raise TypeError(f"a Target's layout must be a Layout, got {type(self.layout).__name__}")
        if self.layout.devices != self.platform.devices:
            raise ValueError(f"layout tp={self.layout.tp} x pp={self.layout.pp} x dp={self.layout.dp} uses "
                             f"{self.layout.devices} GPUs, not the platform's {self.platform.devices}")

    @classmethod
    def of(cls, devices: int, **kw: Any) -> "Target":
        """``devices`` devices, ``kw`` split between the platform's keywords and the set-up's (a shorthand for
        notebooks and tests: ``Target(Platform(devices, ...), TrainingSetup(...))``); with ``dp`` (and ``zero``)
        each of the ``devices`` pipeline ranks a data-parallel group of ``dp`` GPUs, ``dp x devices`` in all
        (``devices_per_node`` counting pipeline ranks).

        >>> Target.of(2, memory_model="paper", weight_factor=2.0).setup.weight_factor
        2.0
        >>> t = Target.of(2, dp=4, zero=1)
        >>> t.devices, t.platform.devices, t.layout.describe()
        (2, 8, 'TP 1 x PP 2 x DP 4, ZeRO-1')
        """
        hardware, setup = _split(kw, layout=True)
        platform, layout = _replicated(Platform(devices, **hardware), setup)
        return cls(platform, TrainingSetup(**setup), layout)

    @classmethod
    def on(cls, gpu: str, devices: int, **kw: Any) -> "Target":
        """``devices`` of the named GPU (:meth:`Platform.on`), ``kw`` split as in :meth:`of`."""
        hardware, setup = _split(kw, layout=True)
        platform, layout = _replicated(Platform.on(gpu, devices, **hardware), setup)
        return cls(platform, TrainingSetup(**setup), layout)

    def with_(self, **kw: Any) -> "Target":
        """This target with some platform and set-up fields changed (each key goes where it belongs); a new
        number of ``devices`` makes each GPU a pipeline stage again (the default layout; a layout's data-parallel
        group is changed with :meth:`for_layout`)."""
        hardware, setup = _split(kw)
        platform = self.platform.with_(**hardware) if hardware else self.platform
        layout = self.layout if platform.devices == self.platform.devices else Layout(pp=platform.devices)
        return replace(self, platform=platform, setup=self.setup.with_(**setup) if setup else self.setup,
                       layout=layout)

    def for_layout(self, layout: Layout, flushed: bool | None = None) -> "Target":
        """The target of one pipeline of ``layout`` (docs/model.md, "Instance"): its ``devices`` the layout's
        ``pp`` pipeline ranks, each on the GPU of mesh rank (p, 0, 0), each rank's data-parallel group the layout's
        (``dp``, ``zero``: the memory model reads them from the layout; the paper's, rule 7, knows none: a replica's
        figure) and, for a ``flushed`` schedule (None: the layout's own, ``1f1b`` when it names none), one weight
        version (``weights="single"``: torch's engine, where every copy of a tied parameter takes its own optimizer
        step).

        This target's platform is either every GPU of the layout (a job's) or the ``pp`` GPUs of one pipeline as
        a plan records them (``check``, ``run``: its ``devices_per_node`` counts pipeline ranks); that one is
        widened to the layout's GPUs, ``tp x dp`` to each pipeline rank.

        >>> t = Target.of(8, devices_per_node=4).for_layout(Layout(pp=2, dp=4, zero=1))
        >>> t.devices, t.platform.devices, t.multi_node, (t.layout.dp, t.layout.zero, t.setup.weights)
        (2, 8, True, (4, 1, 'single'))
        >>> Target.of(2, devices_per_node=1).for_layout(Layout(pp=2, dp=4)).platform.devices_per_node
        4
        """
        platform, width = self.platform, layout.tp * layout.dp
        if platform.devices != layout.devices:
            if platform.devices != layout.pp:
                raise ValueError(f"layout tp={layout.tp} x pp={layout.pp} x dp={layout.dp} uses {layout.devices} "
                                 f"GPUs; the platform has {platform.devices} (neither those nor a pipeline's)")
            per_node = platform.devices_per_node
            platform = platform.with_(devices=layout.devices, devices_per_node=None if per_node is None
                                      else per_node * width)
        if flushed is None:
            from workbench.methods import method

            flushed = method(layout.schedule or "1f1b").family == "flushed"
        return Target(platform, self.setup.with_(weights="single") if flushed else self.setup, layout)

    # ----- the hardware, read through the platform -----------------------
    @property
    def devices(self) -> int:
        """The pipeline ranks a planner plans for (``P``): the layout's ``pp``."""
        return self.layout.pp

    def device_of(self, rank: int) -> int:
        """The GPU (the platform's device) pipeline rank ``rank`` sits on: mesh rank (rank, 0, 0)."""
        return int(rank) * self.layout.tp * self.layout.dp

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
        """Pipeline ranks per node (None: one node): the node's GPUs over the ``tp x dp`` of each rank, at least 1
        (a rank's GPUs fill a node or more: each rank on nodes of its own)."""
        per_node = self.platform.devices_per_node
        return None if per_node is None else max(1, per_node // (self.layout.tp * self.layout.dp))

    @property
    def gpu(self) -> str | None:
        return self.platform.gpu

    @property
    def multi_node(self) -> bool:
        """The pipeline spans nodes: some two of its ranks talk over the node link."""
        return self.platform.devices_per_node is not None and self.node_of(0) != self.node_of(self.devices - 1)

    @property
    def memory_limit(self) -> float:
        """The memory limit every pipeline rank shares (``memory_of`` of each; an error where they differ)."""
        limits = {self.memory_of(p) for p in range(self.devices)}
        if len(limits) > 1:
            from workbench.model.units import format_bytes

            raise ValueError(f"the devices' memory limits differ ({', '.join(map(format_bytes, sorted(limits)))}): "
                             "this planner takes one limit for every device")
        return limits.pop()

    def memory_of(self, device: int) -> float:
        """Bytes pipeline rank ``device`` may hold: its GPU's limit."""
        return self.platform.memory_of(self.device_of(device))

    def node_of(self, device: int) -> int:
        """The node of pipeline rank ``device``'s GPU."""
        return self.platform.node_of(self.device_of(device))

    def comm_time(self, nbytes: float, src: int | None = None, dst: int | None = None) -> float:
        """Seconds to send ``nbytes`` from pipeline rank ``src`` to ``dst`` (their GPUs' link)."""
        return self.platform.comm_time(nbytes, None if src is None else self.device_of(src),
                                       None if dst is None else self.device_of(dst))

    def host_time(self, nbytes: Any, device: int | None = None) -> Any:
        return self.platform.host_time(nbytes, None if device is None else self.device_of(device))
