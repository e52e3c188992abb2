"""Views of the memory model (:mod:`workbench.model.memory`, docs/model.md "Memory") over a plan or a group of layers.

:mod:`workbench.model.memory` gives the terms of one layer, one stage and one
device; this module puts them together for what the rest of the workbench
asks about a whole plan: every device's memory (:func:`plan_memory`), the
same figure split term by term (:func:`memory_breakdown`), the note a plan
carries when the profile lacked a column (:func:`estimate_note`), what
torch's pipeline engine holds beyond the model (:func:`torch_engine_extra`),
and the memory columns of one layer standing for several
(:func:`merged_memory_columns`, for coarsened chains).

>>> from workbench.model.chain import Chain, Layer, Platform
>>> from workbench.model.plan import Stage
>>> chain = Chain((Layer("a", 1, 1, 100, 10, 10), Layer("b", 1, 1, 50, 20, 10)), input_bytes=8)
>>> paper = Platform(2, memory_model="paper")
>>> stages = [Stage(0, 0, 0, 0.0, 0.0, 2), Stage(1, 1, 1, 0.0, 0.0, 1)]
>>> plan_memory(chain, paper, stages)              # 2 x 10 + 100 + (2 - 1) x 100; 10 + 50
[220.0, 60.0]
>>> memory_breakdown(chain, paper, stages)[0]
{'weights': 100.0, 'stashed': 100.0, 'activations': 20.0, 'buffers': 0.0, 'transient': 0.0, 'runtime': 0.0}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from workbench.model.memory import device_memory, layer_terms, stage_activation, stage_excess

if TYPE_CHECKING:  # chain.py imports merged_memory_columns from here
    from workbench.model.chain import Chain, Platform

__all__ = ["plan_memory", "memory_breakdown", "estimate_note", "merged_memory_columns", "torch_engine_extra"]

#: the profile's memory columns beyond saved bytes (docs/model.md, "Memory"), as one merged layer carries them
_MEASURED = ("grad_bytes", "max_param_bytes", "saved_input_bytes", "saved_output_bytes",
             "forward_peak_bytes", "backward_peak_bytes")


def plan_memory(chain: Chain, platform: Platform, stages: Sequence) -> list[float]:
    """Memory of every device for stages with ``first``, ``last``, ``device`` and ``in_flight``."""
    t = layer_terms(chain, platform)
    per: list[list[tuple[int, int, int]]] = [[] for _ in range(platform.devices)]
    for s in stages:
        per[s.device].append((s.first, s.last, s.in_flight))
    return [device_memory(t, items) for items in per]


def memory_breakdown(chain: Chain, platform: Platform, stages: Sequence) -> list[dict[str, float]]:
    """Per device, the bytes of each term (they add up to :func:`plan_memory`'s figure).

    Keys: ``parameters``, ``gradients``, ``optimizer``, ``master`` (fp32 copies), ``stashed``,
    ``activations``, ``buffers`` (receive buffers), ``transient`` (the largest excess), ``runtime``; the paper
    model has ``weights`` (phi W), ``stashed`` and ``activations``; ``offloaded`` (the one copy of offloaded
    activations a device holds) when a layer offloads.
    """
    t = layer_terms(chain, platform)
    names = (["weights"] if t.model == "paper" else ["parameters", "gradients", "optimizer", "master"])
    if np.any(t.parts["offloaded"] > 0):
        names.append("offloaded")
    out = [dict.fromkeys(names + ["stashed", "activations", "buffers", "transient", "runtime"], 0.0)
           for _ in range(platform.devices)]
    excess = [0.0] * platform.devices
    for s in stages:
        row = out[s.device]
        for n in names:
            row[n] += float(np.sum(t.parts[n][s.first:s.last + 1]))
        row["stashed"] += (s.in_flight - 1) * float(t.p_stash[s.last + 1] - t.p_stash[s.first])
        row["activations"] += s.in_flight * stage_activation(t, s.first, s.last)
        row["buffers"] += float(t.buf_in[s.first] + t.buf_out[s.last])
        excess[s.device] = max(excess[s.device], stage_excess(t, s.first, s.last))
        row["runtime"] = t.const
    for d, row in enumerate(out):
        row["transient"] = excess[d]
    return out


def estimate_note(chain: Chain, platform: Platform) -> str | None:
    """A sentence naming the estimated profile columns, or None when every term was measured.

    >>> from workbench.model.chain import Chain, Layer, Platform
    >>> estimate_note(Chain((Layer("a", 1, 1),)), Platform(1))[:48]
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
    if si is None or so is None:
        out["saved_bytes"] = float(sum(saved))
        for name in ("saved_input_bytes", "saved_output_bytes", "forward_peak_bytes", "backward_peak_bytes"):
            out[name] = None
    else:
        shared = [si[i] if i > 0 and so[i - 1] > 0 else 0.0 for i in range(len(layers))]
        act = [max(s - h, 0.0) for s, h in zip(saved, shared)]
        out["saved_bytes"] = float(saved[0] + sum(act[1:]))
        out["saved_input_bytes"], out["saved_output_bytes"] = float(si[0]), float(so[-1])
        fp, bp = out["forward_peak_bytes"], out["backward_peak_bytes"]
        if fp is None or bp is None:
            out["forward_peak_bytes"] = out["backward_peak_bytes"] = None
        else:
            inp = [float(chain.input_bytes) if first == 0 else chain.cut(first - 1)]
            inp += [chain.cut(l) for l in range(first, last)]
            first_act = max(saved[0] - (si[0] if first > 0 and (chain.layers[first - 1].saved_output_bytes or 0) > 0
                                        else 0.0), 0.0)
            acts = [first_act] + act[1:]
            peaks = [max(fp[i] + inp[i] - saved[i], bp[i]) for i in range(len(layers))]
            excess = max(peaks[i] - sum(acts[i + 1:]) for i in range(len(layers)))
            out["forward_peak_bytes"], out["backward_peak_bytes"] = 0.0, float(max(excess, 0.0))
    for name in ("grad_bytes",):
        out[name] = None if out[name] is None else float(sum(out[name]))
    if out["max_param_bytes"] is not None:
        out["max_param_bytes"] = float(max(out["max_param_bytes"]))
    return out


def torch_engine_extra(chain: Chain, stages: Sequence, devices: int, micro_batches: int) -> list[float]:
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

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.plan import Stage
    >>> ch = Chain((Layer("a", 1, 1, 0, 10), Layer("b", 1, 1, 0, 3)), input_bytes=4)
    >>> torch_engine_extra(ch, [Stage(0, 0, 0, 0, 0, 2), Stage(1, 1, 1, 0, 0, 1)], 2, 8)
    [154.0, 143.0]
    """
    out = [0.0] * devices
    n = max(int(micro_batches), 1)
    last = len(stages) - 1
    for i, s in enumerate(stages):
        k = int(s.in_flight)
        if i > 0:
            out[s.device] += (2 * n - k - 1) * chain.cut(s.first - 1)
        if i < last:
            out[s.device] += (2 * n - k - 1) * chain.cut(s.last)
        if i == 0:
            out[s.device] += max(n - k, 0) * float(chain.input_bytes)
        if i == last:
            out[s.device] += k * float(chain.layers[s.last].activation_bytes)
    return out
