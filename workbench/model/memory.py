"""The memory model: what one device holds while it trains its stages (docs/model.md, "Memory").

Every planner, the schedule builder, the simulator and the memory views get
device memory from this module; only :mod:`workbench.verify.check` re-derives it, on
its own, from docs/model.md. The views over a whole plan (every device's
memory, its split by term, the estimate note, torch's engine extra, merged
layers' columns) are in :mod:`workbench.model.memory_views`; shared parameters
are read by :mod:`workbench.model.ties`.

**The training loop** (``TrainingSetup.zero_grad``): ``none`` (torch's default,
``optimizer.zero_grad()`` sets every gradient to None) or ``zeros`` (gradients
zeroed in place, a resident buffer). A periodic plan steps after every
mini-batch's backward (PipeDream), so under ``none`` a stage's gradients live
from its backward to its step; under ``zeros`` they are resident and every
backward adds into them (a transient of the new gradient, which the profiled
``backward_peak_bytes`` holds; ``backward_fresh_peak_bytes`` is the backward that
writes fresh gradients instead).

**Per layer l** (arrays over the chain, :func:`layer_terms`), from the
profile's columns (estimated where a profile lacks them, see
:data:`ESTIMATES`), with ``in_l`` the bytes entering layer l (the chain's
input for l = 0, else the cut before it) and ``out_l`` the cut after it:

* ``act[l]  = saved_l - shared_l``: activation bytes one in-flight
  mini-batch keeps inside a stage. ``shared_l`` is storage layer l saves
  that layer l-1 saves too (l saves its input, l-1 its output): counted once.
* ``head[l]``, ``tail[l]`` (per in-flight mini-batch) and ``buf_in[l]``, ``buf_out[l]`` (once): the
  stage-boundary terms, added when l *starts* (head, buf_in) or *ends* (tail, buf_out) a stage, each the
  sum of its side's terms in the one table :data:`workbench.model.memory_terms.BOUNDARY_TERMS`: today
  ``head = in_l - saved_input_l + shared_l`` (the runtime holds the stage's input until the backward, and a
  copy received from another device is not shared with the sender's), ``tail = out_l - saved_output_l`` (0
  for the last layer, whose output ends in the loss: the stage's output held until the backward),
  ``buf_in = in_l`` (l > 0) and ``buf_out = out_l`` (a receive buffer for the activation arriving when l
  starts a stage and one for the gradient arriving when l ends one: a stage's neighbours are on other
  devices). ``grad_sent[l] = in_l`` (l > 0): the input gradient a stage's step finds waiting to be sent.
* ``static[l]``: parameters + gradients (``zeros`` only: a resident accumulation
  buffer) + optimizer state (+ an fp32 master copy of the parameters, and under
  ``zeros`` of their gradients, under ``bf16-mixed``) (+ the one resident copy
  of an offloaded layer's activations, ``Layer.offload_bytes``: docs/model.md,
  "Activation policies"; policies act through
  :func:`workbench.model.activations.apply_policies`); ``stash[l]``: one more
  parameter version per extra in-flight mini-batch under weight stashing.
* ``fwd[l] = forward_peak_l + in_l - saved_l`` and ``bwd[l]``, the backward's
  climb (``backward_peak_l``; under ``none`` the fresh one): how far the layer's
  forward or backward climbs above the state that counts its mini-batch's
  activations in full; ``peak = max(fwd, bwd)``.
* ``grad[l]``: gradient bytes its backward creates that stay until the step
  (``none``: its gradients; a sharer's copy of a tied parameter counts here too);
  ``created[l]``: those the step finds (with the fp32 master gradients under
  ``bf16-mixed``).
* ``step[l]``: the optimizer step's temporaries (Adam's ``sqrt`` and
  division: two parameter-sized tensors of the largest parameter when
  the step loops over parameters, as on CPU; one per parameter byte when it
  is ``foreach``, as on GPUs).

**Tied parameters** (:mod:`workbench.model.ties`): a stage that holds a sharing
layer but not the owner holds a copy. With ``single`` weights (torch's engine:
every holder all-reduces the gradient and steps its copy) the copy has its
parameter, gradient, optimizer state (and fp32 masters) and takes a step;
with ``stash`` (the PipeDream engine: the sharer sends its gradient to the
owner, which alone steps) the copy has its parameter, one stashed version per
extra in-flight mini-batch and a fresh gradient from its backward until the
step (sent), and the owner's stage, when a sharer is elsewhere, a receive buffer
per mini-batch in flight (posted when its forward starts, added to its own
gradient before its step).

**A stage** ``i..j`` with k mini-batches in flight holds
``k A + static + buf_in_i + buf_out_j + (k - 1) stash + ties`` with ``A = sum act + head_i + tail_j``,
and climbs above that by its *excess*, the largest of
``fwd_l - sum_{m=l+1..j} (act_m + off_m)`` (while layer l's forward runs the stage's later
layers hold nothing of this mini-batch yet, their offloaded copy ``off`` included),
``bwd_l + sum_{m=l+1..j} (grad_m - act_m - off_m)``
(its backward: the later layers' activations are freed, their gradients made)
and ``step + created - sum act - tail_j + grad_sent_i - offloaded`` (the step, once the
mini-batch's activations, its offloaded copy included, are freed, while its input gradient, for i > 0,
waits to be sent). **A device** holds the sum over its stages, plus the
largest excess of its stages (one operation runs at a time), plus a runtime
constant (0 on CPU; the profile's ``runtime_bytes``). The excess and the
constant do not depend on the in-flight counts, so for a fixed allocation a
planner can treat them as a smaller limit (:func:`device_budget`).

Exact or a bound: with one stage per device the peak over the periodic
timeline is exactly this (while any operation of mini-batch i runs, k
mini-batches hold activations), given the profile's per-layer peaks. With
several stages on a device it is an upper bound: their largest operations
need not coincide with all their mini-batches in flight. The ``paper``
model is rule 7 of the original paper: ``k A + phi W + [stash] (k - 1) W``
with ``A`` the plain sum of saved bytes and nothing else.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain((Layer("a", 1, 1, 100, 10, 10), Layer("b", 1, 1, 50, 20, 10)), input_bytes=8)
>>> paper = layer_terms(chain, Target.of(1, memory_model="paper"))
>>> stage_memory(paper, 0, 1, 2)                    # 2 x 20 + 150 + (2 - 1) x 150
340.0
>>> zeros = layer_terms(chain, Target.of(1, optimizer="sgd", zero_grad="zeros"))
>>> float(zeros.static.sum()), zeros.estimated[:2]    # parameters + gradients; columns estimated
(300.0, ('grad_bytes', 'max_param_bytes'))
>>> float(layer_terms(chain, Target.of(1, optimizer="sgd")).static.sum())   # none: no gradient between steps
150.0
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Iterable

import numpy as np

from workbench.model.memory_columns import ESTIMATES, measured_columns, validate_setup
from workbench.model.memory_terms import BoundaryInputs, BoundaryTerm, boundary_columns
from workbench.model.memory_zero import DataParallel, shard_layer_terms
from workbench.model.ties import Tie, chain_ties, tie_flags
from workbench.model.training_setup import MEMORY_MODELS, OPTIMIZERS, PRECISIONS, ZERO_GRADS

if TYPE_CHECKING:  # memory is below chain: chain.py imports from here
    from workbench.model.chain import Chain
    from workbench.model.target import Target

__all__ = [
    "OPTIMIZER_STATES", "PRECISIONS", "MEMORY_MODELS", "ZERO_GRADS", "ESTIMATES", "LayerTerms", "TieTerms",
    "layer_terms", "stage_activation", "stage_memory", "stage_excess", "stage_op_excess", "stage_step",
    "stage_created", "StageTies", "stage_ties", "device_memory", "device_extra", "device_budget", "flushed_platform",
    "validate_setup", "measured_columns", "setup_key",
]

#: optimizer -> state tensors per parameter (none: no optimizer state; sgd: plain SGD)
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
#: optimizer -> parameter-sized temporaries of one parameter's update (torch's for-loop step)
_STEP_TEMPS = {"none": 0, "sgd": 0, "momentum": 0, "adam": 2, "adamw": 2}
#: optimizer -> temporaries per parameter byte of the foreach step (GPU default)
_FOREACH_TEMPS = {"none": 0, "sgd": 0, "momentum": 0, "adam": 1, "adamw": 1}
assert tuple(OPTIMIZER_STATES) == tuple(_STEP_TEMPS) == tuple(_FOREACH_TEMPS) == OPTIMIZERS
_PROFILE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


@dataclass(frozen=True)
class TieTerms:
    """What one tied parameter adds to a stage (module docstring): to a stage holding a ``copy``, its
    resident bytes ``static``, ``stash`` per extra in-flight mini-batch, the gradient the step finds
    (``created``) and the foreach step's temporaries (``foreach``); to the owner's stage while a
    sharer is elsewhere (``away``), a receive buffer ``recv`` and ``recv_k`` more per extra mini-batch
    in flight."""

    tie: Tie
    static: float
    stash: float
    created: float
    foreach: float
    recv: float
    recv_k: float = 0.0


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
    fwd: np.ndarray
    bwd: np.ndarray
    grad: np.ndarray
    created: np.ndarray
    step: np.ndarray
    step_sum: bool
    const: float
    estimated: tuple[str, ...]
    model: str
    parts: dict
    ties: tuple[TieTerms, ...] = ()
    grad_sent: np.ndarray | None = None
    boundary: tuple[tuple[BoundaryTerm, np.ndarray], ...] = ()

    def __post_init__(self) -> None:
        if self.grad_sent is None:
            object.__setattr__(self, "grad_sent", np.zeros(len(self.act)))
        z = lambda a: np.concatenate([[0.0], np.cumsum(a)])  # noqa: E731
        object.__setattr__(self, "peak", np.maximum(self.fwd, self.bwd))
        object.__setattr__(self, "p_act", z(self.act))
        object.__setattr__(self, "p_static", z(self.static))
        object.__setattr__(self, "p_stash", z(self.stash))
        object.__setattr__(self, "p_step", z(self.step))
        object.__setattr__(self, "p_grad", z(self.grad))
        object.__setattr__(self, "p_created", z(self.created))
        object.__setattr__(self, "p_off", z(self.parts.get("offloaded", np.zeros(len(self.act)))))
        object.__setattr__(self, "_lists", (self.p_act.tolist(), self.p_static.tolist(), self.p_stash.tolist()))
        # the boundary arrays as lists, for the scalar stage functions (boundary_bytes indexes them)
        object.__setattr__(self, "_edges", SimpleNamespace(head=self.head.tolist(), tail=self.tail.tolist(),
                                                           buf_in=self.buf_in.tolist(), buf_out=self.buf_out.tolist()))

    def __len__(self) -> int:
        return len(self.act)

    @property
    def has_excess(self) -> bool:
        """Whether any operation climbs above the resident state (always False in the paper model)."""
        return bool(np.any(self.peak > 0) or np.any(self.step > 0) or np.any(self.created > 0)
                    or any(x.created > 0 or x.foreach > 0 for x in self.ties) or self.const > 0)


def _paper_terms(chain: Chain, platform: Target) -> LayerTerms:
    L = len(chain)
    zero = np.zeros(L)
    W = chain.weights
    phiW = platform.setup.weight_factor * W
    off = _offloaded(chain)
    parts = {"weights": phiW, "offloaded": off}
    return LayerTerms(chain.saved_array.astype(float), zero, zero, zero, zero, phiW + off,
                      W * (1.0 if platform.setup.stash else 0.0), zero, zero, zero, zero, zero, False, 0.0, (), "paper",
                      parts)


def _offloaded(chain: Chain) -> np.ndarray:
    """Per layer, the one copy of offloaded activations a device holds (docs/model.md, "Activation policies")."""
    return np.array([float(l.offload_bytes) for l in chain.layers])


def _tie_terms(chain: Chain, platform: Target, wide: float, mixed: bool) -> tuple[TieTerms, ...]:
    """The stage terms of every tied parameter (module docstring), by engine: ``single`` weights step every
    copy (torch's engine), ``stash`` send the sharer's gradient to the owner (the PipeDream engine)."""
    zeros = platform.setup.zero_grad == "zeros"
    n_states = OPTIMIZER_STATES[platform.setup.optimizer]
    out = []
    for tie in chain_ties(chain):
        c = tie.nbytes
        if platform.setup.stash:      # the owner posts a receive per mini-batch when its forward starts
            out.append(TieTerms(tie, c, c, c, 0.0, c, c))
            continue
        master = wide * c if mixed else 0.0
        static = c + n_states * wide * c + master + ((c + master) if zeros else 0.0)
        created = 0.0 if zeros else c + master
        out.append(TieTerms(tie, static, 0.0, created, _FOREACH_TEMPS[platform.setup.optimizer] * wide * c, 0.0))
    return tuple(out)


def _backward_terms(cols: dict, ties: tuple[TieTerms, ...], platform: Target, G: np.ndarray,
                    wide: float, mixed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bwd, grad, created) per layer for the set-up's training loop (module docstring)."""
    L = len(G)
    shared = np.zeros(L)        # a sharer's bytes of tied parameters (its copy's gradient)
    for x in ties:
        shared[list(x.tie.sharers)] += x.tie.nbytes
    bp, fresh = cols["backward_peak_bytes"], cols["backward_fresh_peak_bytes"]
    if platform.setup.zero_grad == "none":
        return fresh, G + shared, G * (1.0 + (wide if mixed else 0.0))
    if platform.setup.stash:          # zeros, PipeDream: the sharer's copy gets a fresh gradient, sent to the owner
        return np.where(shared > 0, np.minimum(fresh, bp + shared), bp), shared, np.zeros(L)
    return bp, np.zeros(L), np.zeros(L)


def _full_terms(chain: Chain, platform: Target) -> LayerTerms:
    precision = validate_setup(platform, chain)
    cols, missing = measured_columns(chain)
    L = len(chain)
    W = chain.weights
    G = cols["grad_bytes"]
    zeros = platform.setup.zero_grad == "zeros"
    n_states = OPTIMIZER_STATES[platform.setup.optimizer]
    mixed = precision == "bf16-mixed"
    # fp32 copies under bf16-mixed: parameters and gradients (masters) and the optimizer state
    wide = 4.0 / _PROFILE_DTYPE_BYTES.get(str(chain.meta.get("dtype", "bfloat16")), 2) if mixed else 1.0
    master = (wide * W + (wide * G if zeros else 0.0)) if mixed else np.zeros(L)
    optimizer = n_states * wide * W
    off = _offloaded(chain)
    grads = G if zeros else np.zeros(L)
    static = W + grads + master + optimizer + off
    edge = BoundaryInputs.of_chain(chain, cols["saved_input_bytes"], cols["saved_output_bytes"],
                                   platform.setup)
    act = np.maximum(cols["saved"] - edge.shared, 0.0)
    # while layer l's forward runs: its input (unless l-1's activations already hold it, when it is shared)
    # and what the forward allocates, against act_l counted in full: forward_peak + in - shared - act_l
    fwd = np.maximum(cols["forward_peak_bytes"] + cols["in"] - cols["saved"], 0.0)
    ties = _tie_terms(chain, platform, wide, mixed)
    bwd, grad, created = _backward_terms(cols, ties, platform, G, wide, mixed)
    foreach = str(chain.meta.get("device", "")).startswith("cuda")
    if foreach:
        step = _FOREACH_TEMPS[platform.setup.optimizer] * wide * W
    else:
        largest = cols["max_param_bytes"].copy()
        if not platform.setup.stash:      # torch's engine steps a sharer's copy too
            for x in ties:
                largest[list(x.tie.sharers)] = np.maximum(largest[list(x.tie.sharers)], x.tie.nbytes)
        step = _STEP_TEMPS[platform.setup.optimizer] * wide * largest
    const = float(chain.meta.get("runtime_bytes", 0.0) or 0.0)
    parts = {"parameters": W, "gradients": grads, "master": master, "optimizer": optimizer, "offloaded": off,
             "precision": precision}
    if platform.layout.dp > 1:       # a rank of a data-parallel group (docs/model.md, "Layouts")
        static, act, fwd, bwd, grad, created, step = _data_parallel(
            chain, platform, parts, (act, fwd, bwd, grad, created, step, cols), G, n_states, wide, mixed, foreach)
    # the stage-boundary terms, one table (workbench.model.memory_terms): the held input and output, the
    # receive buffers; the input gradient a stage's step finds waiting to be sent is not one of them
    b = boundary_columns(edge)
    grad_sent = np.concatenate([[0.0], edge.cuts[:-1]])
    return LayerTerms(act, b.head, b.tail, b.buf_in, b.buf_out, static, W * (1.0 if platform.setup.stash else 0.0),
                      fwd, np.maximum(bwd, 0.0), grad, created, step, foreach, const, missing, "full", parts, ties,
                      grad_sent, b.by_term)


def _data_parallel(chain: Chain, platform: Target, parts: dict, replica: tuple, G: np.ndarray, n_states: int,
                   wide: float, mixed: bool, foreach: bool) -> tuple[np.ndarray, ...]:
    """The replica's (act, fwd, bwd, grad, created, step) and ``parts`` turned into one rank's under ZeRO
    (:mod:`workbench.model.memory_zero`); returns static first. ``parts`` is updated in place."""

    act, fwd, bwd, grad, created, step, cols = replica
    dp = DataParallel(platform.layout.dp, platform.layout.zero, pipelined=platform.devices > 1)
    W = parts["parameters"]
    t = shard_layer_terms(W, G, bwd, cols["in"], states=n_states, wide=wide, mixed=mixed,
                          zeros=platform.setup.zero_grad == "zeros", foreach=foreach, dp=dp)
    parts.update({k: t[k] for k in ("parameters", "gradients", "master", "optimizer")})
    static = t["parameters"] + t["gradients"] + t["master"] + t["optimizer"] + parts["offloaded"]
    if platform.setup.zero_grad == "none":      # a tied sharer's copy keeps the replica's gradient (grad - G)
        grad, created = grad - G + t["made"], t["created"]
    return (static, act + t["act"], fwd + t["fwd"], t["bwd"], grad, created, step * t["step"])


def flushed_platform(platform: Target) -> Target:
    """A flushed schedule's terms with its gradients resident (docs/model.md, "The training loop"): its
    micro-batches' gradients accumulate to the step after the flush, resident under ``zero_grad zeros`` and,
    under ``none``, from the end of each stage's first backward (the simulator and the order's peaks take
    them out of these terms until then; a bound before it, as the torch-schedule planner's seeds use it).

    >>> from workbench.model.target import Target
    >>> flushed_platform(Target.of(2)).setup.zero_grad
    'zeros'
    """
    return platform.with_(zero_grad="zeros") if platform.setup.memory_model == "full" else platform


def setup_key(platform: Target) -> tuple:
    """What of ``platform`` the memory terms read (the caches of :func:`layer_terms` and of the policy terms
    are keyed on it): the training set-up, whether there is more than one pipeline rank, and each rank's
    data-parallel group (the layout's ``dp`` and ``zero``; the paper's model reads none)."""
    if platform.setup.paper or platform.layout.dp == 1:
        return (platform.setup, platform.devices > 1)
    return (platform.setup, platform.devices > 1, platform.layout.dp, platform.layout.zero)


def layer_terms(chain: Chain, platform: Target) -> LayerTerms:
    """The memory terms of ``chain`` under ``platform``'s set-up (cached on the chain).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> t = layer_terms(Chain((Layer("a", 1, 1, 10, 4, 4),)), Target.of(1, optimizer="adam", zero_grad="zeros"))
    >>> float(t.static[0])     # parameters, gradients, two Adam states
    40.0
    """
    key = setup_key(platform)
    cache = chain.__dict__.setdefault("_memory_terms", {})
    if key not in cache:
        cache[key] = _paper_terms(chain, platform) if platform.setup.paper else _full_terms(chain, platform)
    return cache[key]


# ----------------------------------------------------------------------------
# one stage, one device
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StageTies:
    """What the tied parameters add to one stage (module docstring): resident bytes (``static``), bytes per
    extra in-flight mini-batch (``stash``: a copy's stashed versions and, ``recv_k`` of them, the owner's
    receive buffers), foreach step temporaries (``foreach``), gradients its step finds (``created``) and, of
    ``static``, the receive buffer its step no longer holds (``recv``: the owner added the sharer's gradient
    before its step)."""

    static: float = 0.0
    stash: float = 0.0
    foreach: float = 0.0
    created: float = 0.0
    recv: float = 0.0
    recv_k: float = 0.0


def stage_ties(t: LayerTerms, first: int, last: int) -> StageTies:
    """The tied parameters' terms of stage ``first..last`` (all 0 without ties).

    >>> import json
    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> tied = json.dumps([{"owner": "a", "layers": ["a", "b"], "bytes": 8}])
    >>> ch = Chain((Layer("a", 1, 1, 8), Layer("b", 1, 1)), meta={"tied": tied})
    >>> stage_ties(layer_terms(ch, Target.of(2, optimizer="adam", weights="single")), 1, 1)   # a copy, 2 Adam states
    StageTies(static=24.0, stash=0.0, foreach=8.0, created=8.0, recv=0.0, recv_k=0.0)
    """
    if not t.ties:
        return _NO_TIES
    static = stash = foreach = created = recv = recv_k = 0.0
    for x in t.ties:
        copy, away = tie_flags(x.tie, np.array(first), np.array(last))
        if copy:
            static, stash, foreach = static + x.static, stash + x.stash, foreach + x.foreach
            created += x.created
        if away:
            static, recv = static + x.recv, recv + x.recv
            stash, recv_k = stash + x.recv_k, recv_k + x.recv_k
    return StageTies(static, stash, foreach, created, recv, recv_k)


_NO_TIES = StageTies()


def stage_activation(t: LayerTerms, first: int, last: int) -> float:
    """A = activation bytes one in-flight mini-batch holds on stage ``first..last``."""
    pa, e = t._lists[0], t._edges       # + the boundary terms per mini-batch (memory_terms.boundary_bytes)
    return pa[last + 1] - pa[first] + e.head[first] + e.tail[last]


def stage_memory(t: LayerTerms, first: int, last: int, k: int) -> float:
    """Resident bytes of stage ``first..last`` with k mini-batches in flight:
    ``k A + static + buffers + (k-1) stash`` (buffers: its two receive buffers; tied copies included)."""
    (pa, ps, pw), e = t._lists, t._edges
    k = max(int(k), 1)
    ties = stage_ties(t, first, last)
    # the boundary terms (memory_terms.boundary_bytes), spelled out to keep the sums' order
    return (k * (pa[last + 1] - pa[first] + e.head[first] + e.tail[last]) + ps[last + 1] - ps[first]
            + e.buf_in[first] + e.buf_out[last] + (k - 1) * (pw[last + 1] - pw[first]) + ties.static
            + (k - 1) * ties.stash)


def stage_op_excess(t: LayerTerms, first: int, last: int) -> float:
    """How far the forward or backward of stage ``first..last`` climbs above the resident state that
    counts its mini-batch in full (>= 0)."""
    if t.model == "paper":
        return 0.0
    pa, pg, po = t.p_act, t.p_grad, t.p_off
    best = 0.0
    for l in range(first, last + 1):
        # the later layers' activations (and offloaded copies) do not exist yet (forward) or any more (backward)
        later_act = float(pa[last + 1] - pa[l + 1]) + float(po[last + 1] - po[l + 1])
        best = max(best, float(t.fwd[l]) - later_act, float(t.bwd[l]) + float(pg[last + 1] - pg[l + 1]) - later_act)
    return best


def stage_step(t: LayerTerms, first: int, last: int) -> float:
    """The optimizer step's temporaries for stage ``first..last``'s parameters (and a copy it steps)."""
    if t.model == "paper":
        return 0.0
    if not t.step_sum:
        return float(t.step[first:last + 1].max())
    return float(t.p_step[last + 1] - t.p_step[first]) + stage_ties(t, first, last).foreach


def stage_created(t: LayerTerms, first: int, last: int) -> float:
    """The gradients the step of stage ``first..last`` finds that are not resident (0 under ``zeros``, but
    for a PipeDream copy's)."""
    if t.model == "paper":
        return 0.0
    return float(t.p_created[last + 1] - t.p_created[first]) + stage_ties(t, first, last).created


def stage_excess(t: LayerTerms, first: int, last: int) -> float:
    """How far an operation of stage ``first..last`` climbs above the resident state (>= 0): its
    forward or backward, or the optimizer step after the backward (which runs once the mini-batch's
    activations are freed, with the gradients its backward made)."""
    if t.model == "paper":
        return 0.0
    # the step runs once this mini-batch's activations are freed (its offloaded ones too, and a tied gradient
    # received has been added), while its input gradient waits to be sent
    freed = (float(t.p_act[last + 1] - t.p_act[first]) + float(t.tail[last]) - float(t.grad_sent[first])
             + stage_ties(t, first, last).recv + float(t.p_off[last + 1] - t.p_off[first]))
    return max(stage_op_excess(t, first, last), stage_step(t, first, last) + stage_created(t, first, last) - freed)


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
