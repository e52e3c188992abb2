"""Whether the profiler records what runs now: a switch the fused kernels and the sequence-first collectives share.

The work counter (:class:`~workbench.profiles.roofline.WorkCounter`) and the allocation tracker
(:mod:`~workbench.profiles.memtrace`) skip every operation dispatched inside :func:`suspended`: a fused kernel
(:mod:`workbench.profiles.fused`) runs its eager math there and records itself as one kernel, and a
sequence-first collective (:mod:`workbench.parallel.tensor.sequence_first`) runs torch's reorder copy there.
:func:`dispatch_modes` are the modes that record (those that receive a fused kernel's or a carried buffer's
record).

>>> is_suspended()
False
>>> with suspended():
...     is_suspended()
True
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

__all__ = ["is_suspended", "suspended", "dispatch_modes"]

_depth = {"suspended": 0}


def is_suspended() -> bool:
    """Whether the profiler's dispatch modes should neither record work nor count allocations now."""
    return _depth["suspended"] > 0


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Inside, the work counter and the allocation tracker let operations run unrecorded."""
    _depth["suspended"] += 1
    try:
        yield
    finally:
        _depth["suspended"] -= 1


def dispatch_modes() -> list[Any]:
    """The torch dispatch modes active now, outermost first."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())
