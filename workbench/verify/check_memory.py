"""The checker's own memory re-derivation (rule 7), written from docs/model.md, "Memory".

:mod:`workbench.model.memory` computes device memory for the planners with prefix
sums, band matrices and cached arrays; this module recomputes it for
:mod:`workbench.verify.check` the slow, literal way -- a loop over every stage's
layers, every term spelled out as docs/model.md states it -- and shares no
code with it, so a check that agrees with a planner is a check.

>>> from workbench.model.chain import Chain, Layer, Platform
>>> chain = Chain(tuple(Layer(f"l{i}", 1, 1, 10, 4) for i in range(2)), input_bytes=4)
>>> memory_by_device(chain, Platform(1, memory_model="paper"), [(0, 1, 0, 3)])   # 3 x 8 saved + 20 + 2 x 20 stashed
[84.0]
"""

from __future__ import annotations

from typing import Sequence

from workbench.model.chain import Chain, Platform

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
    return {
        "in": inp, "out": out, "saved": saved, "weights": weights, "grad": grad,
        "max_param": get("max_param_bytes", weights),
        "saved_input": saved_input,
        "saved_output": get("saved_output_bytes", 0.0),
        "forward_peak": get("forward_peak_bytes", max(saved - saved_input, 0.0) + out),
        "backward_peak": get("backward_peak_bytes", out + inp + grad),
    }


def _paper_device(chain: Chain, platform: Platform, stages: Sequence[tuple[int, int, int]]) -> float:
    total = 0.0
    for first, last, k in stages:
        saved = sum(chain.saved(l) for l in range(first, last + 1))
        weights = sum(chain.layers[l].weight_bytes for l in range(first, last + 1))
        offloaded = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))
        total += k * saved + platform.weight_factor * weights + offloaded
        if platform.weights == "stash":
            total += (k - 1) * weights
    return total


def stage_terms(chain: Chain, platform: Platform, first: int, last: int) -> dict[str, float]:
    """What stage ``first..last`` holds, term by term as docs/model.md states them: ``A`` (per mini-batch in
    flight), ``static`` (parameters, gradients, optimizer state, an offloaded copy, its receive buffers),
    ``stash`` (per extra mini-batch, under weight stashing), ``op_excess`` (how far its forward or backward
    climbs above that) and ``step`` (the optimizer step's temporaries) with ``step_excess`` (the step's climb
    above the resident state of one mini-batch, its activations freed)."""
    if platform.memory_model == "paper":
        saved = sum(chain.saved(l) for l in range(first, last + 1))
        weights = sum(chain.layers[l].weight_bytes for l in range(first, last + 1))
        offloaded = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))
        return {"A": saved, "static": platform.weight_factor * weights + offloaded,
                "stash": weights if platform.weights == "stash" else 0.0, "op_excess": 0.0, "step": 0.0,
                "step_excess": 0.0}
    dtype = str(chain.meta.get("dtype", "") or "")
    precision = platform.precision or ("bf16" if dtype == "bfloat16" else "fp32")
    widen = (4.0 / {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype or "bfloat16", 2)
             if precision == "bf16-mixed" else 1.0)
    opt = platform.optimizer
    last_layer = len(chain) - 1
    cols = [layer_columns(chain, l) for l in range(first, last + 1)]
    acts = []
    for i, c in enumerate(cols):
        prev_saves_output = (first + i > 0 and layer_columns(chain, first + i - 1)["saved_output"] > 0)
        shared = c["saved_input"] if prev_saves_output else 0.0
        acts.append(max(c["saved"] - shared, 0.0))
    head = cols[0]["in"] - cols[0]["saved_input"]
    if first > 0 and layer_columns(chain, first - 1)["saved_output"] > 0:
        head += cols[0]["saved_input"]
    tail = 0.0 if last == last_layer else max(chain.cut(last) - cols[-1]["saved_output"], 0.0)
    static = sum(chain.layers[l].offload_bytes for l in range(first, last + 1))   # one offloaded copy
    for c in cols:
        static += c["weights"] + c["grad"] + _STATES[opt] * widen * c["weights"]
        if precision == "bf16-mixed":
            static += widen * c["weights"] + widen * c["grad"]
    # a receive buffer for the activation arriving at the stage and one for the gradient coming back
    static += (cols[0]["in"] if first > 0 else 0.0) + (chain.cut(last) if last < last_layer else 0.0)
    # the excess of this stage's operations over its resident state: the forward holds its input (unless the
    # previous layer's activations already count it) and climbs by its own peak; its saved bytes are counted
    # among the stage's activations
    op_excess = max(max(c["forward_peak"] + c["in"] - c["saved"], c["backward_peak"]) - sum(acts[i + 1:])
                    for i, c in enumerate(cols))
    if str(chain.meta.get("device", "")).startswith("cuda"):
        step = _FOREACH_TEMPS[opt] * widen * sum(c["weights"] for c in cols)
    else:
        step = _LOOP_TEMPS[opt] * widen * max(c["max_param"] for c in cols)
    grad_in = cols[0]["in"] if first > 0 else 0.0          # the input gradient waits to be sent
    return {"A": sum(acts) + max(head, 0.0) + tail, "static": static,
            "stash": sum(c["weights"] for c in cols) if platform.weights == "stash" else 0.0,
            "op_excess": op_excess, "step": step, "step_excess": step - sum(acts) - tail + grad_in}


def _full_device(chain: Chain, platform: Platform, stages: Sequence[tuple[int, int, int]]) -> float:
    if not stages:
        return 0.0
    resident = 0.0
    worst = 0.0
    for first, last, k in stages:
        t = stage_terms(chain, platform, first, last)
        resident += k * t["A"] + t["static"] + (k - 1) * t["stash"]
        worst = max(worst, t["op_excess"], t["step_excess"])
    return resident + worst + float(chain.meta.get("runtime_bytes", 0.0) or 0.0)


def memory_by_device(chain: Chain, platform: Platform, stages: Sequence[tuple[int, int, int, int]]) -> list[float]:
    """Bytes each device holds, for stages given as ``(first, last, device, in_flight)``."""
    per: list[list[tuple[int, int, int]]] = [[] for _ in range(platform.devices)]
    for first, last, device, k in stages:
        per[device].append((first, last, max(int(k), 1)))
    if platform.memory_model == "paper":
        return [_paper_device(chain, platform, st) for st in per]
    return [_full_device(chain, platform, st) for st in per]
