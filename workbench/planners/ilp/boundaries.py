"""The MILP's stage-boundary memory (docs/model.md, "Memory"; the terms: :mod:`workbench.model.memory_terms`).

A stage holds, besides its layers' terms, what :data:`workbench.model.memory_terms.BOUNDARY_TERMS` puts at its
first and last layer: per in-flight mini-batch (``head``, ``tail`` of
:class:`workbench.model.memory_bands.LinearTerms`) and once (``buf_head``, ``buf_tail``). Each side and
scaling is one family of product variables, from below (all a memory row ``<= 1`` needs):

* :func:`add_stage_ends`: ``zs[l,p] = k[l] x[l,p] [cut before l]`` and ``ze[l,p] = k[l] x[l,p] [cut after l]``,
  ``zs >= z - kmax (1 - cut)`` (``z = k x``), for the per-mini-batch terms;
* :func:`add_stage_buffers`: ``us[l,p] = x[l,p] [cut before l]`` and ``ue[l,p] = x[l,p] [cut after l]``,
  ``us >= x + cut - 1``, for the terms held once. Activation policies do not change these, so the model
  with policies adds the same family (:func:`workbench.planners.ilp.policies.add_policy_memory`).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.ilp.model import build_model
>>> ch = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(3)), input_bytes=4)
>>> m = build_model(ch, Target.of(2, memory=1000, optimizer="sgd"))
>>> sorted(m.BSTART), sorted(m.BEND)           # a receive buffer where a layer may start or end a stage
([1, 2], [0, 1])
"""

from __future__ import annotations

import numpy as np
import pyomo.environ as pyo

__all__ = ["add_stage_ends", "add_stage_buffers"]


def _cut_before(m: pyo.ConcreteModel, l: int):
    return 1 if l == 0 else m.cut[l - 1]


def add_stage_ends(m: pyo.ConcreteModel, head: np.ndarray, tail: np.ndarray, kmax: np.ndarray) -> dict:
    """``k head_l`` where layer l starts a stage and ``k tail_l`` where it ends one (``head``, ``tail`` scaled
    by M): ``zs``, ``ze`` from below. Returns, per device p, their sum."""
    L = m._ilp.L
    starts = [l for l in range(L) if head[l] > 0]
    ends = [l for l in range(L - 1) if tail[l] > 0]
    m.START = pyo.Set(initialize=starts)
    m.END = pyo.Set(initialize=ends)
    m.zs = pyo.Var(m.START, m.Pset, bounds=lambda _m, l, p: (0, kmax[l]))
    m.zs_lo = pyo.Constraint(m.START, m.Pset, rule=lambda _m, l, p:
                             m.zs[l, p] >= m.z[l, p] - kmax[l] * (1 - _cut_before(m, l)))
    m.ze = pyo.Var(m.END, m.Pset, bounds=lambda _m, l, p: (0, kmax[l]))
    m.ze_lo = pyo.Constraint(m.END, m.Pset, rule=lambda _m, l, p: m.ze[l, p] >= m.z[l, p] - kmax[l] * (1 - m.cut[l]))
    return {p: sum(head[l] * m.zs[l, p] for l in starts) + sum(tail[l] * m.ze[l, p] for l in ends) for p in m.Pset}


def add_stage_buffers(m: pyo.ConcreteModel, buf_head: np.ndarray, buf_tail: np.ndarray) -> dict:
    """What a stage holds once at its boundaries (``buf_head`` where layer l starts a stage, ``buf_tail`` where
    it ends one, scaled by M): ``us``, ``ue`` = x [cut] from below. Returns, per device p, their sum."""
    L = m._ilp.L
    bstarts = [l for l in range(L) if buf_head[l] > 0]
    bends = [l for l in range(L - 1) if buf_tail[l] > 0]
    m.BSTART = pyo.Set(initialize=bstarts)
    m.BEND = pyo.Set(initialize=bends)
    m.us = pyo.Var(m.BSTART, m.Pset, bounds=(0, 1))       # = x [cut before l], from below
    m.us_lo = pyo.Constraint(m.BSTART, m.Pset, rule=lambda _m, l, p: m.us[l, p] >= m.x[l, p] + _cut_before(m, l) - 1)
    m.ue = pyo.Var(m.BEND, m.Pset, bounds=(0, 1))         # = x [cut after l], from below
    m.ue_lo = pyo.Constraint(m.BEND, m.Pset, rule=lambda _m, l, p: m.ue[l, p] >= m.x[l, p] + m.cut[l] - 1)
    return {p: sum(buf_head[l] * m.us[l, p] for l in bstarts) + sum(buf_tail[l] * m.ue[l, p] for l in bends)
            for p in m.Pset}
