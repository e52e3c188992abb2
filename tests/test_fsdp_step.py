"""FSDP's step: ring collectives, prefetched behind compute but for the first all-gather and last reduce-scatter."""

from __future__ import annotations

import pytest

from workbench.profiles.fsdp_step import Unit, fsdp_step, ring_seconds

LINK = 450e9


def test_ring_prices():
    ag = ring_seconds("all-gather", 8e9, 8, LINK, 1.0)
    assert ag == pytest.approx(7 / 8 * 8e9 / LINK)
    assert ring_seconds("reduce-scatter", 8e9, 8, LINK, 1.0) == ag
    assert ring_seconds("all-reduce", 8e9, 8, LINK, 1.0) == pytest.approx(2 * ag)
    assert ring_seconds("all-gather", 8e9, 1, LINK) == 0.0
    assert ring_seconds("all-gather", 8e9, 64, LINK, 1.0) > ag                       # (n-1)/n grows toward 1
    with pytest.raises(ValueError, match="collective 'broadcast'"):
        ring_seconds("broadcast", 1.0, 8, LINK)


def test_compute_bound_layers_expose_only_the_first_gather_and_last_scatter():
    units = [Unit(f"l{i}", 0.010, 0.020, 100e6) for i in range(6)]
    step = fsdp_step(units, 8, LINK, param_bytes=2, grad_bytes=4, optimizer=0.005)
    first, last = ring_seconds("all-gather", 200e6, 8, LINK), ring_seconds("reduce-scatter", 400e6, 8, LINK)
    assert step.compute == pytest.approx(6 * 0.030)
    assert step.exposed == pytest.approx(first + last)
    assert step.total == pytest.approx(6 * 0.030 + first + last + 0.005)


def test_communication_bound_layers_pay_the_links():
    """Layers too short to hide their collectives: the step is the links' time, whatever the compute."""
    units = [Unit(f"l{i}", 1e-6, 2e-6, 4e9) for i in range(6)]
    step = fsdp_step(units, 8, LINK)
    ag, rs = ring_seconds("all-gather", 8e9, 8, LINK), ring_seconds("reduce-scatter", 16e9, 8, LINK)
    # forward: every all-gather in turn; backward: five re-gathers and six reduce-scatters
    assert step.total == pytest.approx(6 * ag + 5 * ag + 6 * rs, rel=1e-3)
    assert step.exposed > 100 * step.compute


def test_units_kept_after_their_forward_are_not_gathered_again():
    kept = [Unit(f"l{i}", 1e-6, 2e-6, 4e9, regather=False) for i in range(6)]
    resharded = [Unit(f"l{i}", 1e-6, 2e-6, 4e9) for i in range(6)]
    assert fsdp_step(kept, 8, LINK).total < fsdp_step(resharded, 8, LINK).total
