"""The checker's own memory re-derivation (rule 7), written from docs/model.md, "Memory".

:mod:`workbench.model.memory` computes device memory for the planners with prefix
sums, band matrices and cached arrays; this module recomputes it for
:mod:`workbench.verify.check` the slow, literal way -- a loop over every stage's
layers, every term spelled out as docs/model.md states it -- and shares no
code with it, so a check that agrees with a planner is a check.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> chain = Chain(tuple(Layer(f"l{i}", 1, 1, 10, 4) for i in range(2)), input_bytes=4)
>>> memory_by_device(chain, Target.of(1, memory_model="paper"), [(0, 1, 0, 3)])   # 3 x 8 saved + 20 + 2 x 20 stashed
[84.0]
"""

from __future__ import annotations

import json
from typing import Sequence

from workbench.model.chain import Chain
from workbench.model.target import Target

__all__ = ["memory_by_device", "layer_columns", "stage_terms"]

_STATES = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}       # state tensors per parameter
_LOOP_TEMPS = {"none": 0, "sgd": 0, "momentum": 0, "adam": 2, "adamw": 2}   # per largest parameter
_FOREACH_TEMPS = {"none": 0, "sgd": 0, "momentum": 0, "adam": 1, "adamw": 1}  # per parameter byte


def layer_columns(chain: Chain, l: int) -> dict[str, float]:
    """Layer l's memory columns, each as measured or, when missing, as docs/model.md estimates it."""
    layer = chain.layers[l]
    saved = chain.saved(l)
    inp = float(chain.input_bytes) if l == 0 else chain.cut(l - 1)
    out = float(layer.activation_bytes)
    weights = float(layer.weight_bytes)

    def get(name: str, estimate: float) -> float:
        value = getattr(layer, name)
        return estimate if value is None else float(value)

    grad = get("grad_bytes", weights)
    saved_input = get("saved_input_bytes", min(saved, inp))
    backward = get("backward_peak_bytes", out + inp + grad)
    fresh_estimate = backward + grad if layer.backward_peak_bytes is not None else backward
    return {
        "in": inp, "out": out, "saved": saved, "weights": weights, "grad": grad,
        "max_param": get("max_param_bytes", weights),
        "saved_input": saved_input,
        "saved_output": get("saved_output_bytes", 0.0),
        "forward_peak": get("forward_peak_bytes", max(saved - saved_input, 0.0) + out),
        "backward_peak": backward,
        "backward_fresh_peak": get("backward_fresh_peak_bytes", fresh_estimate),
    }


def _ties(chain: Chain) -> list[tuple[int, list[int], float]]:
    """(owner, sharers, bytes) of every shared parameter the profile lists (docs/model.md, "Tied parameters")."""
    text = chain.meta.get("tied") if chain.meta else None
    if not text:
        return []
    where = {layer.name: i for i, layer in enumerate(chain.layers)}
    out = []
    for entry in json.loads(text):
        owner = where.get(entry["owner"])
        sharers = sorted({where[n] for n in entry["layers"] if n in where and where[n] != owner})
        if owner is not None and sharers and float(entry["bytes"]) > 0:
            out.append((owner, sharers, float(entry["bytes"])))
    return out


def _paper_device(chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int]]) -> float:
    total = 0.0
    for first, last, k in stages:
        saved = sum(chain.saved(l) for l in range(first, last + 1))
        weights = sum(chain.layers[l].weight_bytes for l in range(first, last + 1))
        offloaded = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))
        total += k * saved + platform.setup.weight_factor * weights + offloaded
        if platform.setup.weights == "stash":
            total += (k - 1) * weights
    return total


