"""The instance: a chain of layers and the platform it runs on (docs/model.md, "Instance").

Inside the package times are seconds and sizes bytes; profile files keep
milliseconds. Everything is a frozen dataclass so it can be cached and shared.

>>> from workbench.model.chain import Layer, Chain, Platform
>>> chain = Chain((Layer("a", 0.001, 0.002, 100, 10), Layer("b", 0.003, 0.004, 50, 20)), input_bytes=8)
>>> chain.saved(1)            # default: the layer's input, i.e. a's output
10.0
>>> chain.stage_costs(0, 1).forward
0.004
>>> Platform(devices=2, memory="1GiB").memory
1073741824.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from workbench.model.accelerators import DEFAULT_NODE_BANDWIDTH
from workbench.model.memory_views import merged_memory_columns
from workbench.model.ties import remap_ties
from workbench.model.units import bytes_value, format_bytes, format_seconds, parse_bandwidth, parse_size

if TYPE_CHECKING:  # workbench.model.graph builds chains (Graph.linearise): the annotation only names the type
    from workbench.model.graph import Graph

#: PCIe 4.0 x16, one direction: 16 GT/s x 16 lanes x 128b/130b encoding = 31.5 GB/s
#: (PCI Express Base Specification 4.0); pinned copies reach about 25 GB/s in practice
DEFAULT_HOST_BANDWIDTH = 31.5e9

__all__ = ["Layer", "Chain", "Platform", "StageCosts", "MEMORY_COLUMNS", "OPTIONAL_COLUMNS",
           "SPLIT_FIELDS", "COMM_FIELDS", "OVERLAP_FIELDS", "DEFAULT_HOST_BANDWIDTH"]

#: the profiler's memory columns beyond saved_bytes (docs/model.md, "Memory")
MEMORY_COLUMNS = ("grad_bytes", "max_param_bytes", "saved_input_bytes", "saved_output_bytes",
                  "forward_peak_bytes", "backward_peak_bytes", "backward_fresh_peak_bytes")
OPTIONAL_COLUMNS = ("saved_bytes",) + MEMORY_COLUMNS
#: the backward's split into input- and weight-gradient work (docs/model.md, "Backward split")
SPLIT_FIELDS = ("backward_weight", "weight_pending_bytes")
#: a layer's collectives (tensor parallelism), bytes per phase (docs/model.md, "Tensor parallelism")
COMM_FIELDS = ("comm_forward_bytes", "comm_backward_bytes")
#: a layer's collectives in seconds, and what they add to its phase when they overlap its GEMMs (tensor parallelism's
#: communication overlap, docs/model.md, "Tensor parallelism", "Communication overlap")
OVERLAP_FIELDS = ("comm_forward", "comm_backward", "exposed_forward", "exposed_backward")


@dataclass(frozen=True)
class Layer:
    """One layer of the chain. Times in seconds, sizes in bytes.

    ``activation_bytes`` is the layer's output (sent forward, and the size of
    the gradient sent back). ``saved_bytes`` is what autograd keeps from the
    forward until the backward; ``None`` means "the layer's input size". The
    memory columns (``grad_bytes`` ... ``backward_peak_bytes``, see
    :mod:`workbench.model.memory` and docs/model.md) are measured by the profiler;
    ``None`` means "not measured" (the memory model then estimates them).
    """

    name: str
    forward: float
    backward: float
    weight_bytes: float = 0.0
    activation_bytes: float = 0.0
    saved_bytes: float | None = None
    grad_bytes: float | None = None
    max_param_bytes: float | None = None
    saved_input_bytes: float | None = None
    saved_output_bytes: float | None = None
    forward_peak_bytes: float | None = None
    backward_peak_bytes: float | None = None
    #: bytes this layer's activation policy moves to host memory and back per mini-batch (``offload``;
    #: docs/model.md, "Activation policies"): 0 for profiled layers, set by
    #: :func:`workbench.model.activations.apply_policies`
    offload_bytes: float = 0.0
    #: the weight-gradient share of ``backward`` (seconds) and the bytes held from the input-gradient part
    #: to the weight-gradient part (docs/model.md, "Backward split"; :mod:`workbench.model.split`):
    #: ``None`` means not measured (estimated)
    backward_weight: float | None = None
    weight_pending_bytes: float | None = None
    #: the backward's peak when its gradients do not exist yet (written fresh, as after torch's default
    #: ``zero_grad()``); ``backward_peak_bytes`` adds into gradients that exist
    backward_fresh_peak_bytes: float | None = None
    #: bytes of the tensors the layer's collectives move in its forward and in its backward (tensor parallelism:
    #: an all-reduce's tensor, an all-gather's output, a reduce-scatter's input; docs/model.md, "Tensor
    #: parallelism"), their time already in ``forward``/``backward``; ``None``: not measured (no collectives)
    comm_forward_bytes: float | None = None
    comm_backward_bytes: float | None = None
    #: seconds of those collectives (part of ``forward``/``backward``), and the seconds they and the GEMMs they
    #: overlap add to the phase beyond its compute when they overlap (``Layout.tp_overlap``; docs/model.md,
    #: "Communication overlap"); ``None``: not measured (the overlap cannot be priced)
    comm_forward: float | None = None
    comm_backward: float | None = None
    exposed_forward: float | None = None
    exposed_backward: float | None = None

    def __post_init__(self) -> None:
        for f in ("forward", "backward", "weight_bytes", "activation_bytes", "offload_bytes") + OPTIONAL_COLUMNS \
                + SPLIT_FIELDS + COMM_FIELDS + OVERLAP_FIELDS:
            v = getattr(self, f)
            if v is None and f in OPTIONAL_COLUMNS + SPLIT_FIELDS + COMM_FIELDS + OVERLAP_FIELDS:
                continue
            if not isinstance(v, (int, float, np.floating, np.integer)) or math.isnan(v) or v < 0 or math.isinf(v):
                raise ValueError(f"layer {self.name!r}: {f} must be a finite non-negative number, got {v!r}")
        if self.backward_weight is not None and self.backward_weight > self.backward * (1 + 1e-9):
            raise ValueError(f"layer {self.name!r}: backward_weight {self.backward_weight!r} exceeds its backward "
                             f"{self.backward!r} (it is a part of it)")


def _merged_split(layers: Sequence[Layer]) -> dict[str, float | None]:
    """The backward split and the collectives' bytes of merged layers: sums, or None (estimated, not measured)
    when any of them lacks it."""
    out: dict[str, float | None] = {}
    for f in SPLIT_FIELDS + COMM_FIELDS + OVERLAP_FIELDS:
        values = [getattr(l, f) for l in layers]
        out[f] = None if any(v is None for v in values) else float(sum(values))
    return out


@dataclass(frozen=True)
class StageCosts:
    """Sums over a run of layers ``first..last`` (inclusive).

    ``comm`` is the boundary cost after the run (seconds) when a platform was
    given, else 0; ``cut_bytes`` is the volume crossing that boundary.
    """

    first: int
    last: int
    forward: float
    backward: float
    saved: float
    weights: float
    cut_bytes: float
    comm: float = 0.0

    @property
    def compute(self) -> float:
        return self.forward + self.backward


@dataclass(frozen=True)
class Chain:
    """An ordered chain of layers.

    ``cut_bytes[i]`` is the volume that crosses a stage boundary placed after
    layer ``i`` (length L-1). For a pure chain it is layer i's output; a DAG
    linearised into a chain counts every edge crossing the cut. ``meta`` holds
    profile metadata (network, device, batch size...). ``graph`` is the DAG the
    chain was linearised from (a :class:`workbench.model.graph.Graph`),
    or ``None`` for a true chain; graph-aware planners may re-order with it.
    """

    layers: tuple[Layer, ...]
    input_bytes: float = 0.0
    cut_bytes: tuple[float, ...] | None = None
    meta: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    graph: Graph | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise ValueError("a chain needs at least one layer")
        names = [l.name for l in self.layers]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate layer names: {dup}")
        if self.cut_bytes is not None:
            cb = tuple(float(c) for c in self.cut_bytes)
            if len(cb) != len(self.layers) - 1:
                raise ValueError(f"cut_bytes needs {len(self.layers) - 1} entries, got {len(cb)}")
            if any(c < 0 or math.isnan(c) for c in cb):
                raise ValueError("cut_bytes must be non-negative")
            object.__setattr__(self, "cut_bytes", cb)
        object.__setattr__(self, "meta", dict(self.meta))
        if self.meta.get("runtime_bytes") not in (None, ""):      # every device's memory adds it
            bytes_value(self.meta["runtime_bytes"], f"{self.name}: runtime_bytes")

    # ----- basic views -------------------------------------------------
    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Layer:
        return self.layers[i]

    @property
    def name(self) -> str:
        return str(self.meta.get("network", "chain"))

    def saved(self, l: int) -> float:
        """Bytes autograd keeps for layer ``l`` (explicit, or its input size)."""
        s = self.layers[l].saved_bytes
        if s is not None:
            return float(s)
        return float(self.input_bytes if l == 0 else self.layers[l - 1].activation_bytes)

    def cut(self, l: int) -> float:
        """Bytes crossing a boundary after layer ``l`` (0 after the last layer)."""
        if l >= len(self.layers) - 1:
            return 0.0
        if self.cut_bytes is not None:
            return self.cut_bytes[l]
        return float(self.layers[l].activation_bytes)

    # ----- arrays and prefix sums for fast planners ----------------------
    @cached_property
    def forward(self) -> np.ndarray:
        return np.array([l.forward for l in self.layers], dtype=float)

    @cached_property
    def backward(self) -> np.ndarray:
        return np.array([l.backward for l in self.layers], dtype=float)

    @cached_property
    def weights(self) -> np.ndarray:
        return np.array([l.weight_bytes for l in self.layers], dtype=float)

    @cached_property
    def saved_array(self) -> np.ndarray:
        return np.array([self.saved(i) for i in range(len(self))], dtype=float)

    @cached_property
    def cuts(self) -> np.ndarray:
        """Length-L array: bytes crossing a cut after each layer (last entry 0)."""
        return np.array([self.cut(i) for i in range(len(self))], dtype=float)

    @cached_property
    def _prefix_lists(self) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
        """``_prefix``'s f, b, a, w as Python lists, and the cut bytes: for planners that sum many stages."""
        p = self._prefix
        return (p["f"].tolist(), p["b"].tolist(), p["a"].tolist(), p["w"].tolist(),
                [self.cut(i) for i in range(len(self))])

    @cached_property
    def _prefix(self) -> dict[str, np.ndarray]:
        z = lambda a: np.concatenate([[0.0], np.cumsum(a)])  # noqa: E731
        return {"f": z(self.forward), "b": z(self.backward), "a": z(self.saved_array), "w": z(self.weights)}

    def stage_costs(self, first: int, last: int, platform: "Platform | None" = None) -> StageCosts:
        """Sums over layers ``first..last`` and the boundary cost after ``last``."""
        if not (0 <= first <= last < len(self)):
            raise IndexError(f"bad layer range [{first}, {last}] for a chain of {len(self)} layers")
        p = self._prefix
        cb = self.cut(last)
        comm = platform.comm_time(cb) if (platform is not None and last < len(self) - 1) else 0.0
        return StageCosts(
            first, last,
            float(p["f"][last + 1] - p["f"][first]),
            float(p["b"][last + 1] - p["b"][first]),
            float(p["a"][last + 1] - p["a"][first]),
            float(p["w"][last + 1] - p["w"][first]),
            cb, comm,
        )

    @property
    def total_compute(self) -> float:
        return float(self.forward.sum() + self.backward.sum())

    # ----- transformations ------------------------------------------------
    def with_meta(self, **kw: str) -> "Chain":
        return replace(self, meta={**self.meta, **{k: str(v) for k, v in kw.items()}})

    def coarsen(self, groups: Sequence[tuple[int, int]]) -> "Chain":
        """Merge each ``(first, last)`` group of consecutive layers into one layer.

        Groups must cover the chain in order. The merged layer's output and
        the cut after it are those of its last layer; its memory columns are
        such that the memory model gives every stage of merged layers what it
        gives the same stage of the original ones
        (:func:`workbench.model.memory_views.merged_memory_columns`).

        >>> c = Chain(tuple(Layer(f"l{i}", 1, 1, 1, 1) for i in range(4)))
        >>> len(c.coarsen([(0, 1), (2, 3)]))
        2
        """
        expect = 0
        for a, b in groups:
            if a != expect or b < a:
                raise ValueError(f"groups must cover the chain in order; got {list(groups)}")
            expect = b + 1
        if expect != len(self):
            raise ValueError(f"groups cover {expect} of {len(self)} layers")
        layers = []
        for a, b in groups:
            s = self.stage_costs(a, b)
            name = self.layers[a].name if a == b else f"{self.layers[a].name}..{self.layers[b].name}"
            layers.append(Layer(name, s.forward, s.backward, s.weights, self.layers[b].activation_bytes,
                                **merged_memory_columns(self, a, b),
                                offload_bytes=sum(float(l.offload_bytes) for l in self.layers[a:b + 1]),
                                **_merged_split(self.layers[a:b + 1])))
        cuts = tuple(self.cut(b) for _, b in groups[:-1])
        meta = {**self.meta, "coarsened_from": str(len(self))}
        meta.pop("tied", None)
        tied = remap_ties(self, list(groups), [l.name for l in layers])
        if tied:
            meta["tied"] = tied
        return Chain(tuple(layers), self.input_bytes, cuts, meta)

    # ----- tables ---------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row per layer: name, forward_ms, backward_ms, weight_bytes, activation_bytes, saved_bytes,
        cut_bytes, and each memory column the profile has (:data:`MEMORY_COLUMNS`), and its collectives' bytes
        (:data:`COMM_FIELDS`)."""
        cols: dict[str, Any] = {
            "name": [l.name for l in self.layers],
            "forward_ms": self.forward * 1e3,
            "backward_ms": self.backward * 1e3,
            "weight_bytes": self.weights,
            "activation_bytes": [float(l.activation_bytes) for l in self.layers],
            "saved_bytes": self.saved_array,
            "cut_bytes": self.cuts,
        }
        for c in MEMORY_COLUMNS + COMM_FIELDS:
            values = [getattr(l, c) for l in self.layers]
            if any(v is not None for v in values):
                cols[c] = [math.nan if v is None else float(v) for v in values]
        for c, column, scale in (("backward_weight", "backward_weight_ms", 1e3),
                                 ("weight_pending_bytes", "weight_pending_bytes", 1.0),
                                 *((f, f"{f}_ms", 1e3) for f in OVERLAP_FIELDS)):
            values = [getattr(l, c) for l in self.layers]
            if any(v is not None for v in values):
                cols[column] = [math.nan if v is None else float(v) * scale for v in values]
        return pd.DataFrame(cols)

    @classmethod
    def from_layers(cls, layers: Iterable[Layer], **kw) -> "Chain":
        return cls(tuple(layers), **kw)

    def summary(self) -> str:
        big = int(np.argmax([l.activation_bytes for l in self.layers]))
        return (
            f"{self.name}: {len(self)} layers, forward {format_seconds(self.forward.sum())}, "
            f"backward {format_seconds(self.backward.sum())}, parameters {format_bytes(self.weights.sum())}, "
            f"largest activation {format_bytes(self.layers[big].activation_bytes)} ({self.layers[big].name})"
        )


@dataclass(frozen=True)
class Platform:
    """P identical devices with memory M each, linked all-to-all: the hardware only (the training set-up a
    device's memory holds is a :class:`~workbench.model.training_setup.TrainingSetup`; a planner takes both
    as a :class:`~workbench.model.target.Target`). Strings are parsed:

    >>> Platform(4, memory="16GiB", bandwidth="12GB/s").bandwidth
    12000000000.0

    For what comes next (heterogeneous devices and links) planners ask ``memory_of(p)`` (or
    ``memory_limit``, the one limit all devices share), ``comm_time(bytes, p, q)`` and ``host_time(bytes)``
    rather than read the fields directly (tests/test_platform_accessors.py holds them to it).

    **Nodes** (docs/model.md, "Instance"): with ``devices_per_node`` N, devices d and e share a node when
    d // N == e // N and talk at ``bandwidth``; a pair on two nodes talks at ``node_bandwidth``
    (default: one 400 Gb/s InfiniBand port per GPU). ``gpu`` names the accelerator the platform was
    sized from (:mod:`workbench.model.accelerators`; a record, the numbers are the fields).

    >>> two = Platform(16, bandwidth="450GB/s", devices_per_node=8, node_bandwidth="50GB/s")
    >>> two.comm_time(1e9, 6, 7), two.comm_time(1e9, 7, 8), two.multi_node
    (0.0022222222222222222, 0.02, True)
    """

    devices: int
    memory: float = math.inf
    bandwidth: float = math.inf
    latency: float = 0.0
    #: bytes/s of each device's link to host memory (activation offload; docs/model.md,
    #: "Activation policies"): PCIe 4.0 x16, one direction, by default
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH
    #: devices per node (None: all on one node); a boundary between two nodes pays ``node_bandwidth``
    devices_per_node: int | None = None
    #: bytes/s one way between two devices of different nodes
    node_bandwidth: float = DEFAULT_NODE_BANDWIDTH
    #: the accelerator the platform was sized from (its name in workbench.model.accelerators), or None
    gpu: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.devices, (int, np.integer)) or self.devices < 1:
            raise ValueError(f"devices must be a positive integer, got {self.devices!r}")
        object.__setattr__(self, "devices", int(self.devices))
        object.__setattr__(self, "memory", parse_size(self.memory, what="memory"))
        object.__setattr__(self, "bandwidth", parse_bandwidth(self.bandwidth))
        object.__setattr__(self, "host_bandwidth", parse_bandwidth(self.host_bandwidth, what="host bandwidth"))
        object.__setattr__(self, "node_bandwidth", parse_bandwidth(self.node_bandwidth, what="node bandwidth"))
        n = self.devices_per_node
        if n is not None and (not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1):
            raise ValueError(f"devices per node must be a positive integer, got {n!r}")
        lat = float(self.latency)
        if lat < 0 or math.isnan(lat):
            raise ValueError(f"latency must be >= 0 seconds, got {self.latency!r}")
        object.__setattr__(self, "latency", lat)

    def memory_of(self, device: int) -> float:
        """Bytes device ``device`` may hold: the one accessor of a device's memory limit (docs/model.md,
        "Instance"); every device's ``memory`` today."""
        return self.memory

    @property
    def memory_limit(self) -> float:
        """The memory limit all devices share (``memory_of`` of each), for a planner that takes one ``M``;
        a clear error where the devices' limits differ.

        >>> Platform(4, memory="16GiB").memory_limit == Platform(4, memory="16GiB").memory_of(3) == 16 * 2**30
        True
        """
        limits = {self.memory_of(d) for d in range(self.devices)}
        if len(limits) > 1:
            raise ValueError(f"the devices' memory limits differ ({', '.join(map(format_bytes, sorted(limits)))}): "
                             "this planner takes one limit for every device")
        return limits.pop()

    @property
    def multi_node(self) -> bool:
        """More than one node: some pairs of devices talk over the node link."""
        return self.devices_per_node is not None and self.devices > self.devices_per_node

    def node_of(self, device: int) -> int:
        """The node of ``device`` (0 on one node)."""
        return 0 if self.devices_per_node is None else int(device) // self.devices_per_node

    def comm_time(self, nbytes: float, src: int | None = None, dst: int | None = None) -> float:
        """Seconds to send ``nbytes`` from device ``src`` to ``dst``: latency + bytes / the pair's bandwidth
        (``node_bandwidth`` between two nodes; ``bandwidth`` within one, and when the pair is not given)."""
        between = src is not None and dst is not None and self.node_of(src) != self.node_of(dst)
        bw = min(self.bandwidth, self.node_bandwidth) if between else self.bandwidth
        return self.latency + (nbytes / bw if math.isfinite(bw) else 0.0)

    def host_time(self, nbytes: Any, device: int | None = None) -> Any:
        """Seconds to move ``nbytes`` one way between a device and host memory (elementwise for an array).

        >>> Platform(1, host_bandwidth="2B/s").host_time(np.array([4.0, 6.0])).tolist()
        [2.0, 3.0]
        """
        return nbytes / self.host_bandwidth if math.isfinite(self.host_bandwidth) else nbytes * 0.0

    def with_(self, **kw) -> "Platform":
        return replace(self, **kw)

    @classmethod
    def on(cls, gpu: str, devices: int, **kw: Any) -> "Platform":
        """``devices`` of the named GPU (:mod:`workbench.model.accelerators`): its memory and its link within a
        node, unless ``kw`` gives them; the other fields from ``kw``.

        >>> p = Platform.on("h100-sxm", 16, devices_per_node=8)
        >>> p.memory, p.bandwidth, p.gpu, p.multi_node
        (80000000000.0, 450000000000.0, 'h100-sxm', True)
        """
        from workbench.model.accelerators import accelerator

        a = accelerator(gpu)
        return cls(devices, **{"memory": a.memory, "bandwidth": a.link_bandwidth, **kw, "gpu": a.name})
