"""Types of the command line's options that refuse what the planners cannot use, in argparse's one line.

>>> named("profile name")("resnet50")
'resnet50'
"""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["checked_by", "finite_bandwidth", "gpu_name", "int_in", "named", "non_negative", "positive_seconds"]


def finite_bandwidth(text: str, *, what: str = "bandwidth") -> float:
    """A bandwidth option's bytes per second, refused when infinite: a plan records its links for ``check`` and
    ``simulate`` (JSON has no Infinity).

    >>> finite_bandwidth("12GB/s")
    12000000000.0
    >>> finite_bandwidth("inf")
    Traceback (most recent call last):
    ValueError: bandwidth: inf is not finite (links that cost nothing: give a large one, e.g. 1PB/s)
    """
    import math

    from workbench.model.units import parse_bandwidth

    value = parse_bandwidth(text, what=what)
    if not math.isfinite(value):
        raise ValueError(f"{what}: {text} is not finite (links that cost nothing: give a large one, e.g. 1PB/s)")
    return value


def named(what: str) -> Callable[[str], str]:
    """An argparse type: a name that is not empty (an empty one was read as the current folder)."""
    def name(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty {what}")
        return text

    return name


def gpu_name(text: str) -> str:
    """An argparse type for ``--gpu``: a name, not an empty string (which was ignored).

    >>> gpu_name(" ")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: an empty name; give one of the GPUs profile --list-gpus lists
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name; give one of the GPUs profile --list-gpus lists")
    return text.strip()


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in ``lo..hi``.

    >>> int_in(1, 8)("4")
    4
    >>> int_in(1, 8)("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 0 is not in 1..8
    """
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is not in {lo}..{hi if hi is not None else ''}")
        return v

    return parse


def _real(text: str, *, positive: bool) -> float:
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise argparse.ArgumentTypeError(f"{text} is not a {'positive' if positive else 'non-negative'} finite number")
    return v


def positive_seconds(text: str) -> float:
    """An argparse type: a positive finite number (``--time-limit``).

    >>> positive_seconds("2.5")
    2.5
    >>> positive_seconds("inf")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: inf is not a positive finite number
    """
    return _real(text, positive=True)


def non_negative(text: str) -> float:
    """An argparse type: a non-negative finite number (``--latency``)."""
    return _real(text, positive=False)


def checked_by(parse: Callable[..., float]) -> Callable[[str], str]:
    """An argparse type that keeps the text (Platform parses it) once ``parse`` accepts it."""
    def check(text: str) -> str:
        try:
            parse(text, what="value")
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ").removeprefix("value ")) from None
        return text

    return check
