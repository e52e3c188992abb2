"""The backward split: each layer's input-gradient (I) and weight-gradient (W) work (docs/model.md, "Backward split").

Zero-bubble schedules run a stage's backward in two parts, as torch's
``stage_backward_input`` and ``stage_backward_weight`` do: ``I`` computes the
gradient of the stage's input (what the previous stage waits for) and keeps
what the weights' gradients need; ``W`` computes the weights' gradients later,
to fill a bubble. Per layer the profile gives

* ``backward_weight_ms``: the W share of the layer's backward time (I is the
  rest, ``backward_ms - backward_weight_ms``);
* ``weight_pending_bytes``: what the layer holds from the end of its I to the
  end of its W beyond its activations (which stay until W: torch's I keeps
  the autograd graph): the gradients at the outputs of its weight operations,
  kept for W.

The workbench's profiler measures both (:mod:`workbench.profiles.split`). A
profile without them (every bundled profile made before, PipeDream's, the
H100 and the fake ones) gets an **estimate**, and a plan that uses it says so
(:func:`split_note`):

* a layer with parameters: ``W = min(forward, backward / 2)`` (a weight
  gradient costs about one forward of the layer's weight operations, and at
  most half of the backward); one without: ``W = 0``;
* pending: a layer with parameters holds about as many bytes of output
  gradients of its weight operations as those operations saved of their
  inputs: ``saved_bytes``; one without: 0.

A **stage** i..j runs ``I = sum I_l`` and ``W = sum W_l`` and holds
``sum pending_l`` between them; except torch's first stage (index 0), whose
``I`` does nothing (its input takes no gradient) and whose ``W`` runs the
whole backward (:func:`stage_split`).

>>> from workbench.model.chain import Chain, Layer
>>> ch = Chain((Layer("emb", 1.0, 2.0, 8, 4, 4), Layer("relu", 1.0, 1.0, 0, 4, 4),
...             Layer("fc", 1.0, 4.0, 8, 4, 4, backward_weight=1.5, weight_pending_bytes=6)))
>>> w, pending, estimated = split_columns(ch)
>>> w.tolist(), pending.tolist(), estimated
([1.0, 0.0, 1.5], [4.0, 0.0, 6.0], ('backward_weight', 'weight_pending_bytes'))
>>> stage_split(ch, 1, 2, first_stage=False)       # (I, W, pending) of the stage relu..fc
(3.5, 1.5, 6.0)
>>> stage_split(ch, 0, 0, first_stage=True)        # torch's stage 0: no I, the whole backward in W
(0.0, 2.0, 0.0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from workbench.model.chain import Chain

__all__ = ["split_columns", "stage_split", "split_note", "SPLIT_ESTIMATES"]

#: how a missing split column is estimated (a plan that uses the estimate says so)
SPLIT_ESTIMATES = {
    "backward_weight": "min(forward, backward / 2) for a layer with parameters, else 0",
    "weight_pending_bytes": "saved_bytes for a layer with parameters, else 0",
}


def split_columns(chain: Chain) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Per layer the W seconds and the pending bytes (measured, or estimated where missing), and the
    names of the estimated columns (cached on the chain)."""
    cache = chain.__dict__.get("_split")
    if cache is not None:
        return cache
    f, b = chain.forward, chain.backward
    has_weights = chain.weights > 0
    w_est = np.where(has_weights, np.minimum(f, b / 2.0), 0.0)
    p_est = np.where(has_weights, chain.saved_array, 0.0)
    estimated: list[str] = []
    out = []
    for name, est in (("backward_weight", w_est), ("weight_pending_bytes", p_est)):
        values = [getattr(l, name) for l in chain.layers]
        if any(v is None for v in values):
            estimated.append(name)
        out.append(np.array([e if v is None else float(v) for v, e in zip(values, est)], dtype=float))
    w = np.minimum(out[0], b)
    result = (w, out[1], tuple(estimated))
    chain.__dict__["_split"] = result
    return result


def stage_split(chain: Chain, first: int, last: int, *, first_stage: bool) -> tuple[float, float, float]:
    """``(I, W, pending)`` of the stage ``first..last``: seconds of its input- and weight-gradient parts and
    the bytes it holds between them per micro-batch; torch's first stage runs its whole backward as W."""
    w, pending, _ = split_columns(chain)
    back = float(chain.backward[first:last + 1].sum())
    if first_stage:
        return 0.0, back, 0.0
    weight = float(w[first:last + 1].sum())
    return back - weight, weight, float(pending[first:last + 1].sum())


def split_note(chain: Chain) -> str | None:
    """A plan's note when the profile lacks the backward split (None when it has it).

    >>> from workbench.model.chain import Chain, Layer
    >>> split_note(Chain((Layer("a", 1, 1),)))[:60]
    'the backward split into input and weight gradients is estima'
    """
    missing = split_columns(chain)[2]
    if not missing:
        return None
    how = "; ".join(f"{m}: {SPLIT_ESTIMATES[m]}" for m in missing)
    return (f"the backward split into input and weight gradients is estimated (the profile lacks {', '.join(missing)}; "
            f"{how}; measure it with scripts/measure_backward_split.py)")