class _SetUp:
    """The training set-up as docs/model.md states it: precision, its fp32 widening, states, the loop."""

    def __init__(self, chain: Chain, platform: Target) -> None:
        dtype = str(chain.meta.get("dtype", "") or "")
        self.precision = platform.setup.precision or ("bf16" if dtype == "bfloat16" else "fp32")
        self.mixed = self.precision == "bf16-mixed"
        wide = 4.0 / {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype or "bfloat16", 2)
        self.widen = wide if self.mixed else 1.0
        self.foreach = str(chain.meta.get("device", "")).startswith("cuda")
        self.opt = platform.setup.optimizer
        self.states = _STATES[self.opt]
        self.zeros = platform.setup.zero_grad == "zeros"
        self.stash = platform.setup.weights == "stash"      # the PipeDream engine; single: torch's
        # data parallelism (docs/model.md, "Layouts"): D ranks, ZeRO level, FSDP2 layer by layer or in a pipeline
        self.dp, self.zero = platform.layout.dp, platform.layout.zero
        self.fsdp = self.dp > 1 and self.zero >= 2
        self.pipelined = platform.devices > 1
        self.per_layer = self.fsdp and not self.pipelined
        self.shard = self.widen if (self.mixed and self.fsdp) else 1.0   # an fp32 shard is the master

    def own_static(self, c: dict[str, float]) -> float:
        """A layer's parameters, optimizer state, fp32 masters and (zeros) resident gradients, as its rank of the
        data-parallel group keeps them (DDP's buckets; ZeRO-1's shard of the state; FSDP's shards)."""
        w, g, D = c["weights"], c["grad"], self.dp
        if self.fsdp:
            out = self.shard * w / D + (w if self.pipelined else 0.0) + self.states * self.widen * w / D
            return out + (self.fsdp_made(c) if self.zeros else 0.0)
        state_share = 1.0 / D if self.zero == 1 else 1.0
        out = w + self.states * self.widen * w * state_share
        if self.mixed:
            out += self.widen * w * state_share
        if self.zeros:
            out += g + (self.widen * g * state_share if self.mixed else 0.0)
        return out + (g if D > 1 else 0.0)           # DDP's gradient buckets

    def fsdp_made(self, c: dict[str, float]) -> float:
        """FSDP: the gradient a layer's backward leaves until the step, a shard (and the unsharded one a pipeline
        accumulates)."""
        return self.shard * c["grad"] / self.dp + (c["grad"] if self.pipelined else 0.0)

    def gathered(self, chain: Chain, l: int, backward: bool) -> float:
        """FSDP2 layer by layer: the unsharded parameters a forward (the next layer's, prefetched, and under zero 3
        its own) or a zero-3 backward (its own, and the previous layer's, prefetched) holds on top of its climb."""
        if not self.per_layer:
            return 0.0
        own = chain.layers[l].weight_bytes
        if backward:
            return own + (chain.layers[l - 1].weight_bytes if l > 0 else 0.0) if self.zero == 3 else 0.0
        after = chain.layers[l + 1].weight_bytes if l + 1 < len(chain) else 0.0
        return after + (own if self.zero == 3 else 0.0)

    def reduce_scatter(self, chain: Chain, l: int, c: dict[str, float]) -> float:
        """FSDP2 layer by layer, once layer l's backward has run: its gradients, their copy in the reduce-scatter
        input, the scattered shard, the input gradient waiting, and under zero 3 the previous layer's prefetch."""
        if not self.per_layer:
            return 0.0
        prefetch = chain.layers[l - 1].weight_bytes if (l > 0 and self.zero == 3) else 0.0
        return 2 * c["grad"] + self.shard * c["grad"] / self.dp + c["in"] + prefetch

    def copy_terms(self, nbytes: float) -> tuple[float, float, float]:
        """A stage's copy of a tied parameter: (resident, per extra in-flight mini-batch, gradient at its step)."""
        if self.stash:   # the PipeDream engine: the copy and its stashed versions; its gradient goes to the owner
            return nbytes, nbytes, nbytes
        master = self.widen * nbytes if self.mixed else 0.0
        resident = nbytes + self.states * self.widen * nbytes + master
        if self.zeros:
            return resident + nbytes + master, 0.0, 0.0
        return resident, 0.0, nbytes + master


def _tied_terms(su: _SetUp, ties, first: int, last: int) -> dict:
    """Stage ``first..last``'s tied parameters (docs/model.md, "Tied parameters"): the resident bytes (``static``,
    one entry each) and per extra mini-batch (``stash``) of its copies (a sharer without its owner), the copies'
    gradients its step finds (``copy_grad``), the sharers' gradients the owner receives (``received``, gone by
    its step), the bytes of copies it steps itself (``copies_stepped``) and per layer the bytes it shares
    without owning (``shared_at``)."""
    inside = set(range(first, last + 1))
    out = {"static": [], "stash": [], "copy_grad": 0.0, "received": 0.0, "copies_stepped": [],
           "shared_at": [0.0] * (last - first + 1)}
    for owner, sharers, nbytes in ties:
        for s in sharers:
            if s in inside:
                out["shared_at"][s - first] += nbytes
        if any(s in inside for s in sharers) and owner not in inside:          # a copy
            resident, per_k, grad = su.copy_terms(nbytes)
            out["static"].append(resident)
            out["stash"].append(per_k)
            out["copy_grad"] += grad
            if not su.stash:
                out["copies_stepped"].append(nbytes)
        if owner in inside and su.stash and not all(s in inside for s in sharers):
            # the owner posts a receive for a sharer's gradient when its forward of a mini-batch starts: one
            # buffer per mini-batch in flight, the current one added to its own gradient before its step
            out["static"].append(nbytes)
            out["stash"].append(nbytes)
            out["received"] += nbytes
    return out


