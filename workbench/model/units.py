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

Charts and tables pick their unit by magnitude with the same rule as the
formatters: :func:`time_unit` (s, ms or us) and :func:`byte_unit` (GiB, MiB,
...) take every value a chart or a comparison shows, so charts meant to be
compared share one unit.

>>> u = time_unit([0.004, 2.5])
>>> u.name, u.of(2.5), u.axis("time")
('s', 2.5, 'time (s)')
>>> byte_unit(300 * 2**20, 3 * 2**30).name
'GiB'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

__all__ = ["parse_size", "parse_bandwidth", "format_bytes", "format_seconds", "format_column", "UNITS", "Unit",
           "time_unit", "byte_unit", "TIME_UNITS", "BYTE_UNITS", "MAX_BYTES", "bytes_value"]

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
    """Bytes per second in ``text`` (``"12GB/s"``, ``"16GiB/s"``, ``"17179869184B/s"``, ``1e10``); zero refused
    (nothing would ever arrive), as a number too (a plan's recorded links).

    >>> parse_bandwidth(0, what="node bandwidth")
    Traceback (most recent call last):
    ...
    ValueError: node bandwidth must be positive, got 0
    """
    if isinstance(text, (int, float)):
        value = parse_size(text, what=what)
    else:
        s = str(text).strip()
        if s.lower().endswith("/s"):
            s = s[:-2]
        elif s.lower().endswith("ps"):
            s = s[:-2]
        value = parse_size(s, what=what)
    if value == 0:
        raise ValueError(f"{what} must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class Unit:
    """A display unit: its ``name`` and ``size``, how many base units (seconds, bytes) one of it holds.

    >>> Unit("MiB", 2**20).of(3 * 2**20), Unit("ms", 1e-3).format(0.0123)
    (3.0, '12.30 ms')
    """

    name: str
    size: float

    def of(self, value: Any) -> Any:
        """``value`` (base units: a number, an array, a Series) in this unit."""
        return value / self.size

    def axis(self, quantity: str) -> str:
        """An axis title: ``"time (ms)"``."""
        return f"{quantity} ({self.name})"

    def format(self, value: float, digits: int = 2) -> str:
        """``value`` (base units) written in this unit: ``"12.30 ms"``."""
        return f"{self.of(value):.{digits}f} {self.name}"


#: largest first; a value is shown in the first unit it reaches (under the last, in the last)
TIME_UNITS = (Unit("s", 1.0), Unit("ms", 1e-3), Unit("us", 1e-6))
BYTE_UNITS = (Unit("TiB", 2.0**40), Unit("GiB", 2.0**30), Unit("MiB", 2.0**20), Unit("KiB", 2.0**10), Unit("B", 1.0))


def _largest(values: Iterable[Any]) -> float:
    """The largest finite magnitude among numbers and arrays (0 if none)."""
    top = 0.0
    for v in values:
        a = np.abs(np.asarray(v, dtype=float)).ravel()
        a = a[np.isfinite(a)]
        if a.size:
            top = max(top, float(a.max()))
    return top


def _pick(units: tuple[Unit, ...], values: tuple[Any, ...], empty: Unit) -> Unit:
    top = _largest(values)
    if top == 0:
        return empty
    return next((u for u in units if top >= u.size), units[-1])


def time_unit(*values: Any) -> Unit:
    """The unit for durations up to the largest of ``values`` (seconds: numbers or arrays): s from 1 s, ms
    from 1 ms, else us; ms when there is nothing (or only zeros, inf, nan).

    >>> time_unit(0.25).name, time_unit([0.5, 12.0]).name, time_unit(2e-5).name, time_unit().name
    ('ms', 's', 'us', 'ms')
    """
    return _pick(TIME_UNITS, values, TIME_UNITS[1])


def byte_unit(*values: Any) -> Unit:
    """The unit for sizes up to the largest of ``values`` (bytes: numbers or arrays): GiB from 1 GiB, MiB
    from 1 MiB, and so on; MiB when there is nothing (or only zeros, inf, nan).

    >>> byte_unit(3 * 2**30).name, byte_unit(600 * 2**20).name, byte_unit(500).name
    ('GiB', 'MiB', 'B')
    """
    return _pick(BYTE_UNITS, values, BYTE_UNITS[2])


def format_bytes(n: float) -> str:
    """Human-readable bytes, binary units: ``format_bytes(1536) == '1.50 KiB'`` (:func:`byte_unit`'s rule)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    if math.isinf(n):
        return "unlimited"
    unit = byte_unit(n)
    if unit.name == "B" or n == 0:
        return f"{n:.0f} B"
    return unit.format(n)


def format_seconds(t: float) -> str:
    """Human-readable duration: ``format_seconds(0.0123) == '12.30 ms'`` (:func:`time_unit`'s rule)."""
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return "n/a"
    if math.isinf(t):
        return "inf"
    if t == 0:
        return "0 s"
    unit = time_unit(t)
    return unit.format(t, 3 if unit.name == "s" else 1 if unit.name == "us" else 2)


def format_column(values: Iterable[float], kind: str = "bytes", digits: int = 2) -> list[str]:
    """Every value written in one unit, the one :func:`byte_unit` (``kind="bytes"``) or :func:`time_unit`
    (``"seconds"``) picks for all of them: a table column reads in one unit. Infinite sizes read
    ``"unlimited"``, infinite times ``"inf"``, missing values ``"n/a"``.

    >>> format_column([0.7 * 2**30, 2**30, float("inf")])
    ['0.70 GiB', '1.00 GiB', 'unlimited']
    >>> format_column([0.0123, 2.5], "seconds", 3)
    ['0.012 s', '2.500 s']
    """
    if kind not in ("bytes", "seconds"):
        raise ValueError(f"kind must be 'bytes' or 'seconds', got {kind!r}")
    values = [float(v) for v in values]
    unit = (byte_unit if kind == "bytes" else time_unit)(values)
    return ["n/a" if math.isnan(v) else ("unlimited" if kind == "bytes" else "inf") if math.isinf(v)
            else unit.format(v, digits) for v in values]


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
