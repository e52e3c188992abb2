"""The checker's rules for flushed schedules (GPipe, 1F1B, torch's multi-stage schedules), re-derived on its own.

A flushed plan records a period (the makespan of one flush over its
micro-batches) and a memory per device (the peak over the flush); nothing
recorded is trusted. This module replays the schedule the slow, literal way
from docs/model.md ("Flushed schedules", "Torch's schedules") and shares no
code with the simulator (:mod:`workbench.schedules.simulate`,
:mod:`workbench.schedules.simulate_orders`):

* **layout** (rule 1): a torch schedule's S stages are P x V, V the
  schedule's stages per device, stage s on the device its layout names
  (looped: s mod P; V: s, then 2P - 1 - s);
* **order** (rule 5): each device runs its operations in the schedule's order
  (GPipe and 1F1B as docs/model.md states them, written again here; torch's schedules as torch's
  class produces them, :func:`workbench.schedules.torch_orders.torch_order`); the order
  holds every operation once and does not deadlock;
* **period** (rule 0): the replayed makespan over the micro-batches equals the
  recorded period (relative tolerance ``REL_TOL``);
* **memory** (rule 7): per device, the peak of what its stages hold over the
  replay (:func:`workbench.verify.check_memory.stage_terms`: activations from a
  forward's start to the end of its backward, pending weight gradients from an
  ``I`` to its ``W``, an operation's excess while it runs, the gradients resident
  or, under ``zero_grad none``, from the end of the stage's first ``B`` or ``W`` (which
  runs with the excess of a backward that writes them fresh), the optimizer
  step after the flush) is at most the limit and equals the recorded memory.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.plan import Plan, Stage
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 1, 1) for i in range(2)), input_bytes=1)
>>> plan = Plan(4.5, (0, 1), (Stage(0, 0, 0, 0, 0, 2), Stage(1, 1, 1, 0, 0, 1)), 2, memory=(2.0, 1.0),
...             schedule="1f1b", micro_batches=2)
>>> flushed_problems(plan, ch, Target.of(2, memory_model="paper"))     # (m + S - 1)(F + B) / m = 9 / 2
[]
>>> [v["message"] for v in flushed_problems(plan.with_(period=3.0), ch, Target.of(2, memory_model="paper"))]
['the plan records a period of 3.000 s; its 1f1b schedule of 2 micro-batches takes 9.000 s, 4.500 s per micro-batch']
"""

from __future__ import annotations

import math
from typing import Any

from workbench.methods import method
from workbench.model.chain import Chain
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.model.tolerances import REL_TOL
from workbench.model.units import format_bytes, format_seconds
from workbench.schedules.ops import Op
from workbench.schedules.registry import schedule_of
from workbench.schedules.torch_orders import torch_order
from workbench.verify.check_memory import stage_terms

__all__ = ["flushed_problems", "flushed_orders"]


def _stage_order(warmup: str, S: int, s: int, m: int) -> list[Op]:
    """Stage s's operations as docs/model.md states them (written again here, on purpose: the checker shares
    no code with the orders it judges): GPipe (``warmup`` ``all``) all forwards, then all backwards; 1F1B
    (``downstream``) min(m, S-1-s) forwards, then one forward and one backward, then the rest."""
    if warmup == "all":
        return [Op(s, "F", i) for i in range(m)] + [Op(s, "B", i) for i in range(m)]
    if warmup != "downstream":
        raise ValueError(f"the checker knows no order with warm-up {warmup!r}")
    warm = min(m, S - 1 - s)
    acts = [Op(s, "F", i) for i in range(warm)]
    for i in range(m - warm):
        acts += [Op(s, "F", warm + i), Op(s, "B", i)]
    return acts + [Op(s, "B", i) for i in range(m - warm, m)]


