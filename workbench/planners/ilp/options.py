"""The options of the ``ilp`` method: one frozen record, and an error for an option it does not have.

``plan_ilp(chain, platform, allocation=..., time_limit=..., **options)`` turns
``options`` into an :class:`IlpOptions` (:meth:`IlpOptions.of`): a misspelt
option is an error naming it, not a silent default. The time shares of the
phases are :class:`workbench.planners.budget.PhaseShares` (``shares``).

>>> IlpOptions.of(cover=False).cover
False
>>> IlpOptions.of(cover_shar=0.5)
Traceback (most recent call last):
...
ValueError: ilp has no option 'cover_shar'; its options: activations, coarsen, cover, cover_share, ..., warm_start
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from workbench.model.plan import Plan
from workbench.model.tolerances import MILP_GAP
from workbench.planners.budget import PhaseShares

__all__ = ["IlpOptions", "COARSEN_ABOVE"]

#: chains longer than this many layers are solved on this many blocks unless ``coarsen`` says otherwise
COARSEN_ABOVE = 32


@dataclass(frozen=True)
class IlpOptions:
    """Everything ``plan_ilp`` can be told besides the allocation and the time limit.

    ``rel_gap``: a plan within this relative gap of its proven bound is optimal. ``threads``: HiGHS's.
    ``warm_start``: True starts from the exact contiguous DP's plan (bound and fallback); a
    :class:`~workbench.model.plan.Plan` is used as given (with the DP's if better); False solves cold.
    ``log``: anything with ``write()`` (or a callable) receives HiGHS's log. ``coarsen``: solve on this
    many blocks (:mod:`workbench.planners.ilp.coarse`); None coarsens chains longer than
    :data:`COARSEN_ABOVE` layers to that many, False or 0 never. ``pairwise`` / ``tighten``: the
    MILP's no-overlap constraints between stages of one device and its tightening constraints
    (:func:`workbench.planners.ilp.model.build_model`). ``search_seconds``: general mode improves
    the incumbent by local search for at most this long (and ``shares.local_search`` of what is
    left). ``solver_options``: more HiGHS options. ``cover``: general mode runs the exact cover
    search (:mod:`workbench.planners.ilp.cover`) for ``cover_share`` of the time left (all of it
    without a limit) before the MILP. ``progress``: a callable receiving a line per phase.
    ``deterministic``: work budgets instead of wall-clock ones
    (:mod:`workbench.planners.budget`). ``graph``: on a chain linearised from a DAG, plan in the
    layer order dp's graph mode chose. ``activations``: ``"auto"`` also chooses every layer's
    activation policy (:mod:`workbench.planners.ilp.auto`); None or ``"keep"`` keeps them all.
    ``parallel``: general allocations under a time limit search plans on a second core while the MILP
    or the block solves run (:mod:`workbench.planners.ilp.background`; never with ``deterministic``).
    """

    rel_gap: float = MILP_GAP
    threads: int | None = 1
    warm_start: bool | Plan = True
    log: Any = None
    coarsen: int | bool | None = None
    pairwise: bool = True
    tighten: bool = True
    search_seconds: float = 10.0
    solver_options: Mapping[str, Any] | None = None
    cover: bool = True
    cover_share: float = 0.85
    progress: Callable[[str], None] | None = None
    deterministic: bool = False
    graph: bool = True
    activations: str | None = None
    shares: PhaseShares = field(default_factory=PhaseShares)
    parallel: bool = True

    def __post_init__(self) -> None:
        if not self.rel_gap >= 0:
            raise ValueError(f"ilp: rel_gap must be >= 0, got {self.rel_gap!r}")
        if not 0 < self.cover_share <= 1:
            raise ValueError(f"ilp: cover_share must be in (0, 1], got {self.cover_share!r}")
        if self.activations not in (None, "keep", "auto"):
            raise ValueError(f"ilp: activations must be 'auto', 'keep' or None here, got {self.activations!r} "
                             "(one policy for every layer: workbench.planners.plan)")
        if self.coarsen is not None and not isinstance(self.coarsen, bool) and int(self.coarsen) < 0:
            raise ValueError(f"ilp: coarsen must be a number of blocks >= 0, True/False or None, got {self.coarsen!r}")

    @classmethod
    def of(cls, **options: Any) -> "IlpOptions":
        """The options record of ``options``; a :class:`ValueError` names any option ilp does not have."""
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(options) - set(known))
        if unknown:
            which = ", ".join(repr(u) for u in unknown)
            raise ValueError(f"ilp has no option {which}; its options: {', '.join(known)}")
        return cls(**options)

    def blocks(self, layers: int) -> int:
        """How many blocks to solve a chain of ``layers`` layers on (0: not coarsened).

        >>> IlpOptions().blocks(100), IlpOptions().blocks(20), IlpOptions(coarsen=10).blocks(12)
        (32, 0, 10)
        """
        if self.coarsen is None:
            n = COARSEN_ABOVE if layers > COARSEN_ABOVE else 0
        else:
            n = int(self.coarsen)
        return n if n and n < layers else 0
