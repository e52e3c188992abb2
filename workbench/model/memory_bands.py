"""The memory model over many stages at once: bands of stages for the dynamic programmes, and per-layer
coefficients for the models that sum over layers (the MILP, the cover search).

Every figure here is the one :mod:`workbench.model.memory` gives the same stage (its module docstring
states the model): the terms are read off :class:`~workbench.model.memory.LayerTerms`, the stage's
running maxima and prefix sums computed for whole arrays of stages, and each tied parameter's stage
terms added where :func:`workbench.model.ties.tie_flags` says a stage holds a copy or the owner alone.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.memory import device_memory, layer_terms
>>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))), Target.of(1, optimizer="sgd"))
>>> float(suffix_terms(t).memory(np.ones(3))[1]) == device_memory(t, [(1, 2, 1)])
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.model.memory import LayerTerms, TieTerms
from workbench.model.ties import tie_flags

__all__ = ["BandTerms", "band_terms", "suffix_terms", "square_terms", "LinearTerms", "linear_terms"]


# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class BandTerms:
    """Per stage ``i..J[i, d]`` (a band of stage ends per start): activations ``A``, ``static``,
    ``stash`` (per extra in-flight mini-batch) and ``extra`` (excess + runtime constant)."""

    A: np.ndarray
    static: np.ndarray
    stash: np.ndarray
    extra: np.ndarray

    def memory(self, k: np.ndarray) -> np.ndarray:
        """Device memory of each stage alone on a device, with k in flight."""
        return k * self.A + self.static + (k - 1) * self.stash + self.extra


def _band_excess(t: LayerTerms, I: np.ndarray, J: np.ndarray, step: np.ndarray, created: np.ndarray,
                 recv: np.ndarray, running_max) -> np.ndarray:
    """The excess of stages ``I..J`` (module docstring), with ``running_max`` the running maximum of a
    per-layer array taken over each stage's layers (along the ends, or over suffixes)."""
    pa, pg, po = t.p_act, t.p_grad, t.p_off
    gone = pa + po                               # what the stage's later layers do not hold yet, or any more
    fwd = running_max(t.fwd + gone[1:]) - gone[J + 1]
    bwd = running_max(t.bwd + gone[1:] - pg[1:]) - gone[J + 1] + pg[J + 1]
    op = np.maximum(fwd, bwd)
    off = t.p_off[J + 1] - t.p_off[I]            # the offloaded copy is gone by the step too
    return np.maximum(np.maximum(op, step + created - recv - off - (pa[J + 1] - pa[I]) - t.tail[J] + t.grad_sent[I]),
                      0.0)


def _band_ties(t: LayerTerms, I: np.ndarray, J: np.ndarray, static, stash, step, created) -> tuple:
    """``static``, ``stash``, ``step``, ``created`` and ``recv`` of stages ``I..J`` with every tie's terms
    added (:class:`StageTies`)."""
    recv = np.zeros(np.broadcast(I, J).shape)
    for x in t.ties:
        copy, away = tie_flags(x.tie, I, J)
        static = static + np.where(copy, x.static, 0.0) + np.where(away, x.recv, 0.0)
        recv = recv + np.where(away, x.recv, 0.0)
        stash = stash + np.where(copy, x.stash, 0.0) + np.where(away, x.recv_k, 0.0)
        created = created + np.where(copy, x.created, 0.0)
        if t.step_sum:
            step = step + np.where(copy, x.foreach, 0.0)
    return static, stash, step, created, recv


def band_terms(t: LayerTerms, I: np.ndarray, J: np.ndarray) -> BandTerms:
    """Stage terms for starts ``I`` (shape (n, 1)) and ends ``J`` (shape (n, w), ``J >= I``,
    consecutive along axis 1): the excess's maximum over the stage is a running maximum.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.memory import layer_terms
    >>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))),
    ...                 Target.of(1, memory_model="paper"))
    >>> b = band_terms(t, np.arange(3)[:, None], np.minimum(np.arange(3)[:, None] + np.arange(2), 2))
    >>> b.A.tolist()
    [[2.0, 4.0], [2.0, 4.0], [2.0, 2.0]]
    """
    if t.step_sum:
        step = lambda: t.p_step[J + 1] - t.p_step[I]  # noqa: E731
    else:
        step = lambda: np.maximum.accumulate(t.step[J], axis=1)  # noqa: E731
    return _stages(t, I, J, step, lambda h: np.maximum.accumulate(h[J], axis=1))


