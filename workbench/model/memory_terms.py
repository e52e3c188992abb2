"""The memory terms a stage holds at its boundaries, as one table (docs/model.md, "Memory").

Besides its layers' own terms (activations, parameters, gradients, optimizer state: per layer, summed over
the stage), a stage ``i..j`` holds bytes that depend on where it starts and where it ends. Each is a
:class:`BoundaryTerm` of :data:`BOUNDARY_TERMS`: its name, its side (``start``: counted at layer i when i
starts a stage; ``end``: at layer j when j ends one), whether it is held per in-flight mini-batch or once
per stage, the key of :func:`workbench.model.memory_views.memory_breakdown` it adds to, and its bytes per
layer as a function of :class:`BoundaryInputs` (the profile's columns and the chain's meta).

:func:`boundary_columns` sums the table into the four per-layer arrays every view of the memory model reads
(:class:`~workbench.model.memory.LayerTerms` ``head``, ``tail``, ``buf_in``, ``buf_out``), and
:func:`boundary_bytes` gives one stage's (or an array of stages') share of them. Every planner's view is
derived from those: the bands of the dynamic programmes and the DP's stage versions
(:mod:`workbench.model.memory_bands`, :mod:`workbench.planners.dp.versions`), the ILP's coefficients
(:func:`workbench.model.memory_bands.linear_terms`, one Pyomo family per side and scaling in
:mod:`workbench.planners.ilp.model`), the cover search's and the stage-path bound's sums. A new term at a
stage boundary is one entry here (and, deliberately, its own lines in :mod:`workbench.verify.check_memory`).

>>> from workbench.model.chain import Chain, Layer
>>> chain = Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3)), input_bytes=4)
>>> cols = boundary_columns(BoundaryInputs.of_chain(chain, saved_input=np.zeros(2), saved_output=np.zeros(2)))
>>> cols.head.tolist(), cols.tail.tolist(), cols.buf_in.tolist(), cols.buf_out.tolist()
([4.0, 10.0], [10.0, 0.0], [0.0, 10.0], [10.0, 0.0])
>>> [(t.name, t.side, t.per_in_flight) for t in BOUNDARY_TERMS][:2]
[('held_input', 'start', True), ('held_output', 'end', True)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

if TYPE_CHECKING:  # memory_terms is below chain (chain.py imports the memory model)
    from workbench.model.chain import Chain

__all__ = ["BoundaryInputs", "BoundaryTerm", "BOUNDARY_TERMS", "BoundaryColumns", "boundary_columns",
           "boundary_bytes", "SIDES"]

#: where a boundary term sits: at the layer that starts a stage, or at the one that ends it
SIDES = ("start", "end")


@dataclass(frozen=True)
class BoundaryInputs:
    """What a boundary term reads, per layer l: ``inp`` (bytes entering l: the chain's input for l = 0, else
    the cut before it), ``cuts`` (bytes crossing the cut after l, 0 for the last layer), the profile's
    ``saved_input`` and ``saved_output`` (measured or estimated), ``shared`` (storage l saves that l - 1
    saves too), the chain's ``meta`` (the profile's header) and the ``setup`` (the
    :class:`~workbench.model.training_setup.TrainingSetup` the terms are for: the memory terms are cached on it
    and on whether there is more than one device, :func:`workbench.model.memory.setup_key`)."""

    inp: np.ndarray
    cuts: np.ndarray
    saved_input: np.ndarray
    saved_output: np.ndarray
    shared: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)
    setup: Any = None

    @classmethod
    def of_chain(cls, chain: Chain, saved_input: np.ndarray, saved_output: np.ndarray,
                 setup: Any = None) -> "BoundaryInputs":
        """The inputs of ``chain`` with its (measured or estimated) saved input and output columns."""
        cuts = chain.cuts.astype(float)
        inp = np.concatenate([[float(chain.input_bytes)], cuts[:-1]])
        prev_so = np.concatenate([[0.0], saved_output[:-1]])
        shared = np.where(prev_so > 0, saved_input, 0.0)
        return cls(inp, cuts, saved_input, saved_output, shared, dict(chain.meta or {}), setup)


@dataclass(frozen=True)
class BoundaryTerm:
    """One term of :data:`BOUNDARY_TERMS`: ``bytes(inputs)`` per layer, held on the ``side`` of a stage
    (``start`` or ``end``), per in-flight mini-batch (``per_in_flight``) or once, reported under ``part``
    in the memory breakdown."""

    name: str
    side: str
    per_in_flight: bool
    part: str
    bytes: Callable[[BoundaryInputs], np.ndarray]
    doc: str = ""


def _held_input(x: BoundaryInputs) -> np.ndarray:
    return np.maximum(x.inp - x.saved_input + x.shared, 0.0)


def _held_output(x: BoundaryInputs) -> np.ndarray:
    tail = np.maximum(x.cuts - x.saved_output, 0.0)
    tail[-1] = 0.0
    return tail


def _receive_activation(x: BoundaryInputs) -> np.ndarray:
    return np.concatenate([[0.0], x.cuts[:-1]])


def _receive_gradient(x: BoundaryInputs) -> np.ndarray:
    return x.cuts.copy()


#: the full model's stage-boundary terms (docs/model.md, "Memory"); the paper's model has none
BOUNDARY_TERMS: tuple[BoundaryTerm, ...] = (
    BoundaryTerm("held_input", "start", True, "activations", _held_input,
                 "head: the stage's input, held until its backward (a copy received is not shared with the "
                 "sender's): in - saved_input + shared"),
    BoundaryTerm("held_output", "end", True, "activations", _held_output,
                 "tail: the stage's output, held until its backward: out - saved_output (0 at the last layer)"),
    BoundaryTerm("receive_activation", "start", False, "buffers", _receive_activation,
                 "buf_in: a receive buffer for the activation arriving from the previous stage (0 at layer 0)"),
    BoundaryTerm("receive_gradient", "end", False, "buffers", _receive_gradient,
                 "buf_out: a receive buffer for the gradient coming back from the next stage"),
)


@dataclass(frozen=True)
class BoundaryColumns:
    """:data:`BOUNDARY_TERMS` summed per side and scaling: ``head`` / ``tail`` (per in-flight mini-batch, at a
    stage's start / end), ``buf_in`` / ``buf_out`` (once), and every term's own array (``by_term``)."""

    head: np.ndarray
    tail: np.ndarray
    buf_in: np.ndarray
    buf_out: np.ndarray
    by_term: tuple[tuple[BoundaryTerm, np.ndarray], ...]


def boundary_columns(inputs: BoundaryInputs, terms: tuple[BoundaryTerm, ...] | None = None) -> BoundaryColumns:
    """The per-layer boundary arrays of ``terms`` (default: :data:`BOUNDARY_TERMS`; module docstring).

    >>> from workbench.model.chain import Chain, Layer
    >>> x = BoundaryInputs.of_chain(Chain((Layer("a", 1, 1, 0, 8),)), np.zeros(1), np.zeros(1))
    >>> boundary_columns(x).buf_out.tolist()          # one layer: no boundary after it
    [0.0]
    """
    L = len(inputs.cuts)
    sums = {(side, per): np.zeros(L) for side in SIDES for per in (True, False)}
    by_term = []
    for term in BOUNDARY_TERMS if terms is None else terms:
        if term.side not in SIDES:
            raise ValueError(f"boundary term {term.name!r}: side must be one of {SIDES}, got {term.side!r}")
        arr = np.asarray(term.bytes(inputs), dtype=float)
        if arr.shape != (L,):
            raise ValueError(f"boundary term {term.name!r}: {arr.shape} bytes for a chain of {L} layers")
        sums[term.side, term.per_in_flight] = sums[term.side, term.per_in_flight] + arr
        by_term.append((term, arr))
    return BoundaryColumns(sums["start", True], sums["end", True], sums["start", False], sums["end", False],
                           tuple(by_term))


def boundary_bytes(t: Any, first: Any, last: Any) -> tuple[Any, Any]:
    """``(per_k, once)``: what stages ``first..last`` hold at their boundaries per in-flight mini-batch and once
    (scalars or numpy index arrays; ``t`` has the arrays of :class:`BoundaryColumns`, e.g.
    :class:`~workbench.model.memory.LayerTerms`). A stage with k in flight holds ``k per_k + once``.

    >>> from workbench.model.chain import Chain, Layer
    >>> x = BoundaryInputs.of_chain(Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3)), input_bytes=4),
    ...                             np.zeros(2), np.zeros(2))
    >>> [float(v) for v in boundary_bytes(boundary_columns(x), 1, 1)]     # b alone: in 10; a buffer of 10
    [10.0, 10.0]
    """
    return t.head[first] + t.tail[last], t.buf_in[first] + t.buf_out[last]