def flushed_orders(plan: Plan) -> dict[int, list[Op]]:
    """Per device, the operations of one flush in the order the plan's schedule runs them: torch's class's
    order for torch's schedules, else each stage's in the order its method's ``warmup`` names."""
    m, S = int(plan.micro_batches or 0), len(plan.stages)
    if schedule_of(plan.schedule).from_torch:
        return {d: list(a) for d, a in torch_order(plan.schedule, plan.devices, S // plan.devices, m).items()}
    warmup = method(plan.schedule).warmup
    out: dict[int, list[Op]] = {}
    for s, st in enumerate(plan.stages):
        out.setdefault(st.device, []).extend(_stage_order(warmup, S, s, m))
    return out


def _layout(plan: Plan) -> list[dict[str, Any]]:
    """Rule 1 for torch's schedules: P x V stages, each where the schedule's layout puts it."""
    P, S = plan.devices, len(plan.stages)
    sched = schedule_of(plan.schedule)
    V = S // P
    if S % P or (sched.fixed_chunks is not None and V != sched.fixed_chunks):
        want = f"{sched.fixed_chunks} per device" if sched.fixed_chunks else "the same number on every device"
        return [{"rule": 1, "message": f"{plan.schedule} puts {want}; the plan has {S} stages on {P} devices"}]
    out = []
    for s, st in enumerate(plan.stages):
        want = (s if s < P else 2 * P - 1 - s) if sched.layout == "v" else s % P
        if st.device != want:
            out.append({"rule": 1, "message": f"stage {s} is on device {st.device}; {plan.schedule} puts it on "
                                               f"device {want}", "stage": s, "device": st.device})
    return out


def _durations(chain: Chain, plan: Plan, platform: Target) -> dict[str, list[float]]:
    """Per stage: forward, backward, I and W seconds, the bytes pending between I and W, and the transfer
    to the next stage (none on the same device)."""
    F, B, I, W, pend, c = [], [], [], [], [], []
    st = plan.stages
    for s, x in enumerate(st):
        layers = [chain.layers[l] for l in range(x.first, x.last + 1)]
        F.append(sum(l.forward for l in layers))
        B.append(sum(l.backward for l in layers))
        w = p = 0.0
        for l in range(x.first, x.last + 1):   # docs/model.md, "Backward split": measured, or estimated
            layer = chain.layers[l]
            has = layer.weight_bytes > 0
            w += min(layer.backward, layer.backward_weight if layer.backward_weight is not None
                     else (min(layer.forward, layer.backward / 2) if has else 0.0))
            p += (layer.weight_pending_bytes if layer.weight_pending_bytes is not None
                  else (chain.saved(l) if has else 0.0))
        first = s == 0          # torch's stage 0 runs no I: its whole backward is W
        I.append(0.0 if first else B[-1] - w)
        W.append(B[-1] if first else w)
        pend.append(0.0 if first or platform.setup.memory_model != "full" else p)
        nxt = st[s + 1].device if s + 1 < len(st) else x.device
        c.append(platform.comm_time(chain.cut(x.last), x.device, nxt) if nxt != x.device else 0.0)
    return {"F": F, "B": B, "I": I, "W": W, "pending": pend, "c": c}


def _replay(plan: Plan, orders: dict[int, list[Op]], d: dict[str, list[float]]
            ) -> tuple[dict[tuple[int, str, int], tuple[float, float]], str]:
    """Start and end of every operation when each device runs its order as early as its inputs allow;
    a message when the order misses an operation, repeats one or deadlocks."""
    S, m = len(plan.stages), int(plan.micro_batches or 0)
    listed = [(a.stage, a.kind, a.batch) for acts in orders.values() for a in acts]
    seen = set(listed)
    if len(seen) != len(listed):
        return {}, "an operation appears twice in the order"
    for s in range(S):
        for i in range(m):
            if (s, "F", i) not in seen or ((s, "B", i) not in seen and (s, "W", i) not in seen):
                return {}, f"the order lacks stage {s}'s forward or backward of micro-batch {i}"
    done: dict[tuple[int, str, int], tuple[float, float]] = {}
    pc = {dev: 0 for dev in orders}
    free = {dev: 0.0 for dev in orders}
    while len(done) < len(seen):
        moved = False
        for dev, acts in orders.items():
            while pc[dev] < len(acts):
                a = acts[pc[dev]]
                if a.kind == "F":
                    need = [((a.stage - 1, "F", a.batch), d["c"][a.stage - 1])] if a.stage > 0 else []
                elif a.kind == "W":
                    need = [((a.stage, "I", a.batch), 0.0)]
                else:
                    need = [((a.stage, "F", a.batch), 0.0)]
                    if a.stage < S - 1:
                        later = (a.stage + 1, "B" if (a.stage + 1, "B", a.batch) in done else "I", a.batch)
                        need.append((later, d["c"][a.stage]))
                if not all(k in done for k, _ in need):
                    break
                t = max([free[dev]] + [done[k][1] + c for k, c in need])
                done[(a.stage, a.kind, a.batch)] = (t, t + d[a.kind][a.stage])
                free[dev] = t + d[a.kind][a.stage]
                pc[dev] += 1
                moved = True
        if not moved:
            stuck = "; ".join(f"device {dev}: {acts[pc[dev]]}" for dev, acts in orders.items() if pc[dev] < len(acts))
            return done, f"the order deadlocks (stuck at {stuck})"
    return done, ""


def _peaks(chain: Chain, plan: Plan, platform: Target, done: dict, d: dict[str, list[float]]) -> list[float]:
    """Per device, the most bytes it holds at once over the replay, then with the optimizer's step."""
    grads, first_excess = [0.0] * len(plan.stages), [0.0] * len(plan.stages)
    if platform.setup.memory_model == "full":   # docs/model.md: a flush's gradients accumulate to its step ...
        zeros = [stage_terms(chain, platform.with_(zero_grad="zeros"), x.first, x.last) for x in plan.stages]
        first_excess = [z["op_excess"] for z in zeros]
        # ... made by the stage's first backward (B or W), which writes them fresh
        if platform.setup.zero_grad == "none":
            fresh = [stage_terms(chain, platform, x.first, x.last) for x in plan.stages]
            grads = [z["static"] - f["static"] for z, f in zip(zeros, fresh)]
            first_excess = [f["op_excess"] for f in fresh]
        terms = [{**z, "static": z["static"] - g} for z, g in zip(zeros, grads)]
    else:
        terms = [stage_terms(chain, platform, x.first, x.last) for x in plan.stages]
        first_excess = [x["op_excess"] for x in terms]
    const = float(chain.meta.get("runtime_bytes", 0.0) or 0.0) if platform.setup.memory_model == "full" else 0.0
    out = []
    for dev in range(plan.devices):
        mine = [s for s, x in enumerate(plan.stages) if x.device == dev]
        if not mine:
            out.append(0.0)
            continue
        static = sum(terms[s]["static"] for s in mine) + const
        firsts = {min((t0, key) for key, (t0, _) in done.items() if key[0] == s and key[1] in ("B", "W"))[1]
                  for s in mine if any(k[0] == s and k[1] in ("B", "W") for k in done)}
        events = []   # (time, order: releases first, held delta, excess or None)
        for (s, kind, i), (t0, t1) in done.items():
            if s not in mine:
                continue
            if kind == "F":
                events.append((t0, 1, terms[s]["A"], 0.0))
            if kind in ("B", "W"):
                events.append((t1, 0, -terms[s]["A"], 0.0))
            if kind == "I":
                events.append((t1, 1, d["pending"][s], 0.0))
            if kind == "W" and d["pending"][s]:
                events.append((t1, 0, -d["pending"][s], 0.0))
            first = (s, kind, i) in firsts     # the stage's first backward: its gradients exist once it ends
            excess = first_excess[s] if first else terms[s]["op_excess"]
            if t1 > t0 and excess > 0:
                events += [(t0, 1, 0.0, excess), (t1, 0, 0.0, -excess)]
            if first and grads[s]:
                events.append((t1, 1, grads[s], 0.0))
        held = excess = peak = 0.0
        for t, _, dh, dx in sorted(events, key=lambda e: (e[0], e[1])):
            held += dh
            excess += dx
            peak = max(peak, held + excess)
        step = max(terms[s]["step"] for s in mine) + sum(grads[s] for s in mine)
        out.append(static + max(peak, step))
    return out


def flushed_problems(plan: Plan, chain: Chain, platform: Target) -> list[dict[str, Any]]:
    """Every rule a flushed plan breaks (the module docstring), as ``Violation`` keyword dicts."""
    if schedule_of(plan.schedule).from_torch:
        bad = _layout(plan)
        if bad:
            return bad
    try:
        orders = flushed_orders(plan)
    except ValueError as e:
        return [{"rule": 0, "message": str(e)}]
    d = _durations(chain, plan, platform)
    done, why = _replay(plan, orders, d)
    if why:
        return [{"rule": 5, "message": why}]
    m = int(plan.micro_batches or 1)
    makespan = max(t1 for _, t1 in done.values())
    out: list[dict[str, Any]] = []
    if not math.isclose(plan.period, makespan / m, rel_tol=REL_TOL):
        out.append({"rule": 0, "message": f"the plan records a period of {format_seconds(plan.period)}; its "
                                          f"{plan.schedule} schedule of {m} micro-batches takes "
                                          f"{format_seconds(makespan)}, {format_seconds(makespan / m)} per "
                                          f"micro-batch"})
    peaks = _peaks(chain, plan, platform, done, d)
    for dev, peak in enumerate(peaks):
        limit = platform.memory_of(dev)
        if peak > limit * (1 + REL_TOL):
            out.append({"rule": 7, "message": f"device {dev} holds {format_bytes(peak)} at its peak, limit "
                                              f"{format_bytes(limit)}, over by {format_bytes(peak - limit)}",
                        "device": dev, "amount": peak - limit})
        if plan.memory and dev < len(plan.memory) and abs(plan.memory[dev] - peak) > REL_TOL * max(peak, 1.0):
            out.append({"rule": 7, "message": f"device {dev}: the plan records {format_bytes(plan.memory[dev])} of "
                                              f"memory, the replay gives {format_bytes(peak)}", "device": dev,
                        "amount": abs(plan.memory[dev] - peak)})
    return out
