"""Views of the memory model (:mod:`workbench.model.memory`, docs/model.md "Memory") over a plan or a group of layers.

:mod:`workbench.model.memory` gives the terms of one layer, one stage and one
device; this module puts them together for what the rest of the workbench
asks about a whole plan: every device's memory (:func:`plan_memory`), the
same figure split term by term (:func:`memory_breakdown`), the note a plan
carries when the profile lacked a column (:func:`estimate_note`), what
torch's pipeline engine holds beyond the model (:func:`torch_engine_extra`),
and the memory columns of one layer standing for several
(:func:`merged_memory_columns`, for coarsened chains).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.plan import Stage
>>> chain = Chain((Layer("a", 1, 1, 100, 10, 10), Layer("b", 1, 1, 50, 20, 10)), input_bytes=8)
>>> paper = Target.of(2, memory_model="paper")
>>> stages = [Stage(0, 0, 0, 0.0, 0.0, 2), Stage(1, 1, 1, 0.0, 0.0, 1)]
>>> plan_memory(chain, paper, stages)              # 2 x 10 + 100 + (2 - 1) x 100; 10 + 50
[220.0, 60.0]
>>> memory_breakdown(chain, paper, stages)[0]
{'weights': 100.0, 'stashed': 100.0, 'activations': 20.0, 'buffers': 0.0, 'transient': 0.0, 'runtime': 0.0}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from workbench.model.memory import device_memory, layer_terms, stage_activation, stage_excess, stage_memory

if TYPE_CHECKING:  # chain.py imports merged_memory_columns from here
    from workbench.model.chain import Chain
    from workbench.model.target import Target

__all__ = ["plan_memory", "memory_breakdown", "estimate_note", "merged_memory_columns", "torch_engine_extra",
           "accumulation_extra", "torch_engine_memory"]

#: the profile's memory columns beyond saved bytes (docs/model.md, "Memory"), as one merged layer carries them
_MEASURED = ("grad_bytes", "max_param_bytes", "saved_input_bytes", "saved_output_bytes",
             "forward_peak_bytes", "backward_peak_bytes", "backward_fresh_peak_bytes")


def plan_memory(chain: Chain, platform: Target, stages: Sequence) -> list[float]:
    """Memory of every device for stages with ``first``, ``last``, ``device`` and ``in_flight``."""
    t = layer_terms(chain, platform)
    per: list[list[tuple[int, int, int]]] = [[] for _ in range(platform.devices)]
    for s in stages:
        per[s.device].append((s.first, s.last, s.in_flight))
    return [device_memory(t, items) for items in per]


def memory_breakdown(chain: Chain, platform: Target, stages: Sequence) -> list[dict[str, float]]:
    """Per device, the bytes of each term (they add up to :func:`plan_memory`'s figure).

    Keys: ``parameters``, ``gradients`` (resident: ``zero_grad zeros``; under ``none`` a stage's gradients
    live from its backward to its step, in ``transient``), ``optimizer``, ``master`` (fp32 copies),
    ``stashed``, ``activations``, ``buffers`` (receive buffers), ``transient`` (the largest excess),
    ``runtime``; the paper model has ``weights`` (phi W), ``stashed`` and ``activations``; ``offloaded`` (the
    one copy of offloaded activations a device holds) when a layer offloads; ``tied`` (copies of shared
    parameters, with their gradients and optimizer state as the engine keeps them, and the owner's receive
    buffers for a sharer's gradient) when the chain has shared parameters.
    """
    from workbench.model.memory import stage_ties

    t = layer_terms(chain, platform)
    names = (["weights"] if t.model == "paper" else ["parameters", "gradients", "optimizer", "master"])
    if np.any(t.parts["offloaded"] > 0):
        names.append("offloaded")
    tied = ["tied"] if t.ties else []
    base = ["stashed", "activations", "buffers", "transient", "runtime"]
    # a boundary term reported apart (memory_terms.BOUNDARY_TERMS: its part), where it holds anything
    apart = [x.part for x, arr in t.boundary if x.part not in base and np.any(arr > 0)]
    out = [dict.fromkeys(names + tied + list(dict.fromkeys(apart)) + base, 0.0) for _ in range(platform.devices)]
    excess = [0.0] * platform.devices
    for s in stages:
        row = out[s.device]
        for n in names:
            row[n] += float(np.sum(t.parts[n][s.first:s.last + 1]))
        ties = stage_ties(t, s.first, s.last)
        if tied:
            row["tied"] += ties.static + (s.in_flight - 1) * ties.recv_k
        row["stashed"] += (s.in_flight - 1) * (float(t.p_stash[s.last + 1] - t.p_stash[s.first]) + ties.stash
                                               - ties.recv_k)
        row["activations"] += s.in_flight * stage_activation(t, s.first, s.last)
        _boundary_parts(row, t.boundary, s.first, s.last, s.in_flight)
        excess[s.device] = max(excess[s.device], stage_excess(t, s.first, s.last))
        row["runtime"] = t.const
    for d, row in enumerate(out):
        row["transient"] = excess[d]
    return out


def _boundary_parts(row: dict[str, float], boundary: tuple, first: int, last: int, k: int) -> None:
    """Add stage ``first..last``'s boundary terms to ``row`` by their part (``activations``, which
    :func:`stage_activation` already counts per mini-batch, ``buffers``, or a part of their own)."""
    for term, arr in boundary:
        held = float(arr[first if term.side == "start" else last])
        if not held:
            continue
        if not term.per_in_flight:
            row[term.part] += held
        elif term.part != "activations":
            row["activations"] -= k * held
            row[term.part] += k * held


def estimate_note(chain: Chain, platform: Target) -> str | None:
    """A sentence naming the estimated profile columns, or None when every term was measured.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> estimate_note(Chain((Layer("a", 1, 1),)), Target.of(1))[:48]
    'memory estimated: the profile has no grad_bytes,'
    """
    t = layer_terms(chain, platform)
    if not t.estimated:
        return None
    return (f"memory estimated: the profile has no {', '.join(t.estimated)} (re-profile with the workbench's "
            f"profiler to measure them; estimates in docs/model.md)")


def merged_memory_columns(chain: Chain, first: int, last: int) -> dict[str, float | None]:
    """``saved_bytes`` and the memory columns of one layer standing for layers ``first..last``.

    Chosen so that every stage of merged layers gets, from :func:`layer_terms`,
    the activations, head, tail, static, step and excess of the same stage of
    the original layers: saved bytes add up less the storage shared inside the
    group; the group's input (output) columns are its first (last) layer's; its
    excess over the group (:func:`stage_excess`'s running term) becomes its
    ``backward_peak_bytes``, with a ``forward_peak_bytes`` of 0. Columns a layer
    of the group lacks stay unmeasured (None).

    >>> from workbench.model.chain import Chain, Layer
    >>> ls = [Layer(f"l{i}", 1, 1, 2, 4, 4, 2, 2, 4, 4, 8, 12) for i in range(3)]
    >>> merged_memory_columns(Chain(tuple(ls), input_bytes=4), 0, 2)["saved_bytes"]   # 3 x 4 - 2 x 4 shared
    4.0
    """
    layers = chain.layers[first:last + 1]
    saved = [chain.saved(l) for l in range(first, last + 1)]
    out: dict[str, float | None] = {}
    for name in _MEASURED:
        vals = [getattr(l, name) for l in layers]
        out[name] = None if any(v is None for v in vals) else vals
    si, so = out["saved_input_bytes"], out["saved_output_bytes"]
    peaks = ("forward_peak_bytes", "backward_peak_bytes", "backward_fresh_peak_bytes")
    if si is None or so is None:
        out["saved_bytes"] = float(sum(saved))
        for name in ("saved_input_bytes", "saved_output_bytes") + peaks:
            out[name] = None
    else:
        shared = [si[i] if i > 0 and so[i - 1] > 0 else 0.0 for i in range(len(layers))]
        act = [max(s - h, 0.0) for s, h in zip(saved, shared)]
        out["saved_bytes"] = float(saved[0] + sum(act[1:]))
        out["saved_input_bytes"], out["saved_output_bytes"] = float(si[0]), float(so[-1])
        first_act = max(saved[0] - (si[0] if first > 0 and (chain.layers[first - 1].saved_output_bytes or 0) > 0
                                    else 0.0), 0.0)
        _merged_peaks(chain, first, last, out, saved, [first_act] + act[1:])
    for name in ("grad_bytes",):
        out[name] = None if out[name] is None else float(sum(out[name]))
    if out["max_param_bytes"] is not None:
        out["max_param_bytes"] = float(max(out["max_param_bytes"]))
    return out


def _merged_peaks(chain: Chain, first: int, last: int, out: dict, saved: list[float], acts: list[float]) -> None:
    """The merged layer's peaks (in ``out``): its forward 0, its backward the group's excess over it, zeroed
    gradients (``backward_peak_bytes``) or fresh ones, the group's later gradients made as it goes
    (``backward_fresh_peak_bytes``). A column a layer lacks leaves the merged one unmeasured."""
    fp, bp, bf = (out[n] for n in ("forward_peak_bytes", "backward_peak_bytes", "backward_fresh_peak_bytes"))
    if fp is None or bp is None:
        out["forward_peak_bytes"] = out["backward_peak_bytes"] = out["backward_fresh_peak_bytes"] = None
        return
    n = len(saved)
    inp = [float(chain.input_bytes) if first == 0 else chain.cut(first - 1)]
    inp += [chain.cut(l) for l in range(first, last)]
    grads = [float(g or 0.0) for g in (out["grad_bytes"] or [0.0] * n)]
    fwd = [fp[i] + inp[i] - saved[i] for i in range(n)]
    zeroed = max(max(fwd[i], bp[i]) - sum(acts[i + 1:]) for i in range(n))
    out["forward_peak_bytes"], out["backward_peak_bytes"] = 0.0, float(max(zeroed, 0.0))
    if bf is not None:
        fresh = max(max(fwd[i] - sum(acts[i + 1:]), bf[i] + sum(grads[i + 1:]) - sum(acts[i + 1:])) for i in range(n))
        out["backward_fresh_peak_bytes"] = float(max(fresh, 0.0))


def torch_engine_extra(chain: Chain, stages: Sequence, devices: int, micro_batches: int,
                       sends_kept: int | None = None) -> list[float]:
    """Per device, what torch's pipeline engine holds beyond the plan's memory when it runs
    ``micro_batches`` (N) micro-batches in one step (docs/model.md, "Runtime").

    torch's ``PipelineStage`` preallocates a receive buffer per micro-batch for the stage's input and
    one for the gradient of its output, and ``_PipelineScheduleRuntime`` keeps every send (outputs
    forward, input gradients back) until the end of the step; the last stage caches its output
    (before the loss) until the backward; stage 0 takes the step's whole input. Against the model
    (which counts, per stage with k mini-batches in flight, k inputs and outputs, one receive buffer
    each way, and the input gradient only while the backward runs), a stage ``i..j`` holds about
    ``(2N - k - 1) in_i`` more (i > 0), ``(2N - k - 1) out_j`` more (j before the last layer),
    ``(N - k)`` more inputs of the chain (stage 0) and ``k`` outputs of its last layer (the last
    stage). An upper bound near the end of a step, when every send is still held.

    ``sends_kept``: the sends a stage keeps each way when fewer than every micro-batch's: torch's
    ``Schedule1F1B`` waits for each send and keeps only the last (its input gradient until the next
    backward; its outputs are in flight anyway), so a stage holds ``N + 1`` inputs (its N receive
    buffers, the in-flight ones among them, and one gradient sent back) and ``N + k`` outputs:
    ``(N - k) in_i`` and ``(N - 1) out_j`` more than the model (the general form: ``N + s - k - 1``
    inputs, ``N + max(s, k) - k - 1`` outputs for s sends kept).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.plan import Stage
    >>> ch = Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3)), input_bytes=4)
    >>> torch_engine_extra(ch, [Stage(0, 0, 0, 0, 0, 2), Stage(1, 1, 1, 0, 0, 1)], 2, 8)
    [154.0, 143.0]
    >>> torch_engine_extra(ch, [Stage(0, 0, 0, 0, 0, 2), Stage(1, 1, 1, 0, 0, 1)], 2, 8, sends_kept=1)
    [94.0, 73.0]
    """
    out = [0.0] * devices
    n = max(int(micro_batches), 1)
    sends = n if sends_kept is None else min(int(sends_kept), n)
    last = len(stages) - 1
    for i, s in enumerate(stages):
        k = int(s.in_flight)
        if i > 0:
            out[s.device] += max(n + sends - k - 1, 0) * chain.cut(s.first - 1)
        if i < last:
            out[s.device] += max(n + max(sends, k) - k - 1, 0) * chain.cut(s.last)
        if i == 0:
            out[s.device] += max(n - k, 0) * float(chain.input_bytes)
        if i == last:
            out[s.device] += k * float(chain.layers[s.last].activation_bytes)
    return out


def torch_engine_memory(chain: Chain, platform: Target, stages: Sequence, micro_batches: int) -> list[float]:
    """Per device, the peak torch's engine reaches running a *periodic* plan as one step of ``micro_batches``
    (N) micro-batches (docs/model.md, "Runtime"): the larger of

    * its operations in the steady state: every stage's resident bytes with k in flight and its gradients
      resident (they accumulate from the stage's first backward on: the ``zeros`` figure, whatever the
      loop), the largest forward or backward excess, and what the engine holds beyond the model
      (:func:`torch_engine_extra`);
    * the optimizer step after the flush: parameters, gradients, optimizer state, the receive buffers torch
      keeps (N per micro-batch each way) and stage 0's whole input (no activations: nothing in flight,
      nothing offloaded), and the largest step's temporaries.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.plan import Stage
    >>> ch = Chain((Layer("a", 1, 1, 100, 10, 10), Layer("b", 1, 1, 50, 3)), input_bytes=4)
    >>> torch_engine_memory(ch, Target.of(2, optimizer="adam", weights="single"),
    ...                     [Stage(0, 0, 0, 0, 0, 2), Stage(1, 1, 1, 0, 0, 1)], 8)   # busy; busy (steps: 712, 380)
    [718.0, 426.0]
    """
    from workbench.model.memory import stage_created, stage_op_excess, stage_step, stage_ties

    t = layer_terms(chain, platform.with_(zero_grad="zeros")) if platform.setup.memory_model == "full" else \
        layer_terms(chain, platform)
    extra = torch_engine_extra(chain, stages, platform.devices, micro_batches)
    n = max(int(micro_batches), 1)
    last = len(stages) - 1
    ops = [0.0] * platform.devices
    at_step = [0.0] * platform.devices
    op_excess: list[list[float]] = [[] for _ in range(platform.devices)]
    step_excess: list[list[float]] = [[] for _ in range(platform.devices)]
    for i, st in enumerate(stages):
        a, b, d = st.first, st.last, st.device
        ops[d] += stage_memory(t, a, b, st.in_flight)
        op_excess[d].append(stage_op_excess(t, a, b))
        held = stage_memory(t, a, b, 1) - stage_activation(t, a, b)       # static, its two buffers, ties ...
        held -= float(np.sum(t.parts["offloaded"][a:b + 1]))               # ... no offloaded copy at the step
        held += (n - 1) * ((chain.cut(a - 1) if i > 0 else 0.0) + (chain.cut(b) if i < last else 0.0))
        held += n * float(chain.input_bytes) if i == 0 else 0.0
        at_step[d] += held
        step_excess[d].append(stage_step(t, a, b) + stage_created(t, a, b) - stage_ties(t, a, b).recv)
    out = []
    for d in range(platform.devices):
        if not op_excess[d]:
            out.append(0.0)
            continue
        busy = ops[d] + extra[d] + max(0.0, max(op_excess[d])) + t.const
        stepping = at_step[d] + max(0.0, max(step_excess[d])) + t.const
        out.append(max(busy, stepping))
    return out


def accumulation_extra(chain: Chain, platform: Target, stages: Sequence) -> list[float]:
    """Per device, what a periodic plan's memory gains when its mini-batches are one step's micro-batches
    (torch's engine runs a periodic plan as one flush: each stage's gradients accumulate from its first
    backward to the step after the flush) instead of one step each (the plan's model): under
    ``zero_grad none`` the gradients are then resident, as under ``zeros``; 0 under ``zeros``.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> from workbench.model.plan import Stage
    >>> ch = Chain((Layer("a", 1, 1, 10, 4, 4),))
    >>> accumulation_extra(ch, Target.of(1, optimizer="sgd"), [Stage(0, 0, 0, 0.0, 0.0, 1)])
    [10.0]
    """
    if platform.setup.memory_model != "full" or platform.setup.zero_grad == "zeros":
        return [0.0] * platform.devices
    accumulating = plan_memory(chain, platform.with_(zero_grad="zeros"), stages)
    return [max(a - m, 0.0) for a, m in zip(accumulating, plan_memory(chain, platform, stages))]
