"""The ILP's activation-policy part (``activations="auto"``; docs/model.md, "Activation policies").

:func:`workbench.planners.ilp.model.build_model` with ``policies=True`` calls these to give every
layer a binary per policy, ``r[l, q]`` (q: keep, recompute, offload; one per layer), and to make
time and memory depend on them. All products below are of a binary with a bounded variable and
are linearised exactly for integer solutions (``y >= z - K (1 - r)``, ``y >= 0`` where y only
needs a lower bound, i.e. where it appears on the side a constraint bounds from above):

* **time**: ``ru[l] = r[l, recompute] u`` (McCormick, both sides) adds ``f[l] ru[l]`` to layer
  l's backward wherever ``b[l] u`` appears (precedence, windows, device load);
* **memory** (rule 7, :func:`workbench.model.activations.policy_terms`): a layer's activations, head and
  peak depend on its policy and its predecessor's; where they do (storage shared across the
  boundary), ``o[l, p, q] = r[l-1, p] r[l, q]`` (exact), else ``o[l, q] = r[l, q]``. The device's
  memory is ``sum_l sum_o a_o zo[l, d, o] + sum_q w0_q xr[l, d, q]`` plus the head and tail of
  stage ends (``zs``/``ze`` times the options, as without policies), what a stage holds once at its
  boundaries (the same family as without policies: :func:`workbench.planners.ilp.boundaries.add_stage_buffers`;
  a policy does not change it) and the transient bound
  ``tau[d] >= ub_o (x[l, d] + o - 1)``; ``zo >= z - K (1 - o)`` with ``z = k x``;
* **host link** (rule 8): ``ou[l] >= r[l, offload] u - ...`` and a running sum over the stage,
  ``H[l] >= h_l ou[l]`` and ``H[l] >= h_l ou[l] + H[l-1] - Hmax cut[l-1]`` (``h_l`` the layer's round trip in reference
  time); every layer's gap ``tb - tf - f u`` must hold ``k - 1 + H`` (at a stage's last layer
  that is rule 8's gap; elsewhere it is implied). General allocations also bound each device's
  host-link load by the period; transfers of different stages of one device are not kept apart
  in the MILP (the checker rejects such a solution, and the incumbent stands).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.activations import policy_terms
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 8, 40) for i in range(3)), input_bytes=8)
>>> options(policy_terms(ch, Target.of(1, memory_model="paper")), 1)     # no storage shared: one option per policy
[(None, 0), (None, 1), (None, 2)]
"""

from __future__ import annotations

import numpy as np
import pyomo.environ as pyo

from workbench.model.activations import POLICIES, PolicyTerms
from workbench.model.memory_bands import linear_terms
from workbench.planners.ilp.boundaries import add_stage_buffers
from workbench.planners.ilp.ties import add_tie_memory

__all__ = ["options", "minimal_terms", "add_policy_time", "add_policy_memory", "add_host_link", "read_policies"]

_N = len(POLICIES)
_RC, _OFF = POLICIES.index("recompute"), POLICIES.index("offload")


def options(pt: PolicyTerms, l: int) -> list[tuple[int | None, int]]:
    """Layer l's options ``(p, q)``: q its policy, p its predecessor's where that changes its terms
    (else None)."""
    pair = l > 0 and any(not np.allclose(arr[:, q, l], arr[0, q, l]) for arr in (pt.act, pt.head, pt.peak)
                         for q in range(_N))
    return [(p, q) for p in range(_N) for q in range(_N)] if pair else [(None, q) for q in range(_N)]


def minimal_terms(pt: PolicyTerms) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the least ``(a, w0)`` any policy gives (bounds on k and on the period stay valid)."""
    stash = pt.keep.stash
    a = (pt.act + stash[None, None, :]).min(axis=(0, 1))
    w0 = (pt.static - stash[None, :]).min(axis=0)
    return a, w0


def _indicator(m: pyo.ConcreteModel, l: int, o: tuple[int | None, int]):
    p, q = o
    return m.r[l, q] if p is None else m.o[l, p, q]


def add_policy_time(m: pyo.ConcreteModel, f: np.ndarray, b: np.ndarray, u_lo: float, u_hi: float) -> None:
    """One policy per layer (``r``, docs/model.md "Activation policies") and its time: ``bu[l]``, layer
    l's backward in periods, ``b u`` plus ``f u`` when it recomputes (``ru = r_recompute u``, McCormick)."""
    d = m._ilp
    m.Qset = pyo.RangeSet(0, _N - 1)
    m.r = pyo.Var(m.Lset, m.Qset, domain=pyo.Binary)
    m.one_policy = pyo.Constraint(m.Lset, rule=lambda _m, l: sum(m.r[l, q] for q in m.Qset) == 1)
    m.ru = pyo.Var(m.Lset, bounds=(0, u_hi))
    m.ru_1 = pyo.Constraint(m.Lset, rule=lambda _m, l: m.ru[l] <= u_hi * m.r[l, _RC])
    m.ru_2 = pyo.Constraint(m.Lset, rule=lambda _m, l: m.ru[l] <= m.u)
    m.ru_3 = pyo.Constraint(m.Lset, rule=lambda _m, l: m.ru[l] >= m.u - u_hi * (1 - m.r[l, _RC]))
    m.ru_4 = pyo.Constraint(m.Lset, rule=lambda _m, l: m.ru[l] >= u_lo * m.r[l, _RC])
    m.bu = pyo.Expression(m.Lset, rule=lambda _m, l: b[l] * m.u + f[l] * m.ru[l])
    d.policies = True


