"""The checker's own reading of activation policies and of rule 8 (the host link), from docs/model.md,
"Activation policies".

:mod:`workbench.model.activations` turns a policy vector into the effective chain the
planners work on; this module re-derives that chain for :mod:`workbench.verify.check`
from the columns as :mod:`workbench.verify.check_memory` reads them, and checks the
host-link rule on a plan's start times, sharing no code with the planners' side.

Rule 8, per device with host bandwidth h, for every stage s that offloads X_s
bytes (x_s = X_s / h seconds each way; its forward F_s starts at f_s, its
backward at b_s; T the period):

* the transfer out, ``[f_s + F_s, f_s + F_s + x_s)``, and the transfer back,
  ``[b_s - x_s, b_s)``, both fit in the gap between them:
  ``(b_s - f_s - F_s) mod T >= 2 x_s``;
* no two transfers of different stages on one device's host link overlap
  modulo T.

>>> from workbench.model.chain import Chain, Layer
>>> eff = effective_chain(Chain((Layer("a", 1.0, 2.0, 0, 8, 40),), input_bytes=4), ["recompute"])
>>> eff[0].backward, eff[0].saved_bytes
(3.0, 4.0)
"""

from __future__ import annotations

from typing import Sequence

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.verify.check_memory import layer_columns

__all__ = ["effective_chain", "host_link_problems"]


def _recomputed(layer: Layer, c: dict[str, float]) -> Layer:
    """docs/model.md: backward + forward; keeps its input only; the backward recomputes first."""
    return Layer(layer.name, layer.forward, layer.backward + layer.forward, layer.weight_bytes, layer.activation_bytes,
                 saved_bytes=c["in"], grad_bytes=c["grad"], max_param_bytes=c["max_param"],
                 saved_input_bytes=c["in"], saved_output_bytes=0.0, forward_peak_bytes=c["forward_peak"],
                 backward_peak_bytes=max(c["forward_peak"] + c["out"],
                                         c["saved"] - c["saved_input"] + c["backward_peak"]),
                 backward_fresh_peak_bytes=max(c["forward_peak"] + c["out"],
                                               c["saved"] - c["saved_input"] + c["backward_fresh_peak"]))


def _offloaded(layer: Layer, c: dict[str, float]) -> Layer:
    """docs/model.md: nothing saved on the device per mini-batch; one copy of the saved bytes resident."""
    return Layer(layer.name, layer.forward, layer.backward, layer.weight_bytes, layer.activation_bytes,
                 saved_bytes=0.0, grad_bytes=c["grad"], max_param_bytes=c["max_param"], saved_input_bytes=0.0,
                 saved_output_bytes=0.0, forward_peak_bytes=max(c["forward_peak"] - c["saved"], 0.0),
                 backward_peak_bytes=c["backward_peak"], backward_fresh_peak_bytes=c["backward_fresh_peak"],
                 offload_bytes=c["saved"])


def effective_chain(chain: Chain, activations: Sequence[str]) -> Chain:
    """``chain`` with each layer's policy applied (``keep`` layers unchanged)."""
    if len(activations) != len(chain):
        raise ValueError(f"the plan gives {len(activations)} activation policies for {len(chain)} layers")
    layers = []
    for l, policy in enumerate(activations):
        layer = chain.layers[l]
        if policy == "keep":
            layers.append(layer)
        elif policy == "recompute":
            layers.append(_recomputed(layer, layer_columns(chain, l)))
        elif policy == "offload":
            layers.append(_offloaded(layer, layer_columns(chain, l)))
        else:
            raise ValueError(f"layer {l}: unknown activation policy {policy!r}")
    return Chain(tuple(layers), chain.input_bytes, chain.cut_bytes, chain.meta, chain.graph)


def host_link_problems(chain: Chain, platform: Target, period: float, stages: Sequence,
                       tol: float) -> list[dict]:
    """Rule 8's violations as keyword dicts for :class:`workbench.verify.check.Violation` (``chain`` is the
    effective chain; ``stages`` have first, last, device, fwd_start, bwd_start)."""
    T = period
    out: list[dict] = []
    blocks: dict[int, list[tuple[float, float, int, str]]] = {}
    load: dict[int, float] = {}
    for i, s in enumerate(stages):
        offloaded = sum(chain.layers[l].offload_bytes for l in range(s.first, s.last + 1))
        if offloaded <= 0:
            continue
        x = platform.host_time(offloaded)
        F = sum(chain.layers[l].forward for l in range(s.first, s.last + 1))
        gap = (s.bwd_start - s.fwd_start - F) % T
        if gap > T - tol:
            gap = 0.0
        if gap < 2 * x - tol:
            out.append(dict(rule=8, message=f"stage {i} (device {s.device}) moves {x * 1e3:.4g} ms of activations "
                                             f"to host and {x * 1e3:.4g} ms back, but the gap between its forward's "
                                             f"end and its backward's start is {gap * 1e3:.4g} ms modulo the period "
                                             f"(short by {(2 * x - gap) * 1e3:.4g} ms)",
                            stage=i, device=s.device, amount=2 * x - gap))
        load[s.device] = load.get(s.device, 0.0) + 2 * x
        blocks.setdefault(s.device, []).append((s.fwd_start + F, x, i, "out"))
        blocks.setdefault(s.device, []).append((s.bwd_start - x, x, i, "in"))
    for d, busy in sorted(load.items()):
        if busy > T + tol:
            out.append(dict(rule=8, message=f"device {d}'s host link carries {busy * 1e3:.4g} ms per period, more "
                                             f"than the period {T * 1e3:.4g} ms", device=d, amount=busy - T))
            continue
        items = blocks[d]
        for a in range(len(items)):
            for b in range(a + 1, len(items)):
                (s0, d0, i0, k0), (s1, d1, i1, k1) = items[a], items[b]
                if i0 == i1:
                    continue
                r1, r2 = (s1 - s0) % T, (s0 - s1) % T
                if r1 < d0 - tol or r2 < d1 - tol:
                    out.append(dict(rule=8, message=f"device {d}'s host link: the transfer {k0} of stage {i0} and the "
                                                     f"transfer {k1} of stage {i1} overlap modulo the period",
                                    stage=i1, device=d, amount=max(d0 - r1, d1 - r2)))
    return out
