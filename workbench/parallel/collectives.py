"""What a collective costs on its links: ring all-reduce, all-gather, reduce-scatter (docs/model.md, "Layouts").

A group of ``n`` ranks moving a tensor of ``nbytes`` (the whole tensor: the all-reduced gradient, the gathered
parameter, the scattered gradient before it is split) with the ring algorithms NCCL and gloo use:

* all-gather and reduce-scatter: each rank sends and receives ``(n - 1) / n * nbytes`` in ``n - 1`` steps;
* all-reduce: a reduce-scatter then an all-gather, ``2 (n - 1) / n * nbytes`` in ``2 (n - 1)`` steps;
* all-to-all: each rank sends ``(n - 1) / n`` of its ``nbytes`` once.

Each step pays the link's latency; the bytes go at the slowest link the ring crosses: the NVLink of a node
(``Platform.bandwidth``) when the group sits in one node, else each GPU's own node link
(``Platform.node_bandwidth``: one NIC per GPU, as in a DGX H100, so a ring across nodes runs at the NIC's
rate). This is nccl-tests' "bus bandwidth" convention (NCCL's doc/PERFORMANCE.md: ``busbw = algbw * 2 (n-1)/n``
for all-reduce, ``(n-1)/n`` for all-gather and reduce-scatter), with the link's datasheet rate as the bus
bandwidth; ``efficiency`` scales it to what a library reaches.

>>> GB = 1e9
>>> ring_seconds("all_reduce", 8 * GB, ranks=8, bandwidth=400 * GB)   # 2 * 7/8 * 8 GB at 400 GB/s
0.035
>>> ring_seconds("all_gather", 8 * GB, ranks=8, bandwidth=400 * GB)
0.0175
>>> ring_seconds("all_reduce", 1.0, ranks=1, bandwidth=1.0)            # a group of one moves nothing
0.0
"""

from __future__ import annotations

import math

__all__ = ["COLLECTIVES", "ring_bytes", "ring_steps", "ring_seconds", "group_bandwidth"]

#: the collectives priced here, and the fraction of the tensor each rank sends per (n - 1) / n
COLLECTIVES = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}


def _known(kind: str) -> float:
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
    return COLLECTIVES[kind]


def ring_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """Bytes each rank sends for one ``kind`` of ``nbytes`` over ``ranks`` ranks (0 for a group of one).

    >>> ring_bytes("reduce_scatter", 1000, 4)
    750.0
    """
    factor = _known(kind)
    if ranks < 1:
        raise ValueError(f"a collective needs at least one rank, got {ranks}")
    return factor * (ranks - 1) / ranks * float(nbytes)


def ring_steps(kind: str, ranks: int) -> int:
    """Latency-bound steps of the ring: ``n - 1`` (``2 (n - 1)`` for all-reduce; 0 for a group of one)."""
    return int(round(_known(kind))) * (ranks - 1) if kind != "all_to_all" else ranks - 1


def ring_seconds(kind: str, nbytes: float, *, ranks: int, bandwidth: float, latency: float = 0.0,
                 efficiency: float = 1.0) -> float:
    """Seconds for one collective: steps x latency + bytes each rank sends / (bandwidth x efficiency)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if not 0 < efficiency <= 1:
        raise ValueError(f"collective efficiency must be in (0, 1], got {efficiency}")
    sent = ring_bytes(kind, nbytes, ranks)
    wire = 0.0 if math.isinf(bandwidth) else sent / (bandwidth * efficiency)
    return ring_steps(kind, ranks) * latency + wire


def group_bandwidth(ranks: tuple[int, ...], *, bandwidth: float, node_bandwidth: float,
                    devices_per_node: int | None) -> float:
    """The bus bandwidth of a ring over ``ranks``: the node's link within one node, the slower of it and the
    node link when the ring crosses nodes.

    >>> group_bandwidth((0, 1, 2, 3), bandwidth=450e9, node_bandwidth=50e9, devices_per_node=8)
    450000000000.0
    >>> group_bandwidth((0, 8), bandwidth=450e9, node_bandwidth=50e9, devices_per_node=8)
    50000000000.0
    """
    if devices_per_node is None or len({r // devices_per_node for r in ranks}) <= 1:
        return float(bandwidth)
    return float(min(bandwidth, node_bandwidth))