def _paper_stage_terms(chain: Chain, platform: Target, first: int, last: int) -> dict[str, float]:
    """:func:`stage_terms` under the paper's memory model: activations, weights times phi, nothing climbs."""
    saved = sum(chain.saved(l) for l in range(first, last + 1))
    weights = sum(chain.layers[l].weight_bytes for l in range(first, last + 1))
    offloaded = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))
    return {"A": saved, "static": platform.setup.weight_factor * weights + offloaded,
            "stash": weights if platform.setup.weights == "stash" else 0.0, "op_excess": 0.0, "step": 0.0,
            "step_excess": 0.0}


def _saved_activations(chain: Chain, su: _SetUp, cols: list[dict[str, float]], first: int) -> list[float]:
    """Each layer's bytes saved for its backward (an input the previous layer saves as its output once), with
    FSDP2 zero 2's parameters kept gathered until the backward."""
    acts = []
    for i, c in enumerate(cols):
        prev_saves_output = (first + i > 0 and layer_columns(chain, first + i - 1)["saved_output"] > 0)
        shared = c["saved_input"] if prev_saves_output else 0.0
        unsharded = c["weights"] if (su.per_layer and su.zero == 2) else 0.0   # zero 2: gathered to the backward
        acts.append(max(c["saved"] - shared, 0.0) + unsharded)
    return acts


def _op_excess(chain: Chain, su: _SetUp, cols: list[dict[str, float]], acts: list[float], shared_at: list[float],
               first: int) -> float:
    """How far the stage's forwards and backwards climb above its resident state (one mini-batch in flight)."""
    made = []                                # gradients each layer's backward makes that stay to the step
    for i, c in enumerate(cols):
        if not su.zeros and su.fsdp:
            made.append(su.fsdp_made(c) + shared_at[i])
        elif not su.zeros:
            made.append(c["grad"] + shared_at[i])
        elif su.stash:
            made.append(shared_at[i])
        else:
            made.append(0.0)
    worst = 0.0
    offs = [chain.layers[l].offload_bytes for l in range(first, first + len(cols))]
    for i, c in enumerate(cols):
        # the forward holds its input (unless the previous layer's activations already count it) and
        # climbs by its own peak; its saved bytes are counted among the stage's activations; the later
        # layers hold no activations (nor offloaded copy) of this mini-batch yet, or any more
        later = sum(acts[i + 1:]) + sum(offs[i + 1:])
        l = first + i
        worst = max(worst, c["forward_peak"] + c["in"] - c["saved"] + su.gathered(chain, l, False) - later)
        if not su.zeros:
            climb = c["backward_fresh_peak"]
        elif su.stash and shared_at[i] > 0:
            climb = min(c["backward_fresh_peak"], c["backward_peak"] + shared_at[i])
        else:
            climb = c["backward_peak"]
        climb = max(climb + su.gathered(chain, l, True), su.reduce_scatter(chain, l, c))
        worst = max(worst, climb + sum(made[i + 1:]) - later)
    return worst


def _step_temporaries(su: _SetUp, cols: list[dict[str, float]], ties: list[tuple[int, list[int], float]], first: int,
                      copies_stepped: list[float]) -> float:
    """The optimizer step's temporaries: foreach's over the rank's (shard of the) parameters, the loop's over the
    largest parameter (a shard of it under FSDP)."""
    if su.foreach:        # a rank steps its shard of the parameters from ZeRO-1 on
        step = _FOREACH_TEMPS[su.opt] * su.widen * (sum(c["weights"] for c in cols) / (su.dp if su.zero else 1)
                                                    + sum(copies_stepped))
    else:                 # the loop: ZeroRedundancyOptimizer steps whole parameters, FSDP shards of each
        largest = [c["max_param"] for c in cols]
        if not su.stash:
            largest = [max([m] + [b for o, ss, b in ties if first + i in ss]) for i, m in enumerate(largest)]
        step = _LOOP_TEMPS[su.opt] * su.widen * max(largest) / (su.dp if su.fsdp else 1)
    return step


