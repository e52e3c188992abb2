import math

import pytest

from workbench.model.units import format_bytes, format_seconds, parse_bandwidth, parse_size


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