def _coef(arr: np.ndarray, l: int, o: tuple[int | None, int]) -> float:
    p, q = o
    return float(arr[0 if p is None else p, q, l])


def add_policy_memory(m: pyo.ConcreteModel, pt: PolicyTerms, scale: float, kmax: np.ndarray) -> pyo.Expression:
    """Rule 7 with policies (docs/model.md, "Memory" and "Activation policies"), every device's memory
    divided by ``scale`` (M): ``m.policy_memory[d]``, from the families below, in this order."""
    L = m._ilp.L
    opts = {l: options(pt, l) for l in range(L)}
    LO = _add_pair_indicators(m, opts)
    _add_policy_resident(m, kmax, LO, opts)
    starts, ends = _add_policy_stage_ends(m, pt, kmax, LO, opts)
    keep = pt.keep
    lin = linear_terms(keep)
    buffers = add_stage_buffers(m, lin.buf_head / scale, lin.buf_tail / scale)    # policies do not change them
    _add_policy_transient(m, pt, scale, LO, opts)
    a = pt.act + keep.stash[None, None, :]
    w0 = pt.static - keep.stash[None, :]
    ties = add_tie_memory(m, lin, scale, kmax)
    m.policy_memory = pyo.Expression(m.Pset, rule=lambda _m, d: ties[d] + (
        sum(_coef(a, l, opts[l][i]) / scale * m.zo[l, i, d] for l, i in LO)
        + sum(float(w0[q, l]) / scale * m.xr[l, q, d] for l in range(L) for q in range(_N))
        + sum(_coef(pt.head, l, opts[l][i]) / scale * m.zs[l, i, d] for l, i in starts)
        + sum(float(pt.tail[q, l]) / scale * m.ze[l, q, d] for l, q in ends)
        + buffers[d] + m.tau[d] + keep.const / scale))
    m._ilp_excess_bounded = True
    return m.policy_memory


def _add_pair_indicators(m: pyo.ConcreteModel, opts: dict) -> list[tuple[int, int]]:
    """Storage shared across a boundary (docs/model.md, "Memory": ``shared_l``): where layer l's terms
    depend on its predecessor's policy, ``o[l, p, q] = r[l-1, p] r[l, q]`` (exact for binaries). Returns
    every (layer, option index)."""
    L = m._ilp.L
    pairs = [(l, p, q) for l in range(L) for p, q in opts[l] if p is not None]
    m.PAIRS = pyo.Set(initialize=pairs, dimen=3)
    m.o = pyo.Var(m.PAIRS, bounds=(0, 1))
    m.o_1 = pyo.Constraint(m.PAIRS, rule=lambda _m, l, p, q: m.o[l, p, q] <= m.r[l - 1, p])
    m.o_2 = pyo.Constraint(m.PAIRS, rule=lambda _m, l, p, q: m.o[l, p, q] <= m.r[l, q])
    m.o_3 = pyo.Constraint(m.PAIRS, rule=lambda _m, l, p, q: m.o[l, p, q] >= m.r[l - 1, p] + m.r[l, q] - 1)
    return [(l, i) for l in range(L) for i in range(len(opts[l]))]


def _add_policy_resident(m: pyo.ConcreteModel, kmax: np.ndarray, LO: list, opts: dict) -> None:
    """Rule 7's resident terms by option: ``zo[l, i, d] >= z[l, d] - kmax (1 - option)`` (k mini-batches'
    activations of layer l under its option i, on device d) and ``xr[l, q, d] = x[l, d] r[l, q]`` (static
    bytes by policy, from below)."""
    m.LO = pyo.Set(initialize=LO, dimen=2)
    m.zo = pyo.Var(m.LO, m.Pset, bounds=lambda _m, l, i, d: (0, kmax[l]))
    m.zo_lo = pyo.Constraint(m.LO, m.Pset, rule=lambda _m, l, i, d:
                             m.zo[l, i, d] >= m.z[l, d] - kmax[l] * (1 - _indicator(m, l, opts[l][i])))
    m.xr = pyo.Var(m.Lset, m.Qset, m.Pset, bounds=(0, 1))
    m.xr_lo = pyo.Constraint(m.Lset, m.Qset, m.Pset,
                             rule=lambda _m, l, q, d: m.xr[l, q, d] >= m.x[l, d] + m.r[l, q] - 1)