def _stages(t: LayerTerms, I: np.ndarray, J: np.ndarray, step, running_max) -> BandTerms:
    """:class:`BandTerms` of stages ``I..J``; ``step()`` gives their step's temporaries and ``running_max`` the
    running maximum of a per-layer array over each stage's layers (the full model only)."""
    pa, ps, pw = t.p_act, t.p_static, t.p_stash
    A = pa[J + 1] - pa[I] + t.head[I] + t.tail[J]
    static = ps[J + 1] - ps[I] + t.buf_in[I] + t.buf_out[J]
    stash = pw[J + 1] - pw[I]
    if t.model == "paper":
        return BandTerms(A, static, stash, np.zeros_like(A))
    created = t.p_created[J + 1] - t.p_created[I]
    static, stash, steps, created, recv = _band_ties(t, I, J, static, stash, step(), created)
    excess = _band_excess(t, I, J, steps, created, recv, running_max)
    return BandTerms(A, static, stash, excess + t.const)


def suffix_terms(t: LayerTerms) -> BandTerms:
    """:class:`BandTerms` of the stages ``i..L-1`` for every i (arrays of length L).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.memory import layer_terms
    >>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))),
    ...                 Target.of(1, memory_model="paper"))
    >>> suffix_terms(t).A.tolist()
    [6.0, 4.0, 2.0]
    """
    L = len(t)
    I = np.arange(L)
    if t.step_sum:
        step = lambda: t.p_step[L] - t.p_step[I]  # noqa: E731
    else:
        step = lambda: np.maximum.accumulate(t.step[::-1])[::-1]  # noqa: E731
    return _stages(t, I, np.full(L, L - 1), step, lambda h: np.maximum.accumulate(h[::-1])[::-1])


def square_terms(t: LayerTerms) -> BandTerms:
    """:class:`BandTerms` of every stage ``i..j`` as L x L matrices (``A`` is inf where j < i).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.memory import layer_terms
    >>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))),
    ...                 Target.of(1, memory_model="paper"))
    >>> square_terms(t).A[0].tolist()
    [2.0, 4.0, 6.0]
    """
    L = len(t)
    I = np.arange(L)[:, None]
    d = np.arange(L)[None, :]
    band = band_terms(t, I, np.minimum(I + d, L - 1))
    rows, cols = np.nonzero(I + d < L)
    out = []
    for arr, fill in ((band.A, np.inf), (band.static, 0.0), (band.stash, 0.0), (band.extra, 0.0)):
        m = np.full((L, L), fill)
        m[rows, rows + cols] = arr[rows, cols]
        out.append(m)
    return BandTerms(*out)


@dataclass(frozen=True)
class LinearTerms:
    """Per-layer coefficients for models that sum over layers (the MILP, the cover search's sets).

    A device holds ``sum_l (k_l a_l + w0_l) + sum_{l starts a stage} (k_l head_l + buf_head_l) +
    sum_{l ends a stage} (k_l tail_l + buf_tail_l) + ties + extra``, where ``extra`` (the largest stage
    excess plus ``const``) is at most ``max(max_l excess_ub_l, sum_l step_sum_l) + sum_l grad_ub_l + const``
    over its layers: ``excess_ub`` bounds a layer's share of the excess (the stage's later layers only
    lower it), ``step_sum`` is the foreach step's per-layer temporaries (zero when the step loops) and
    ``grad_ub`` the gradients a layer's backward makes (``none``) or its step finds. ``ties`` are the
    tied parameters' stage terms (:class:`TieTerms`): a model that sums over layers adds them where a
    stage holds a copy or the owner alone. Exact for everything but ``extra``, which is an upper bound.
    """

    a: np.ndarray
    w0: np.ndarray
    head: np.ndarray
    tail: np.ndarray
    buf_head: np.ndarray
    buf_tail: np.ndarray
    excess_ub: np.ndarray
    step_sum: np.ndarray
    const: float
    grad_ub: np.ndarray
    ties: tuple[TieTerms, ...] = ()


def linear_terms(t: LayerTerms) -> LinearTerms:
    """:class:`LinearTerms` of ``t``.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.memory import layer_terms
    >>> t = layer_terms(Chain((Layer("l", 1.0, 1.0, weight_bytes=10, saved_bytes=4),)),
    ...                 Target.of(1, memory_model="paper"))
    >>> [float(x[0]) for x in (linear_terms(t).a, linear_terms(t).w0)]   # a = 4 + 10 stashed, w0 = 0
    [14.0, 0.0]
    """
    zero = np.zeros(len(t))
    if t.step_sum:
        ub, step = t.peak, t.step.copy()
    else:
        ub, step = np.maximum(t.peak, t.step), zero.copy()
    made = t.created.copy()
    for x in t.ties:
        sharers = list(x.tie.sharers)
        made[sharers] += x.created
        if t.step_sum:
            step[sharers] += x.foreach
    return LinearTerms(t.act + t.stash, t.static - t.stash, t.head, t.tail, t.buf_in, t.buf_out, ub, step, t.const,
                       np.maximum(t.grad, made), t.ties)
