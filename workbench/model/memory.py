"""The memory model: what one device holds while it trains its stages (docs/model.md, "Memory").

Every planner, the schedule builder, the simulator and the memory views get
device memory from this module; only :mod:`workbench.verify.check` re-derives it, on
its own, from docs/model.md. The views over a whole plan (every device's
memory, its split by term, the estimate note, torch's engine extra, merged
layers' columns) are in :mod:`workbench.model.memory_views`.

**Per layer l** (arrays over the chain, :func:`layer_terms`), from the
profile's columns (estimated where a profile lacks them, see
:data:`ESTIMATES`), with ``in_l`` the bytes entering layer l (the chain's
input for l = 0, else the cut before it) and ``out_l`` the cut after it:

* ``act[l]  = saved_l - shared_l``: activation bytes one in-flight
  mini-batch keeps inside a stage. ``shared_l`` is storage layer l saves
  that layer l-1 saves too (l saves its input, l-1 its output): counted once.
* ``head[l] = in_l - saved_input_l + shared_l``: added when l *starts* a
  stage: the runtime holds the stage's input until the backward (and a copy
  received from another device is not shared with the sender's).
* ``tail[l] = out_l - saved_output_l`` (0 for the last layer, whose output
  ends in the loss): added when l *ends* a stage: the runtime holds the
  stage's output until the backward.
* ``static[l]``: parameters + gradients (a resident accumulation buffer) +
  optimizer state (+ an fp32 master copy of the parameters and of their
  gradients under ``bf16-mixed``) (+ the one resident copy of an offloaded
  layer's activations, ``Layer.offload_bytes``: docs/model.md, "Activation
  policies"; policies act through :func:`workbench.model.activations.apply_policies`);
  ``stash[l]``: one more parameter version
  per extra in-flight mini-batch under weight stashing.
* ``buf_in[l] = in_l`` (l > 0) and ``buf_out[l] = out_l``: a receive buffer for
  the activation arriving when l starts a stage and one for the gradient
  arriving when l ends one (a stage's neighbours are on other devices).
* ``peak[l] = max(forward_peak_l + in_l - saved_l,
  backward_peak_l)``: how far the layer's forward or backward climbs above
  the state that counts its mini-batch's activations in full.
* ``step[l]``: the optimizer step's temporaries (Adam's ``sqrt`` and
  division: two parameter-sized tensors of the largest parameter when
  the step loops over parameters, as on CPU; one per parameter byte when it
  is ``foreach``, as on GPUs).

**A stage** ``i..j`` with k mini-batches in flight holds
``k A + static + buf_in_i + buf_out_j + (k - 1) stash`` with ``A = sum act + head_i + tail_j``,
and climbs above that by its *excess*
``E = max(0, max_l (peak_l - sum_{m=l+1..j} act_m), step - sum act - tail_j + in_i)``:
while layer l runs, the stage's layers after l hold nothing of this
mini-batch yet (forward) or any more (backward), and the step runs after the
mini-batch's activations are freed, while its input gradient (in_i, for
i > 0) waits to be sent. **A device** holds the sum over its
stages, plus the largest excess of its stages (one operation runs at a
time), plus a runtime constant (0 on CPU; the profile's ``runtime_bytes``).
The excess and the constant do not depend on the in-flight counts, so for a
fixed allocation a planner can treat them as a smaller limit
(:func:`device_budget`).

Exact or a bound: with one stage per device the peak over the periodic
timeline is exactly this (while any operation of mini-batch i runs, k
mini-batches hold activations), given the profile's per-layer peaks. With
several stages on a device it is an upper bound: their largest operations
need not coincide with all their mini-batches in flight. The ``paper``
model is rule 7 of the original paper: ``k A + phi W + [stash] (k - 1) W``
with ``A`` the plain sum of saved bytes and nothing else.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> chain = Chain((Layer("a", 1, 1, 100, 10, 10), Layer("b", 1, 1, 50, 20, 10)), input_bytes=8)
>>> paper = layer_terms(chain, Platform(1, memory_model="paper"))
>>> stage_memory(paper, 0, 1, 2)                    # 2 x 20 + 150 + (2 - 1) x 150
340.0
>>> full = layer_terms(chain, Platform(1, optimizer="sgd"))
>>> float(full.static.sum()), full.estimated[:2]    # parameters + gradients; columns estimated
(300.0, ('grad_bytes', 'max_param_bytes'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

if TYPE_CHECKING:  # memory is below chain: chain.py imports from here
    from workbench.model.chain import Chain, Platform

__all__ = [
    "OPTIMIZER_STATES", "PRECISIONS", "MEMORY_MODELS", "ESTIMATES", "LayerTerms", "layer_terms",
    "stage_activation", "stage_memory", "stage_excess", "stage_op_excess", "stage_step", "device_memory",
    "device_extra", "device_budget", "BandTerms", "band_terms", "validate_setup",
    "suffix_terms", "square_terms", "linear_terms", "LinearTerms", "measured_columns",
]

#: optimizer -> state tensors per parameter (none: no optimizer state; sgd: plain SGD)
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
#: optimizer -> parameter-sized temporaries of one parameter's update (torch's for-loop step)
_STEP_TEMPS = {"none": 0, "sgd": 0, "momentum": 0, "adam": 2, "adamw": 2}
#: optimizer -> temporaries per parameter byte of the foreach step (GPU default)
_FOREACH_TEMPS = {"none": 0, "sgd": 0, "momentum": 0, "adam": 1, "adamw": 1}
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
MEMORY_MODELS = ("full", "paper")
#: how a missing profile column is estimated (a plan built on an estimate says so)
ESTIMATES = {
    "grad_bytes": "the parameters' bytes",
    "max_param_bytes": "all of the layer's parameters (an upper bound on its largest tensor)",
    "saved_input_bytes": "min(saved, input): the layer saves its input",
    "saved_output_bytes": "0: the layer does not save its output",
    "forward_peak_bytes": "what the layer keeps (saved beyond its input, and its output); no temporaries",
    "backward_peak_bytes": "output gradient + input gradient + one gradient of its parameters",
}
_PROFILE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def validate_setup(platform: Platform, chain: Chain | None = None) -> str:
    """The precision the model computes with, after checking the set-up against the profile's dtype.

    ``fp32`` needs a float32 profile (or one that names no dtype, as PipeDream's);
    ``bf16`` and ``bf16-mixed`` need a bfloat16 profile (``profile --dtype bfloat16``).

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> validate_setup(Platform(1), Chain((Layer("a", 1, 1),)))
    'fp32'
    >>> validate_setup(Platform(1, precision="bf16"), Chain((Layer("a", 1, 1),), meta={"dtype": "float32"}))
    Traceback (most recent call last):
    ...
    ValueError: precision 'bf16' needs a bfloat16 profile; this profile (chain) was measured in float32 (profile it
    with --dtype bfloat16, or plan with --precision fp32)
    """
    dtype = str((chain.meta if chain is not None else {}).get("dtype", "") or "")
    precision = platform.precision
    if precision is None:
        return "bf16" if dtype == "bfloat16" else "fp32"
    wants = "float32" if precision == "fp32" else "bfloat16"
    if platform.memory_model == "full" and chain is not None and dtype and dtype != wants:
        other = "fp32" if dtype == "float32" else "bf16"
        raise ValueError(f"precision {precision!r} needs a {wants} profile; this profile ({chain.name}) was measured "
                         f"in {dtype} (profile it with --dtype {wants}, or plan with --precision {other})")
    return precision


@dataclass(frozen=True)
class LayerTerms:
    """The per-layer terms of one chain under one set-up (see the module docstring), and prefix sums.

    ``step_sum`` is True when the optimizer step's temporaries add up over a
    stage (foreach) rather than peak at its largest layer (a loop over
    parameters). ``estimated`` names the profile columns that were estimated.
    """

    act: np.ndarray
    head: np.ndarray
    tail: np.ndarray
    buf_in: np.ndarray
    buf_out: np.ndarray
    static: np.ndarray
    stash: np.ndarray
    peak: np.ndarray
    step: np.ndarray
    step_sum: bool
    const: float
    estimated: tuple[str, ...]
    model: str
    parts: dict

    def __post_init__(self) -> None:
        z = lambda a: np.concatenate([[0.0], np.cumsum(a)])  # noqa: E731
        object.__setattr__(self, "p_act", z(self.act))
        object.__setattr__(self, "p_static", z(self.static))
        object.__setattr__(self, "p_stash", z(self.stash))
        object.__setattr__(self, "p_step", z(self.step))
        object.__setattr__(self, "_lists", (self.p_act.tolist(), self.p_static.tolist(), self.p_stash.tolist(),
                                            self.head.tolist(), self.tail.tolist(), self.buf_in.tolist(),
                                            self.buf_out.tolist()))

    def __len__(self) -> int:
        return len(self.act)

    @property
    def has_excess(self) -> bool:
        """Whether any operation climbs above the resident state (always False in the paper model)."""
        return bool(np.any(self.peak > 0) or np.any(self.step > 0) or self.const > 0)


def _column(chain: Chain, name: str, estimate: np.ndarray, missing: list[str]) -> np.ndarray:
    values = [getattr(l, name) for l in chain.layers]
    if all(v is not None for v in values):
        return np.array(values, dtype=float)
    missing.append(name)
    return np.array([estimate[i] if v is None else float(v) for i, v in enumerate(values)], dtype=float)


def measured_columns(chain: Chain) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The memory columns of the profile as arrays over the layers, each estimated
    (:data:`ESTIMATES`) where missing, with ``in``, ``out`` and ``saved``; and the names of
    the estimated columns (a chain made by :func:`workbench.model.activations.apply_policies` keeps
    those of the profile it came from).

    >>> from workbench.model.chain import Chain, Layer
    >>> cols, missing = measured_columns(Chain((Layer("a", 1, 1, 10, 4),), input_bytes=2))
    >>> float(cols["saved_input_bytes"][0]), missing[:1]
    (2.0, ('grad_bytes',))
    """
    L = len(chain)
    W = chain.weights
    saved = chain.saved_array
    cuts = chain.cuts
    inp = np.concatenate([[float(chain.input_bytes)], cuts[:-1]])
    out = np.array([float(l.activation_bytes) for l in chain.layers])
    missing: list[str] = []
    cols = {"grad_bytes": _column(chain, "grad_bytes", W, missing),
            "max_param_bytes": _column(chain, "max_param_bytes", W, missing)}
    si = _column(chain, "saved_input_bytes", np.minimum(saved, inp), missing)
    so = _column(chain, "saved_output_bytes", np.zeros(L), missing)
    cols["saved_input_bytes"], cols["saved_output_bytes"] = si, so
    cols["forward_peak_bytes"] = _column(chain, "forward_peak_bytes", np.maximum(saved - si, 0.0) + out, missing)
    cols["backward_peak_bytes"] = _column(chain, "backward_peak_bytes", out + inp + cols["grad_bytes"], missing)
    cols["in"], cols["out"], cols["saved"] = inp, out, saved
    inherited = [m for m in str(chain.meta.get("estimated_columns", "")).split(",") if m and m not in missing]
    return cols, tuple(missing + inherited)


def _paper_terms(chain: Chain, platform: Platform) -> LayerTerms:
    L = len(chain)
    zero = np.zeros(L)
    W = chain.weights
    phiW = platform.weight_factor * W
    off = _offloaded(chain)
    parts = {"weights": phiW, "offloaded": off}
    return LayerTerms(chain.saved_array.astype(float), zero, zero, zero, zero, phiW + off,
                      W * (1.0 if platform.stash else 0.0), zero, zero, False, 0.0, (), "paper", parts)


def _offloaded(chain: Chain) -> np.ndarray:
    """Per layer, the one copy of offloaded activations a device holds (docs/model.md, "Activation policies")."""
    return np.array([float(l.offload_bytes) for l in chain.layers])


def _full_terms(chain: Chain, platform: Platform) -> LayerTerms:
    precision = validate_setup(platform, chain)
    cols, missing = measured_columns(chain)
    L = len(chain)
    W = chain.weights
    G = cols["grad_bytes"]
    n_states = OPTIMIZER_STATES[platform.optimizer]
    # fp32 copies under bf16-mixed: parameters and gradients (masters) and the optimizer state
    wide = 4.0 / _PROFILE_DTYPE_BYTES.get(str(chain.meta.get("dtype", "bfloat16")),
                                          2) if precision == "bf16-mixed" else 1.0
    master = (wide * W + wide * G) if precision == "bf16-mixed" else np.zeros(L)
    optimizer = n_states * wide * W
    off = _offloaded(chain)
    static = W + G + master + optimizer + off
    si, so = cols["saved_input_bytes"], cols["saved_output_bytes"]
    prev_so = np.concatenate([[0.0], so[:-1]])
    shared = np.where(prev_so > 0, si, 0.0)
    act = np.maximum(cols["saved"] - shared, 0.0)
    head = np.maximum(cols["in"] - si + shared, 0.0)
    tail = np.maximum(chain.cuts - so, 0.0)
    tail[-1] = 0.0
    # while layer l's forward runs: its input (unless l-1's activations already hold it, when it is shared)
    # and what the forward allocates, against act_l counted in full: forward_peak + in - shared - act_l
    peak = np.maximum(cols["forward_peak_bytes"] + cols["in"] - cols["saved"], cols["backward_peak_bytes"])
    foreach = str(chain.meta.get("device", "")).startswith("cuda")
    if foreach:
        step = _FOREACH_TEMPS[platform.optimizer] * wide * W
    else:
        step = _STEP_TEMPS[platform.optimizer] * wide * cols["max_param_bytes"]
    const = float(chain.meta.get("runtime_bytes", 0.0) or 0.0)
    parts = {"parameters": W, "gradients": G, "master": master, "optimizer": optimizer, "offloaded": off,
             "precision": precision}
    # one receive buffer for the activation coming in and one for the gradient coming back, at every
    # stage boundary (the neighbouring stage is on another device, by definition of a stage)
    buf_in = np.concatenate([[0.0], chain.cuts[:-1]])
    buf_out = chain.cuts.copy()
    return LayerTerms(act, head, tail, buf_in, buf_out, static, W * (1.0 if platform.stash else 0.0),
                      np.maximum(peak, 0.0), step, foreach, const, missing, "full", parts)


def layer_terms(chain: Chain, platform: Platform) -> LayerTerms:
    """The memory terms of ``chain`` under ``platform``'s set-up (cached on the chain).

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> t = layer_terms(Chain((Layer("a", 1, 1, 10, 4, 4),)), Platform(1, optimizer="adam"))
    >>> float(t.static[0])     # parameters, gradients, two Adam states
    40.0
    """
    key = (platform.memory_model, platform.optimizer, platform.precision, platform.weight_factor, platform.weights)
    cache = chain.__dict__.setdefault("_memory_terms", {})
    if key not in cache:
        cache[key] = _paper_terms(chain, platform) if platform.memory_model == "paper" else _full_terms(chain, platform)
    return cache[key]


# ----------------------------------------------------------------------------
# one stage, one device
# ----------------------------------------------------------------------------
def stage_activation(t: LayerTerms, first: int, last: int) -> float:
    """A = activation bytes one in-flight mini-batch holds on stage ``first..last``."""
    pa, _, _, head, tail, _, _ = t._lists
    return pa[last + 1] - pa[first] + head[first] + tail[last]


def stage_memory(t: LayerTerms, first: int, last: int, k: int) -> float:
    """Resident bytes of stage ``first..last`` with k mini-batches in flight:
    ``k A + static + buffers + (k-1) stash`` (buffers: its two receive buffers)."""
    pa, ps, pw, head, tail, bi, bo = t._lists
    k = max(int(k), 1)
    return (k * (pa[last + 1] - pa[first] + head[first] + tail[last]) + ps[last + 1] - ps[first]
            + bi[first] + bo[last] + (k - 1) * (pw[last + 1] - pw[first]))


def stage_op_excess(t: LayerTerms, first: int, last: int) -> float:
    """How far the forward or backward of stage ``first..last`` climbs above the resident state that
    counts its mini-batch in full (>= 0)."""
    if t.model == "paper":
        return 0.0
    pa = t.p_act
    best = 0.0
    for l in range(first, last + 1):
        best = max(best, float(t.peak[l]) - float(pa[last + 1] - pa[l + 1]))
    return best


def stage_step(t: LayerTerms, first: int, last: int) -> float:
    """The optimizer step's temporaries for stage ``first..last``'s parameters."""
    if t.model == "paper":
        return 0.0
    return float(t.p_step[last + 1] - t.p_step[first]) if t.step_sum else float(t.step[first:last + 1].max())


def stage_excess(t: LayerTerms, first: int, last: int) -> float:
    """How far an operation of stage ``first..last`` climbs above the resident state (>= 0): its
    forward or backward, or the optimizer step after the backward (which runs once the mini-batch's
    activations are freed)."""
    if t.model == "paper":
        return 0.0
    # the step runs once this mini-batch's activations are freed, while its input gradient waits to be sent
    freed = float(t.p_act[last + 1] - t.p_act[first]) + float(t.tail[last]) - float(t.buf_in[first])
    return max(stage_op_excess(t, first, last), stage_step(t, first, last) - freed)


def device_extra(t: LayerTerms, stages: Iterable[tuple[int, int]]) -> float:
    """What a device holding stages ``(first, last)`` needs beyond their resident bytes: their largest
    excess and the runtime constant (0 with no stage). Neither depends on the in-flight counts."""
    ranges = list(stages)
    if not ranges:
        return 0.0
    return max(stage_excess(t, a, b) for a, b in ranges) + t.const


def device_budget(t: LayerTerms, limit: float, stages: Iterable[tuple[int, int]]) -> float:
    """What a device's stages may hold at most in resident bytes: the limit less :func:`device_extra`."""
    return limit - device_extra(t, stages)


def device_memory(t: LayerTerms, stages: Iterable[tuple[int, int, int]]) -> float:
    """Peak bytes of a device holding ``(first, last, k)`` stages (0 when it holds none)."""
    items = list(stages)
    if not items:
        return 0.0
    return sum(stage_memory(t, a, b, k) for a, b, k in items) + device_extra(t, [(a, b) for a, b, _ in items])


# ----------------------------------------------------------------------------
# every stage i..j at once, for the dynamic programmes
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


def band_terms(t: LayerTerms, I: np.ndarray, J: np.ndarray) -> BandTerms:
    """Stage terms for starts ``I`` (shape (n, 1)) and ends ``J`` (shape (n, w), ``J >= I``,
    consecutive along axis 1): the excess's maximum over the stage is a running maximum.

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))),
    ...                 Platform(1, memory_model="paper"))
    >>> b = band_terms(t, np.arange(3)[:, None], np.minimum(np.arange(3)[:, None] + np.arange(2), 2))
    >>> b.A.tolist()
    [[2.0, 4.0], [2.0, 4.0], [2.0, 2.0]]
    """
    pa, ps, pw = t.p_act, t.p_static, t.p_stash
    A = pa[J + 1] - pa[I] + t.head[I] + t.tail[J]
    static = ps[J + 1] - ps[I] + t.buf_in[I] + t.buf_out[J]
    stash = pw[J + 1] - pw[I]
    if t.model == "paper":
        return BandTerms(A, static, stash, np.zeros_like(A))
    h = t.peak + pa[1:]                                   # peak_l + sum act up to l
    excess = np.maximum.accumulate(h[J], axis=1) - pa[J + 1]
    if t.step_sum:
        step = t.p_step[J + 1] - t.p_step[I]
    else:
        step = np.maximum.accumulate(t.step[J], axis=1)
    excess = np.maximum(np.maximum(excess, step - (pa[J + 1] - pa[I]) - t.tail[J] + t.buf_in[I]), 0.0)
    return BandTerms(A, static, stash, excess + t.const)


def suffix_terms(t: LayerTerms) -> BandTerms:
    """:class:`BandTerms` of the stages ``i..L-1`` for every i (arrays of length L).

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))),
    ...                 Platform(1, memory_model="paper"))
    >>> suffix_terms(t).A.tolist()
    [6.0, 4.0, 2.0]
    """
    L = len(t)
    I = np.arange(L)
    pa, ps, pw = t.p_act, t.p_static, t.p_stash
    A = pa[L] - pa[I] + t.head + t.tail[L - 1]
    static = ps[L] - ps[I] + t.buf_in
    stash = pw[L] - pw[I]
    if t.model == "paper":
        return BandTerms(A, static, stash, np.zeros(L))
    h = t.peak + pa[1:]
    excess = np.maximum.accumulate(h[::-1])[::-1] - pa[L]
    step = (t.p_step[L] - t.p_step[I]) if t.step_sum else np.maximum.accumulate(t.step[::-1])[::-1]
    excess = np.maximum(np.maximum(excess, step - (pa[L] - pa[I]) - t.tail[L - 1] + t.buf_in), 0.0)
    return BandTerms(A, static, stash, excess + t.const)


def square_terms(t: LayerTerms) -> BandTerms:
    """:class:`BandTerms` of every stage ``i..j`` as L x L matrices (``A`` is inf where j < i).

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> t = layer_terms(Chain(tuple(Layer(f"l{i}", 1, 1, 4, 2, 2) for i in range(3))),
    ...                 Platform(1, memory_model="paper"))
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
    sum_{l ends a stage} (k_l tail_l + buf_tail_l) + extra``, where ``extra`` (the largest stage excess plus
    ``const``) is at most ``max(max_l excess_ub_l, sum_l step_sum_l) + const`` over its layers:
    ``excess_ub`` bounds a layer's share of the excess (the stage's later layers only lower it)
    and ``step_sum`` is the foreach step's per-layer temporaries (zero when the step loops).
    Exact for everything but ``extra``, which is an upper bound.
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


def linear_terms(t: LayerTerms) -> LinearTerms:
    """:class:`LinearTerms` of ``t``.

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> t = layer_terms(Chain((Layer("l", 1.0, 1.0, weight_bytes=10, saved_bytes=4),)),
    ...                 Platform(1, memory_model="paper"))
    >>> [float(x[0]) for x in (linear_terms(t).a, linear_terms(t).w0)]   # a = 4 + 10 stashed, w0 = 0
    [14.0, 0.0]
    """
    zero = np.zeros(len(t))
    if t.step_sum:
        ub, step = t.peak, t.step
    else:
        ub, step = np.maximum(t.peak, t.step), zero
    return LinearTerms(t.act + t.stash, t.static - t.stash, t.head, t.tail, t.buf_in, t.buf_out, ub, step, t.const)
