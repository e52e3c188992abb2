import math

import numpy as np
import pytest

from workbench.model.units import (
    Unit,
    byte_unit,
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_size,
    time_unit,
)


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * 2**30), ("12GB", 12e9), ("512 MB", 512e6), ("1KiB", 1024), ("7", 7), ("2.5TB", 2.5e12),
    ("1e3", 1000), ("3tib", 3 * 2**40), (1024, 1024), ("inf", math.inf),
])
def test_parse_size(text, expected):
    assert parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("12GB/s", 12e9), ("16GiB/s", 16 * 2**30), ("17179869184B/s", 17179869184), ("1e10", 1e10), (5e9, 5e9),
])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["12 furlongs", "GiB", "-3GB", "", "1.2.3MB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="memory"):
        parse_size(bad, what="memory")


def test_zero_bandwidth_rejected():
    with pytest.raises(ValueError, match="positive"):
        parse_bandwidth("0GB/s")


def test_format():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(math.inf) == "unlimited"
    assert format_seconds(0.0123) == "12.30 ms"


def test_units_by_magnitude_over_every_value():
    assert byte_unit(5 * 2**20) == Unit("MiB", 2**20)
    assert byte_unit([5 * 2**20, math.nan, math.inf], 2**30).name == "GiB"   # nan and inf ignored
    assert time_unit(np.array([0.004, 0.9])).name == "ms" and time_unit(0.004, 1.0).name == "s"
    assert time_unit([0.0]).name == "ms" and byte_unit().name == "MiB"      # nothing to show: the usual unit
    # the formatters write each value in the unit a chart of that value alone would pick
    for v in (3e-6, 0.5, 2.0):
        assert format_seconds(v).endswith(" " + time_unit(v).name)
    for v in (2000, 3 * 2**20, 5 * 2**30):
        assert format_bytes(v).endswith(" " + byte_unit(v).name)
    assert format_bytes(0) == "0 B" and format_seconds(0) == "0 s"
    ms = time_unit(0.02)
    assert ms.of(0.0123) == pytest.approx(12.3) and ms.axis("period") == "period (ms)"
