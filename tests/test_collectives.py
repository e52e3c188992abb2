"""Ring collectives: the bytes each rank sends against a step-by-step simulation of the ring."""

import pytest

from workbench.parallel.collectives import group_bandwidth, ring_bytes, ring_seconds, ring_steps


def _simulated_ring_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes rank 0 sends when the tensor is cut in n chunks and passed around the ring chunk by chunk."""
    chunk = nbytes / n
    phases = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}[kind]
    sent = 0.0
    for _ in range(phases):
        for _step in range(n - 1):
            sent += chunk
    return sent


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_ring_bytes_match_a_simulated_ring(kind, n):
    assert ring_bytes(kind, 6e9, n) == pytest.approx(_simulated_ring_bytes(kind, 6e9, n))
    assert ring_steps(kind, n) == (2 if kind == "all_reduce" else 1) * (n - 1)


def test_seconds_add_latency_per_step_and_scale_with_efficiency():
    t = ring_seconds("all_reduce", 1e9, ranks=4, bandwidth=1e9, latency=1e-5, efficiency=0.5)
    assert t == pytest.approx(6 * 1e-5 + 1.5 / 0.5)
    assert ring_seconds("all_gather", 1e9, ranks=4, bandwidth=float("inf")) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        ring_seconds("broadcastish", 1.0, ranks=2, bandwidth=1.0)


def test_a_ring_across_nodes_runs_at_the_node_link():
    assert group_bandwidth((6, 7), bandwidth=450e9, node_bandwidth=50e9, devices_per_node=8) == 450e9
    assert group_bandwidth((7, 8), bandwidth=450e9, node_bandwidth=50e9, devices_per_node=8) == 50e9
    assert group_bandwidth((0, 8), bandwidth=450e9, node_bandwidth=50e9, devices_per_node=None) == 450e9
