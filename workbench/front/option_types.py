"""Types of the command line's options that refuse what the planners cannot use, in argparse's one line.

>>> named("profile name")("resnet50")
'resnet50'
"""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["finite_bandwidth", "gpu_name", "named"]


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
