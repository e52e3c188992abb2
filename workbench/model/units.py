"""Parsing and formatting of sizes, bandwidths and durations.

Sizes accept a bare number of bytes or the units B, KB, MB, GB, TB (powers of
1000) and KiB, MiB, GiB, TiB (powers of 1024). Bandwidths are the same per
second (``12GB/s``) or a bare number of bytes per second.

>>> parse_size("16GiB")
17179869184.0
>>> parse_bandwidth("12.5GB/s")
12500000000.0
>>> format_bytes(3 * 2**30)
'3.00 GiB'
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_size", "parse_bandwidth", "format_bytes", "format_seconds", "UNITS", "MAX_BYTES", "bytes_value"]

#: a size above this (bytes; 1 PiB) is not a measurement: profiles and their metadata refuse it
MAX_BYTES = float(2**50)

UNITS: dict[str, float] = {
    "": 1.0,
    "B": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KIB": 2.0**10,
    "MIB": 2.0**20,
    "GIB": 2.0**30,
    "TIB": 2.0**40,
}

_NUMBER = r"[+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_SIZE_RE = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z]*)\s*$")


def parse_size(text: str | float | int, *, what: str = "size") -> float:
    """Bytes in ``text`` (``"16GiB"``, ``"512 MB"``, ``"1e9"``, ``1024``, ``"inf"``).

    Raises ``ValueError`` naming ``what`` when the text is not a size.
    """
    if isinstance(text, (int, float)):
        value = float(text)
        if value < 0 or math.isnan(value):
            raise ValueError(f"{what} must be a non-negative number of bytes, got {text!r}")
        return value
    s = str(text).strip()
    if s.lower() in ("inf", "infinity", "unlimited", "none"):
        return math.inf
    m = _SIZE_RE.match(s)
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(
            f"{what}: cannot read {text!r}; expected a number of bytes or a number with one of "
            f"the units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. '16GiB')"
        )
    return float(m.group(1)) * UNITS[m.group(2).upper()]


def parse_bandwidth(text: str | float | int, *, what: str = "bandwidth") -> float:
    """Bytes per second in ``text`` (``"12GB/s"``, ``"16GiB/s"``, ``"17179869184B/s"``, ``1e10``)."""
    if isinstance(text, (int, float)):
        return parse_size(text, what=what)
    s = str(text).strip()
    if s.lower().endswith("/s"):
        s = s[:-2]
    elif s.lower().endswith("ps"):
        s = s[:-2]
    value = parse_size(s, what=what)
    if value == 0:
        raise ValueError(f"{what} must be positive, got {text!r}")
    return value


def format_bytes(n: float) -> str:
    """Human-readable bytes, binary units: ``format_bytes(1536) == '1.50 KiB'``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    if math.isinf(n):
        return "unlimited"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} B" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_seconds(t: float) -> str:
    """Human-readable duration: ``format_seconds(0.0123) == '12.30 ms'``."""
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return "n/a"
    if math.isinf(t):
        return "inf"
    if abs(t) >= 1:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def bytes_value(text: str | float | int, what: str) -> float:
    """A byte count read from metadata: a finite number from 0 to :data:`MAX_BYTES`; else a ValueError
    naming ``what``.

    >>> bytes_value("1024", "runtime_bytes")
    1024.0
    >>> bytes_value("-5000000000", "runtime_bytes")
    Traceback (most recent call last):
    ValueError: runtime_bytes -5000000000: must be a number of bytes from 0 to 1 PiB (1.1259e+15)
    """
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 <= v <= MAX_BYTES:        # NaN fails too
        raise ValueError(f"{what} {text}: must be a number of bytes from 0 to 1 PiB ({MAX_BYTES:.5g})")
    return v