def stage_terms(chain: Chain, platform: Target, first: int, last: int) -> dict[str, float]:
    """What stage ``first..last`` holds, term by term as docs/model.md states them: ``A`` (per mini-batch in
    flight), ``static`` (parameters, resident gradients, optimizer state, an offloaded copy, its receive buffers,
    tied copies), ``stash`` (per extra mini-batch, under weight stashing: stashed versions, the owner's receive
    buffers for tied gradients), ``op_excess`` (how far its forward or
    backward climbs above that) and ``step`` (the optimizer step's temporaries) with ``step_excess`` (the
    step's climb above the resident state of one mini-batch, its activations freed, with the gradients its
    backward made)."""
    if platform.setup.memory_model == "paper":
        return _paper_stage_terms(chain, platform, first, last)
    su = _SetUp(chain, platform)
    ties = _ties(chain)
    last_layer = len(chain) - 1
    cols = [layer_columns(chain, l) for l in range(first, last + 1)]
    acts = _saved_activations(chain, su, cols, first)
    head = cols[0]["in"] - cols[0]["saved_input"]
    if first > 0 and layer_columns(chain, first - 1)["saved_output"] > 0:
        head += cols[0]["saved_input"]
    tail = 0.0 if last == last_layer else max(chain.cut(last) - cols[-1]["saved_output"], 0.0)
    A = sum(acts) + max(head, 0.0) + tail
    static = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))   # one offloaded copy
    static += sum(su.own_static(c) for c in cols)
    stash = sum(c["weights"] for c in cols) if su.stash else 0.0
    # a receive buffer for the activation arriving at the stage and one for the gradient coming back
    buffers = (cols[0]["in"] if first > 0 else 0.0) + (chain.cut(last) if last < last_layer else 0.0)
    tied = _tied_terms(su, ties, first, last)
    for x in tied["static"]:              # added one by one, in the order of the ties
        static += x
    for x in tied["stash"]:
        stash += x
    static += buffers
    copy_grad, received, copies_stepped, shared_at = (tied["copy_grad"], tied["received"], tied["copies_stepped"],
                                                      tied["shared_at"])
    worst = _op_excess(chain, su, cols, acts, shared_at, first)
    step = _step_temporaries(su, cols, ties, first, copies_stepped)
    found = copy_grad
    if not su.zeros and su.fsdp:
        found += sum(su.fsdp_made(c) for c in cols)
    elif not su.zeros:
        masters = su.widen / (su.dp if su.zero == 1 else 1) if su.mixed else 0.0
        found += sum(c["grad"] for c in cols) * (1.0 + masters)
    grad_in = cols[0]["in"] if first > 0 else 0.0          # the input gradient waits to be sent
    offloaded = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))   # back on the host by then
    return {"A": A, "static": static, "stash": stash, "op_excess": worst, "step": step,
            "step_excess": step + found - received - offloaded - sum(acts) - tail + grad_in}


def _full_device(chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int]]) -> float:
    if not stages:
        return 0.0
    resident = 0.0
    worst = 0.0
    for first, last, k in stages:
        t = stage_terms(chain, platform, first, last)
        resident += k * t["A"] + t["static"] + (k - 1) * t["stash"]
        worst = max(worst, t["op_excess"], t["step_excess"])
    return resident + worst + float(chain.meta.get("runtime_bytes", 0.0) or 0.0)


def memory_by_device(chain: Chain, platform: Target, stages: Sequence[tuple[int, int, int, int]]) -> list[float]:
    """Bytes each device holds, for stages given as ``(first, last, device, in_flight)``."""
    per: list[list[tuple[int, int, int]]] = [[] for _ in range(platform.devices)]
    for first, last, device, k in stages:
        per[device].append((first, last, max(int(k), 1)))
    if platform.setup.memory_model == "paper":
        return [_paper_device(chain, platform, st) for st in per]
    return [_full_device(chain, platform, st) for st in per]