def _add_policy_stage_ends(m: pyo.ConcreteModel, pt: PolicyTerms, kmax: np.ndarray, LO: list, opts: dict
                           ) -> tuple[list, list]:
    """Rule 7's stage-boundary terms by option: ``k head_l`` where layer l starts a stage (``zs``) and
    ``k tail_l`` where it ends one (``ze``), each from below. Returns the (layer, option) pairs with a head
    and the (layer, policy) pairs with a tail."""
    L = m._ilp.L

    def cut_before(l: int):
        return 1 if l == 0 else m.cut[l - 1]

    starts = [(l, i) for l, i in LO if _coef(pt.head, l, opts[l][i]) > 0]
    ends = [(l, q) for l in range(L - 1) for q in range(_N) if pt.tail[q, l] > 0]
    m.PSTART = pyo.Set(initialize=starts, dimen=2)
    m.PEND = pyo.Set(initialize=ends, dimen=2)
    m.zs = pyo.Var(m.PSTART, m.Pset, bounds=lambda _m, l, i, d: (0, kmax[l]))
    m.zs_lo = pyo.Constraint(m.PSTART, m.Pset, rule=lambda _m, l, i, d: m.zs[l, i, d] >= m.z[l, d]
                             - kmax[l] * (1 - cut_before(l)) - kmax[l] * (1 - _indicator(m, l, opts[l][i])))
    m.ze = pyo.Var(m.PEND, m.Pset, bounds=lambda _m, l, q, d: (0, kmax[l]))
    m.ze_lo = pyo.Constraint(m.PEND, m.Pset, rule=lambda _m, l, q, d: m.ze[l, q, d] >= m.z[l, d]
                             - kmax[l] * (1 - m.cut[l]) - kmax[l] * (1 - m.r[l, q]))
    return starts, ends


def _add_policy_transient(m: pyo.ConcreteModel, pt: PolicyTerms, scale: float, LO: list, opts: dict) -> None:
    """Rule 7's excess, bounded as without policies: ``tau[d]`` at least every option's peak (or step) on
    the device, and the foreach step's sum (an upper bound on the device's largest excess)."""
    keep = pt.keep
    L = m._ilp.L
    peak = np.maximum(pt.peak, 0.0)
    ub = peak if keep.step_sum else np.maximum(peak, keep.step[None, None, :])
    fe = keep.step if keep.step_sum else np.zeros(L)
    m.tau = pyo.Var(m.Pset, bounds=(0, None))
    m.tau_opt = pyo.Constraint(m.LO, m.Pset, rule=lambda _m, l, i, d:
                               m.tau[d] >= _coef(ub, l, opts[l][i]) / scale
                               * (m.x[l, d] + _indicator(m, l, opts[l][i]) - 1)
                               if _coef(ub, l, opts[l][i]) > 0 else pyo.Constraint.Skip)
    if np.any(fe > 0):
        m.tau_step = pyo.Constraint(
            m.Pset, rule=lambda _m, d: m.tau[d] >= sum(fe[l] / scale * m.x[l, d] for l in m.Lset))


def add_host_link(m: pyo.ConcreteModel, host: np.ndarray, f: np.ndarray, u_hi: float, general: bool) -> None:
    """Rule 8 (docs/model.md, "Activation policies") with ``host[l]`` = layer l's round trip when offloaded,
    in reference time: ``H[l]``, the stage's offloaded round trip up to layer l (``ou = r_offload u``, a
    running sum reset at cuts), must fit in the gap with the other in-flight mini-batches,
    ``k - 1 + H <= tb - tf - f u`` (``k_gap_host``); general allocations also bound each device's host-link
    load by the period (``host_load``)."""
    big = float(host.sum()) * u_hi
    m.ou = pyo.Var(m.Lset, bounds=(0, u_hi))
    m.ou_lo = pyo.Constraint(m.Lset, rule=lambda _m, l: m.ou[l] >= m.u - u_hi * (1 - m.r[l, _OFF]))
    m.H = pyo.Var(m.Lset, bounds=(0, big))
    m.H_own = pyo.Constraint(m.Lset, rule=lambda _m, l: m.H[l] >= host[l] * m.ou[l])
    m.H_run = pyo.Constraint(m.Lset, rule=lambda _m, l: m.H[l] >= host[l] * m.ou[l] + m.H[l - 1] - big * m.cut[l - 1]
                             if l > 0 else pyo.Constraint.Skip)
    m.k_gap_host = pyo.Constraint(m.Lset, rule=lambda _m, l: m.k[l] - 1 + m.H[l] <= m.tb[l] - m.tf[l] - f[l] * m.u)
    if general:
        m.hv = pyo.Var(m.Lset, m.Pset, bounds=(0, u_hi))
        m.hv_lo = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, d: m.hv[l, d] >= m.ou[l] - u_hi * (1 - m.x[l, d]))
        m.host_load = pyo.Constraint(m.Pset, rule=lambda _m, d: sum(host[l] * m.hv[l, d] for l in m.Lset) <= 1)


def read_policies(m: pyo.ConcreteModel) -> tuple[str, ...]:
    """The solution's policy of every layer."""
    L = m._ilp.L
    return tuple(POLICIES[int(np.argmax([pyo.value(m.r[l, q]) for q in range(_N)]))] for l in range(L))
