"""Activation policies: what each layer does with the tensors autograd saves (docs/model.md,
"Activation policies").

Every layer is ``keep`` (today's training: the saved tensors stay on the device
until the backward), ``recompute`` (activation checkpointing of the layer alone:
only its input is kept, the forward runs again inside the backward) or
``offload`` (the saved tensors go to host memory after the forward and come back
before the backward). A policy changes only the layer's own profile columns, so
a policy vector turns a chain into an *effective chain* (:func:`apply_policies`)
on which the memory model (:mod:`workbench.model.memory`), the schedule builder and
every planner work unchanged; the host link is the one new resource
(:func:`stage_host_time`, rule 8 in docs/model.md). With in the layer's input
bytes, out its output, saved, saved_input (si), forward_peak (fp) and
backward_peak (bp) its profile columns:

``recompute``
    backward + forward time; saved = si = in, saved_output = 0 (the checkpoint
    keeps its input, shared with the previous layer's saved output as before);
    forward_peak = fp (an upper bound: the checkpointed forward frees what it
    would have saved); backward_peak = max(fp + out, saved - si + bp): the
    recomputation climbs like the forward, with the incoming gradient (out)
    alive, and the backward then runs on the recomputed tensors as it did on
    the kept ones. Measured against torch.utils.checkpoint under the
    profiler's allocation tracker in ``benchmarks/policies.py``.
``offload``
    saved = si = saved_output = 0 on the device; ``offload_bytes`` = saved: one
    copy resident (the forward's, until it has gone out, or the backward's,
    from when it starts coming back), moved to host and back per mini-batch;
    forward_peak = max(fp - saved, 0) (the copy is counted resident) and
    backward_peak = bp.

Both keep the backward that writes fresh gradients (``backward_fresh_peak``, bf) beside
the one that adds into them: recompute's is max(fp + out, saved - si + bf), offload's bf.

>>> from workbench.model.chain import Chain, Layer
>>> chain = Chain((Layer("a", 1.0, 2.0, 0, 8, 40, 0, 0, 4, 0, 48, 60), Layer("b", 1.0, 1.0, 0, 8)), input_bytes=4)
>>> eff = apply_policies(chain, ["recompute", "offload"])
>>> eff[0].backward, eff[0].saved_bytes, eff[0].backward_peak_bytes   # 2 + 1; the input; max(48 + 8, 36 + 60)
(3.0, 4.0, 96.0)
>>> eff[1].saved_bytes, eff[1].offload_bytes
(0.0, 8.0)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from workbench.model.chain import Chain, Layer
from workbench.model.memory import measured_columns
from workbench.model.target import Target

if TYPE_CHECKING:
    from workbench.model.memory import LayerTerms

__all__ = ["POLICIES", "MODES", "policy_vector", "apply_policies", "is_keep", "stage_host_time",
           "policy_counts", "describe", "PolicyTerms", "policy_terms"]

#: per-layer activation policies, in the order planners try them
POLICIES = ("keep", "recompute", "offload")
#: what ``plan --activations`` takes: one policy for every layer, or ``auto`` (the planner chooses)
MODES = POLICIES + ("auto",)
_SHORT = {"keep": "k", "recompute": "r", "offload": "o"}


def policy_vector(spec: str | Sequence[str] | None, n_layers: int) -> tuple[str, ...]:
    """One policy per layer from a policy name (every layer), a sequence of names, or None (keep).

    >>> policy_vector("recompute", 2)
    ('recompute', 'recompute')
    >>> policy_vector(["keep", "offload"], 2)
    ('keep', 'offload')
    >>> policy_vector(["keep"], 2)
    Traceback (most recent call last):
    ...
    ValueError: activations: 1 policies for a chain of 2 layers (one per layer, in layer order)
    """
    if spec is None:
        return ("keep",) * n_layers
    if isinstance(spec, str):
        if spec not in POLICIES:
            raise ValueError(f"unknown activation policy {spec!r}; known: {', '.join(POLICIES)}")
        return (spec,) * n_layers
    out = tuple(str(p) for p in spec)
    if len(out) != n_layers:
        raise ValueError(f"activations: {len(out)} policies for a chain of {n_layers} layers "
                         "(one per layer, in layer order)")
    bad = sorted({p for p in out if p not in POLICIES})
    if bad:
        raise ValueError(f"unknown activation policy {bad[0]!r} in activations; known: {', '.join(POLICIES)}")
    return out


def is_keep(policies: Sequence[str] | None) -> bool:
    """True when every layer keeps its activations (or no policy is given)."""
    return not policies or all(p == "keep" for p in policies)


def _recompute(layer: Layer, c: dict[str, float]) -> Layer:
    return replace(layer, backward=layer.backward + layer.forward, saved_bytes=c["in"], saved_input_bytes=c["in"],
                   saved_output_bytes=0.0, forward_peak_bytes=c["fp"],
                   backward_peak_bytes=max(c["fp"] + c["out"], c["saved"] - c["si"] + c["bp"]),
                   backward_fresh_peak_bytes=max(c["fp"] + c["out"], c["saved"] - c["si"] + c["bf"]), offload_bytes=0.0)


def _offload(layer: Layer, c: dict[str, float]) -> Layer:
    return replace(layer, saved_bytes=0.0, saved_input_bytes=0.0, saved_output_bytes=0.0,
                   forward_peak_bytes=max(c["fp"] - c["saved"], 0.0), backward_peak_bytes=c["bp"],
                   backward_fresh_peak_bytes=c["bf"], offload_bytes=c["saved"])


def apply_policies(chain: Chain, policies: Sequence[str] | str | None) -> Chain:
    """The effective chain of ``chain`` under one policy per layer (the module docstring).

    All ``keep`` returns ``chain`` itself. Other layers get every memory column
    (estimated ones as docs/model.md estimates them; the chain's meta
    ``estimated_columns`` keeps their names, so plans still say so) and
    ``offload_bytes``. Cached on the chain.
    """
    pol = policy_vector(policies, len(chain))
    if is_keep(pol):
        return chain
    cache = chain.__dict__.setdefault("_policy_chains", {})
    if pol in cache:
        return cache[pol]
    cols, missing = measured_columns(chain)
    layers = list(chain.layers)
    for l, p in enumerate(pol):
        if p == "keep":
            continue
        c = {"in": float(cols["in"][l]), "out": float(cols["out"][l]), "saved": float(cols["saved"][l]),
             "si": float(cols["saved_input_bytes"][l]), "fp": float(cols["forward_peak_bytes"][l]),
             "bp": float(cols["backward_peak_bytes"][l]), "bf": float(cols["backward_fresh_peak_bytes"][l])}
        filled = replace(layers[l], **{k: float(cols[k][l]) for k in ("grad_bytes", "max_param_bytes")})
        layers[l] = _recompute(filled, c) if p == "recompute" else _offload(filled, c)
    meta = {**chain.meta, "activations": "".join(_SHORT[p] for p in pol)}
    if missing:
        meta["estimated_columns"] = ",".join(missing)
    # no graph: a planner that re-orders a DAG would lose the policies (graph=None keeps the order)
    out = Chain(tuple(layers), chain.input_bytes, chain.cut_bytes, meta)
    cache[pol] = out
    return out


def stage_host_time(chain: Chain, platform: Target, first: int, last: int) -> float:
    """Seconds one way on the device's host link for stage ``first..last`` of an effective chain: its
    offloaded bytes over the host bandwidth (the transfer out after the stage's forward, and the
    same back before its backward).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> eff = apply_policies(Chain((Layer("a", 1, 1, 0, 8, 64),)), "offload")
    >>> stage_host_time(eff, Target.of(1, host_bandwidth=32), 0, 0)
    2.0
    """
    total = float(np.sum([chain.layers[l].offload_bytes for l in range(first, last + 1)]))
    return platform.host_time(total) if total > 0 else 0.0


def policy_counts(policies: Sequence[str]) -> dict[str, int]:
    """How many layers take each policy.

    >>> policy_counts(["keep", "offload", "keep"])
    {'keep': 2, 'recompute': 0, 'offload': 1}
    """
    return {p: sum(1 for x in policies if x == p) for p in POLICIES}


def describe(policies: Sequence[str]) -> str:
    """A short summary for plan notes and tables: ``keep`` when all keep, else the counts.

    >>> describe(["keep", "recompute", "recompute"])
    'recompute 2, keep 1'
    """
    counts = policy_counts(policies)
    if counts["keep"] == len(policies):
        return "keep"
    return ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n)


@dataclass(frozen=True)
class PolicyTerms:
    """Every layer's memory and time terms under every policy, for planners that choose per layer.

    Index policies as :data:`POLICIES` (0 keep, 1 recompute, 2 offload). A layer's activations,
    head and forward and backward climbs (``fwd``, ``bwd``; ``peak`` their larger) depend on its own policy
    and its predecessor's (storage shared across the boundary is counted once only while the predecessor
    keeps what it saves): ``act[p, q, l]`` with p the policy of layer l-1 and q of layer l; ``tail``,
    ``static`` (with the offloaded copy),
    ``offloaded`` (bytes each way) and ``backward`` (seconds) depend on q only. ``keep`` holds the
    policy-free terms (stash, step, runtime constant). Every entry is read off
    :func:`workbench.model.memory.layer_terms` of an effective chain, so stages assembled from these
    arrays get exactly the memory the model gives the effective chain of their policy vector.
    """

    act: np.ndarray
    head: np.ndarray
    fwd: np.ndarray
    bwd: np.ndarray
    tail: np.ndarray
    static: np.ndarray
    offloaded: np.ndarray
    backward: np.ndarray
    keep: "LayerTerms"

    @property
    def peak(self) -> np.ndarray:
        return np.maximum(self.fwd, self.bwd)


def policy_terms(chain: Chain, platform: Target) -> PolicyTerms:
    """:class:`PolicyTerms` of ``chain`` under ``platform``'s memory set-up (cached on the chain).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 8, 40) for i in range(3)), input_bytes=8)
    >>> pt = policy_terms(ch, Target.of(1, memory_model="paper"))
    >>> pt.act[0, :, 1].tolist(), pt.backward[:, 0].tolist()     # keep / recompute / offload
    ([40.0, 8.0, 0.0], [1.0, 2.0, 1.0])
    """
    from workbench.model.memory import layer_terms, setup_key

    key = setup_key(platform)
    cache = chain.__dict__.setdefault("_policy_terms", {})
    if key in cache:
        return cache[key]
    L = len(chain)
    n = len(POLICIES)
    act, head, fwd, bwd = (np.zeros((n, n, L)) for _ in range(4))
    parity = np.arange(L) % 2
    for p in range(n):
        for q in range(n):
            for odd in (0, 1):    # layers of this parity take q, the others p
                vec = [POLICIES[q] if parity[l] == odd else POLICIES[p] for l in range(L)]
                t = layer_terms(apply_policies(chain, vec), platform)
                sel = parity == odd
                act[p, q, sel], head[p, q, sel] = t.act[sel], t.head[sel]
                fwd[p, q, sel], bwd[p, q, sel] = t.fwd[sel], t.bwd[sel]
    uniform = [apply_policies(chain, p) for p in POLICIES]
    terms = [layer_terms(c, platform) for c in uniform]
    out = PolicyTerms(act, head, fwd, bwd, np.array([t.tail for t in terms]), np.array([t.static for t in terms]),
                      np.array([[l.offload_bytes for l in c.layers] for c in uniform]),
                      np.array([c.backward for c in uniform]), terms[0])
    cache[key] = out
    return out
