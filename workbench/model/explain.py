"""Why a plan looks as it does, in words a new user reads beside its figures: devices left idle, a period the
memory limit sets.

``plan`` prints these lines under the plan's summary and records them in the plan JSON's ``notes``
(:func:`explain`):

* :func:`idle_note`: devices that hold no stage, and why (fewer layers than devices; an optimum that gains
  nothing from them, with the period already the largest layer's time where it is; else the planner's choice);
* :func:`memory_note`: a periodic plan whose period is set by how many mini-batches a stage may hold in flight.
  Stage ``s`` holds each mini-batch from its forward's start to its backward's end (its *round trip*, ``R_s``)
  and holds ``k_s`` at once, so the period is at least ``R_s / k_s``; where that bound is the period and
  ``k_s + 1`` would not fit the device's limit (the memory model, :mod:`workbench.model.memory`), memory sets
  the period. With one mini-batch in flight on every stage the stages run one after the other, as one device
  would: the split then only makes the model fit.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.plan import Plan, Stage
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 10, 4) for i in range(2)))
>>> idle_note(Plan(3.0, (0, 1), (Stage(0, 0, 0, 0.0, 1.0, 1), Stage(1, 1, 1, 1.0, 2.0, 1)), 3), ch)
'idle devices: 1 of 3 (GPU2) hold no stage: the chain has only 2 layers, one a device at most'
"""

from __future__ import annotations

import math

from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.units import format_bytes, format_seconds

__all__ = ["IDLE", "MEMORY", "idle_note", "memory_note", "explain"]

#: the first words of the notes this module writes (``plan`` prints them under the summary)
IDLE, MEMORY = "idle devices:", "memory sets the period:"


def _gpus(devices: list[int]) -> str:
    shown = ", ".join(f"GPU{d}" for d in devices[:8])
    return shown + (f", ... GPU{devices[-1]}" if len(devices) > 8 else "")


def idle_note(plan: Plan, chain: Chain) -> str | None:
    """The devices of a feasible plan that hold no stage, and why; None when every device holds one."""
    if not plan.feasible or not plan.stages:
        return None
    used = {st.device for st in plan.stages}
    idle = [d for d in range(plan.devices) if d not in used]
    if not idle:
        return None
    comp = chain.forward + chain.backward
    head = f"{IDLE} {len(idle)} of {plan.devices} ({_gpus(idle)}) hold no stage: "
    if len(chain) <= len(used):
        return head + f"the chain has only {len(chain)} layers, one a device at most"
    if math.isclose(plan.period, float(comp.max()), rel_tol=1e-6):
        return head + (f"the period is already the largest layer's time ({format_seconds(float(comp.max()))}): "
                       "no plan goes below it, with more stages or not")
    if plan.status == "optimal":
        return head + (f"no plan of this method that uses them is faster (this one is optimal over the plans "
                       f"that may leave devices idle; {plan.method}, {plan.allocation})")
    return head + f"the {plan.method} planner used {len(used)} (status {plan.status}: not proven optimal)"


def _round_trips(plan: Plan, chain: Chain) -> list[float]:
    """Per stage, its round trip: from its forward's start to its backward's end (planned times)."""
    return [st.bwd_start + chain.stage_costs(st.first, st.last).backward - st.fwd_start for st in plan.stages]


def memory_note(plan: Plan, chain: Chain, platform: Target) -> str | None:
    """Why a periodic plan's period is what it is when the memory limit sets it (see the module docstring);
    None when no stage both bounds the period by its round trip and could not hold one more mini-batch."""
    from workbench.model.activations import apply_policies
    from workbench.model.memory import device_memory, layer_terms

    if not plan.feasible or not plan.stages or plan.schedule != "periodic" or not math.isfinite(platform.memory_limit):
        return None
    chain = apply_policies(chain, plan.activations or None)
    terms = layer_terms(chain, platform)
    trips = _round_trips(plan, chain)
    for s, (st, trip) in enumerate(zip(plan.stages, trips)):
        k = max(int(st.in_flight), 1)
        if trip / k < plan.period * (1 - 1e-6):
            continue
        mine = [(o.first, o.last, o.in_flight + (1 if o is st else 0)) for o in plan.stages if o.device == st.device]
        more = device_memory(terms, mine)
        if more <= platform.memory_limit * (1 + 1e-9):
            continue
        now = device_memory(terms, [(o.first, o.last, o.in_flight) for o in plan.stages if o.device == st.device])
        return _memory_words(plan, chain, terms, s, k, trip, (now, more), platform)
    return None


def _memory_words(plan: Plan, chain: Chain, terms, s: int, k: int, trip: float, need: tuple[float, float],
                  platform: Target) -> str:
    """:func:`memory_note`'s sentence for stage ``s``, which holds ``k`` (its device ``need[0]``) and could not
    hold ``k + 1`` (``need[1]``): what one more costs, and what would let it hold more."""
    from workbench.model.memory import device_memory, stage_activation

    st = plan.stages[s]
    act = stage_activation(terms, st.first, st.last)
    stash = max(need[1] - need[0] - act, 0.0) if platform.setup.weights == "stash" else 0.0
    out = (f"{MEMORY} stage {s} (layers {st.first}-{st.last}, GPU{st.device}) holds {k} mini-batch"
           f"{'es' * (k > 1)} in flight, and {k + 1} would need {format_bytes(need[1])} (limit "
           f"{format_bytes(platform.memory_limit)}; one more costs {format_bytes(act)} of activations"
           + (f" and {format_bytes(stash)} of a stashed weight version" if stash > 0 else "")
           + f"); it holds each from its forward to its backward ({format_seconds(trip)}), so the period is at "
           f"least {format_seconds(trip)} / {k}")
    if all(o.in_flight <= 1 for o in plan.stages) and len(plan.stages) > 1:
        alone = device_memory(terms, [(0, len(chain) - 1, 1)])
        out += (f". With one mini-batch in flight on every stage the stages run one after the other, as one device "
                f"would ({format_seconds(chain.total_compute)} of compute a mini-batch): the split only makes the "
                f"model fit (one device would need {format_bytes(alone)})")
    how = ("--weights single (one weight version: no stashing)" if stash > act else
           "--activations auto (recompute or offload activations)")
    return out + f". More memory per device, or {how}, lets it hold more"


def explain(plan: Plan, chain: Chain, platform: Target) -> Plan:
    """``plan`` with the notes of :func:`idle_note` and :func:`memory_note` that apply added (once)."""
    notes = [n for n in (idle_note(plan, chain), memory_note(plan, chain, platform)) if n and n not in plan.notes]
    return plan.with_(notes=tuple(plan.notes) + tuple(notes)) if notes else plan
