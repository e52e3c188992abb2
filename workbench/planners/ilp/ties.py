"""The MILP's tied parameters and backward gradients (docs/model.md, "Tied parameters" and "Memory").

:func:`workbench.planners.ilp.model.build_model` (with and without activation policies) adds to every
device's memory what :func:`add_tie_memory` returns: the stage terms of the tied parameters
(:class:`workbench.model.memory.TieTerms`), exact for integer solutions, and the gradients its
backwards make, an upper bound beside the transient ``tau``.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.memory import layer_terms
>>> from workbench.model.memory_bands import linear_terms
>>> import json
>>> tied = json.dumps([{"owner": "a", "layers": ["a", "c"], "bytes": 8}])
>>> ch = Chain((Layer("a", 1, 1, 8), Layer("b", 1, 1), Layer("c", 1, 1)), meta={"tied": tied})
>>> tie_spans(linear_terms(layer_terms(ch, Target.of(2, weights="stash"))))   # c's copy: a boundary in a..b
([(0, 2, [0, 1])], [(0, 0, [1, 2])])
"""

from __future__ import annotations

import numpy as np
import pyomo.environ as pyo

__all__ = ["tie_spans", "add_tie_memory"]


def tie_spans(lin) -> tuple[list, list]:
    """``(copies, owners)``: per sharer ``(tie, s, span)``, a copy when some layer of ``span`` (from the
    tie's previous user to s - 1) is on another device than s; per owner with a receive buffer
    ``(tie, o, span)``, the buffer when some layer of ``span`` (after o, up to the last sharer) is on
    another device than o. A tie whose owner is not its first user has empty spans: charged always."""
    copies, owners = [], []
    for n, x in enumerate(lin.ties):
        users = [x.tie.owner] + list(x.tie.sharers)
        first = x.tie.owner < min(x.tie.sharers)
        for k, s in enumerate(x.tie.sharers):
            copies.append((n, s, list(range(users[k], s)) if first else []))
        if x.recv > 0:
            owners.append((n, x.tie.owner, list(range(x.tie.owner + 1, max(x.tie.sharers) + 1)) if first else []))
    return copies, owners


def _indicator(m: pyo.ConcreteModel, name: str, items: list) -> pyo.Var:
    """``v[c, p] >= x[at, p] - x[q, p]`` for q in the item's span (``>= x[at, p]`` for an empty one)."""
    var = pyo.Var(range(len(items)), m.Pset, bounds=(0, 1))
    setattr(m, name, var)
    cons = pyo.ConstraintList()
    setattr(m, name + "_lo", cons)
    for c, (_, at, span) in enumerate(items):
        for p in m.Pset:
            for q in span or [None]:
                cons.add(var[c, p] >= m.x[at, p] - (m.x[q, p] if q is not None else 0))
    return var


def _per_extra_k(m: pyo.ConcreteModel, name: str, items: list, flag: pyo.Var, kmax: np.ndarray) -> pyo.Var:
    """``v[c, p] >= (k - 1) flag[c, p]`` at the item's layer (from below, exact where ``flag`` is 1)."""
    top = [max(kmax[at] - 1, 0) for _, at, _ in items]
    var = pyo.Var(range(len(items)), m.Pset, bounds=lambda _m, c, p: (0, top[c]))
    setattr(m, name, var)
    setattr(m, name + "_lo", pyo.Constraint(range(len(items)), m.Pset, rule=lambda _m, c, p: var[c, p] >= m.z[
        items[c][1], p] - m.x[items[c][1], p] - top[c] * (1 - flag[c, p])))
    return var


def add_tie_memory(m: pyo.ConcreteModel, lin, scale: float, kmax: np.ndarray) -> pyo.Expression:
    """Per device, scaled by M: every tied copy's resident bytes (``ty``) and stashed versions
    (``tw = (k - 1) ty``, from below), every owner's receive buffers (``tr``, and ``trk = (k - 1) tr`` more),
    and ``sum_l grad_ub_l x[l, p]`` (:class:`workbench.model.memory_bands.LinearTerms`)."""
    copies, owners = tie_spans(lin)
    ty = _indicator(m, "ty", copies)
    tr = _indicator(m, "tr", owners)
    tw = _per_extra_k(m, "tw", copies, ty, kmax)
    trk = _per_extra_k(m, "trk", owners, tr, kmax)
    grad = lin.grad_ub / scale
    made = [l for l in range(m._ilp.L) if grad[l] > 0]
    m.tie_memory = pyo.Expression(m.Pset, rule=lambda _m, p: (
        sum(lin.ties[n].static / scale * ty[c, p] + lin.ties[n].stash / scale * tw[c, p]
            for c, (n, _, _) in enumerate(copies))
        + sum(lin.ties[n].recv / scale * tr[c, p] + lin.ties[n].recv_k / scale * trk[c, p]
              for c, (n, _, _) in enumerate(owners))
        + sum(grad[l] * m.x[l, p] for l in made)))
    return m.tie_memory
