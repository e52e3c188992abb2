"""The throughput-under-memory ILP as a Pyomo model (docs/model.md, "Plan").

The model is written in *scaled time*: with a reference time ``T_ref`` (the
lower bound of :func:`workbench.model.plan.lower_bound`) the decision variable is
``u = T_ref / T`` (throughput relative to the bound, at most 1) and every
start time is measured in periods (``tau = t / T``). An operation of length
``d`` seconds then lasts ``(d / T_ref) * u`` periods, which is linear in
``u``, so the period is a variable of one MILP and no bisection is needed.
The only products left are binary x ``u`` (a cut's communication time, a
device's load), linearised exactly with McCormick bounds on ``u``.

Per layer l (0-based, L layers), p a device, all constraints constraint by constraint:

* ``x[l,p]`` layer l on device p. Contiguous: a staircase ``y[l,p] = [device(l) >= p]``
  with devices used in chain order (``y`` monotone in l, at most one step per layer),
  ``x[l,p] = y[l,p] - y[l,p+1]``. General: binaries with one device per layer, layer 0
  on device 0 and devices used in first-use order (symmetry breaking).
* ``cut[l]`` (after layer l) = 1 when l and l+1 sit on different devices; ``w[l] = cut[l] * u``.
* forward ``tf`` and backward ``tb`` start of every layer, in periods:
  ``fwd``:  ``c w <= tf[l+1] - tf[l] - f[l] u <= c w + cut`` (a stage runs back to back;
  a wait across a cut is shorter than a period, since a longer one can be shifted
  by a whole period, which only lowers in-flight counts);
  ``turn``: ``0 <= tb[L-1] - tf[L-1] - f[L-1] u <= 1``;
  ``bwd``:  ``c w <= tb[l] - tb[l+1] - b[l+1] u <= c w + cut``.
* ``k[l]`` integer in-flight count, equal within a stage (``|k[l] - k[l+1]| <= K cut``),
  ``k >= tb + b u - tf`` (at a stage's first layer: the window) and
  ``k - 1 <= tb - tf - f u`` (at its last layer: forward and backward do not overlap
  modulo T). Together: ``k = ceil(window / T)``, exactly the checker's count.
* memory (rule 7, :func:`workbench.model.memory_bands.linear_terms`), per device:
  ``sum_l a_l z[l,p] + w0_l x[l,p] + extras[p] <= M`` with ``z[l,p] >= k[l] - K (1 - x[l,p])``
  (= k x, from below, which is all a <= needs); ``a = A + [stash] W``, ``w0`` the static bytes
  less one stashed version; ``extras`` the stage-boundary terms (exact; the families of
  :mod:`workbench.planners.ilp.boundaries`) and a bound on the device's transient (see
  :func:`_add_memory_extras`). Paper model: ``w0 = (phi - [stash]) W``, no extras.
* link load (rule 6): contiguous ``c w <= 1``; general, per unordered device pair,
  ``sum_l c g[l,p,q] <= 1`` with ``g = e u`` and ``e[l,p,q]`` = the cut after l joins p and q.
* device load (general): ``device_load``: ``sum_l (f + b) v[l,p] <= 1`` with ``v = x u`` (a valid cut).
* no overlap modulo T (general, rule 5) for layers l < m - 1 on the same device ``s[l,m]``:
  for each of the 4 operation pairs (a of l, b of m) an integer ``n`` with
  ``n + d_a u - (1 - s) <= t_b - t_a <= n + 1 - d_b u + (1 - s)``.
  (Within a stage the rule for the stage's own forward/backward pair is the ``k`` pair.)

Objective: maximise ``u``. With ``period=`` given, ``u`` is fixed (a feasibility model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyomo.environ as pyo

from workbench.model.activations import policy_terms
from workbench.model.chain import Chain
from workbench.model.memory import layer_terms
from workbench.model.memory_bands import linear_terms
from workbench.model.plan import lower_bound
from workbench.model.target import Target
from workbench.model.tolerances import COUNT_SLACK, LOAD_SLACK, MEMORY_SLACK
from workbench.planners.ilp.boundaries import add_stage_buffers, add_stage_ends
from workbench.planners.ilp.bounds import k_bounds, memory_period_bound
from workbench.planners.ilp.policies import add_host_link, add_policy_memory, add_policy_time, minimal_terms
from workbench.planners.ilp.ties import add_tie_memory

__all__ = ["build_model", "ModelData"]


@dataclass
class ModelData:
    """Scaled instance data kept on the model (``model._ilp``)."""

    L: int
    P: int
    t_ref: float
    f: np.ndarray
    b: np.ndarray
    c: np.ndarray      # scaled comm time of the cut after each layer (length L, last 0)
    a: np.ndarray      # per-layer memory coefficient of k (bytes / M)
    w0: np.ndarray     # per-layer constant memory (bytes / M)
    kmax: np.ndarray   # per-layer bound on k
    u_lo: float
    u_hi: float
    allocation: str
    memory_bound: bool


def _add_memory_extras(m: pyo.ConcreteModel, lin, scale: float, kmax: np.ndarray) -> None:
    """The memory a device holds beyond ``sum_l k a + w0`` (docs/model.md, "Memory"), scaled by M:
    its stage-boundary terms (:mod:`workbench.planners.ilp.boundaries`: ``k head_l`` / ``k tail_l`` where
    layer l starts / ends a stage, and what it holds once there, exact), ``tau_p`` >= every layer's excess
    bound and the foreach step's sum (an upper bound on the device's largest excess), the tied parameters
    (:mod:`workbench.planners.ilp.ties`) and the runtime constant. ``m.extras[p]`` is their sum; zero in the
    paper model."""
    ends = add_stage_ends(m, lin.head / scale, lin.tail / scale, kmax)
    buffers = add_stage_buffers(m, lin.buf_head / scale, lin.buf_tail / scale)
    has_excess = _add_transient(m, lin.excess_ub / scale, lin.step_sum / scale)
    const = lin.const / scale
    ties = add_tie_memory(m, lin, scale, kmax)
    m.extras = pyo.Expression(m.Pset, rule=lambda _m, p: ends[p] + buffers[p] + (m.tau[p] if has_excess else 0)
                              + ties[p] + const)
    m._ilp_excess_bounded = has_excess or bool(np.any(lin.grad_ub > 0))


def _add_transient(m: pyo.ConcreteModel, ub: np.ndarray, fe: np.ndarray) -> bool:
    """Rule 7's excess, bounded: ``tau[p] >= ub_l x[l,p]`` for every layer (``tau_layer``; ``ub``: a layer's
    share of its stage's excess, scaled) and ``tau[p] >= sum_l fe_l x[l,p]`` (``tau_step``: the foreach step's
    temporaries). Returns whether there is any (no ``tau`` otherwise)."""
    if not (np.any(ub > 0) or np.any(fe > 0)):
        return False
    m.tau = pyo.Var(m.Pset, bounds=(0, None))
    m.tau_layer = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, p: m.tau[p] >= ub[l] * m.x[l, p]
                                 if ub[l] > 0 else pyo.Constraint.Skip)
    if np.any(fe > 0):
        m.tau_step = pyo.Constraint(m.Pset, rule=lambda _m, p: m.tau[p] >= sum(fe[l] * m.x[l, p] for l in m.Lset))
    return True


@dataclass(frozen=True)
class _Inputs:
    """What the constraint families read besides ``model._ilp``."""

    chain: Chain
    platform: Target
    lin: Any               # workbench.model.memory_bands.LinearTerms
    scale: float           # M (bytes), or 1 without a limit
    kmin: np.ndarray       # per-layer least in-flight count at the period cap
    K: float               # the largest kmax (big-M of the k links)
    H: float               # horizon in periods
    hi_T: float            # the period cap (seconds)
    comp: np.ndarray       # per-layer (f + b), scaled
    tighten: bool
    pairwise: bool
    policies: Any          # workbench.model.activations.PolicyTerms, or None without policies


def build_model(chain: Chain, platform: Target, *, allocation: str = "contiguous",
                period: float | None = None, period_bounds: tuple[float, float] | None = None,
                pairwise: bool = True, tighten: bool = True, policies: bool = False) -> pyo.ConcreteModel:
    """The plan ILP for ``chain`` on ``platform`` as a Pyomo ``ConcreteModel``: one function per
    constraint family, each citing the rule of docs/model.md ("Plan") it encodes.

    ``period`` fixes T (a feasibility model); ``period_bounds=(lo, hi)`` bounds it
    (tighter big-M values; ``hi`` from an incumbent). ``model.u`` is ``T_ref / T``
    with ``T_ref = model._ilp.t_ref``. ``pairwise=False`` drops the no-overlap
    constraints between different stages of one device (a relaxation; general only).
    ``policies=True`` also chooses every layer's activation policy (:mod:`workbench.planners.ilp.policies`).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> ch = Chain(tuple(Layer(f"l{i}", 0.001, 0.002, 10, 4) for i in range(4)))
    >>> m = build_model(ch, Target.of(2, memory=100, memory_model="paper"), allocation="contiguous")
    >>> sorted(c.name for c in m.component_objects(pyo.Constraint))[:3]
    ['bwd_hi', 'bwd_lo', 'fwd_hi']
    """
    if allocation not in ("contiguous", "general"):
        raise ValueError(f"allocation must be 'contiguous' or 'general', got {allocation!r}")
    m, inp = _scaled_instance(chain, platform, allocation, period, period_bounds, pairwise, tighten, policies)
    _add_time(m, inp, period)
    if allocation == "contiguous":
        _add_contiguous_allocation(m)
    else:
        _add_general_allocation(m)
    _add_cut_period(m)
    _add_precedence(m)
    _add_inflight(m, inp)
    if m._ilp.memory_bound:
        _add_memory(m, inp)
    if allocation == "contiguous":
        _add_contiguous_links(m)
    else:
        _add_general_loads(m, inp)
        if pairwise and m._ilp.P > 1:
            _add_overlap(m, inp)
    m.obj = pyo.Objective(expr=m.u, sense=pyo.maximize)
    return m


def _scaled_instance(chain: Chain, platform: Target, allocation: str, period: float | None,
                     period_bounds: tuple[float, float] | None, pairwise: bool, tighten: bool,
                     policies: bool) -> tuple[pyo.ConcreteModel, _Inputs]:
    """The empty model with its scaled data (``model._ilp``: times over T_ref, bytes over M) and the
    period range: at least the lower bound and the per-layer memory bound, at most the incumbent's (or
    any contiguous plan's) period."""
    L, P = len(chain), platform.devices
    t_ref = lower_bound(chain, platform)
    if t_ref <= 0:
        t_ref = 1.0
    f = chain.forward / t_ref
    b = chain.backward / t_ref
    c = np.array([platform.comm_time(chain.cut(l)) / t_ref if l < L - 1 else 0.0 for l in range(L)])
    M = platform.memory_limit
    mem = math.isfinite(M)
    scale = M if mem else 1.0
    lin = linear_terms(layer_terms(chain, platform))
    a, w0 = lin.a / scale, lin.w0 / scale
    least_terms = None
    pt = None
    if policies:
        pt = policy_terms(chain, platform)
        least_terms = minimal_terms(pt)
        a, w0 = least_terms[0] / scale, least_terms[1] / scale     # bounds only: memory is by policy below
    lo_T, hi_T = period_bounds if period_bounds else (t_ref, None)
    lo_T = max(lo_T, t_ref, min(memory_period_bound(chain, platform, least_terms), hi_T or math.inf))
    if hi_T is None or not math.isfinite(hi_T):
        # any contiguous plan with <= P stages, e.g. everything on one device
        hi_T = chain.total_compute + 2 * sum(platform.comm_time(chain.cut(l)) for l in range(L - 1)) + t_ref
    kmax = k_bounds(chain, platform, terms=least_terms)
    if period is not None:
        lo_T = hi_T = float(period)
    u_lo, u_hi = t_ref / hi_T, t_ref / lo_T
    K = float(kmax.max())
    comp = f + b
    # any plan with T <= hi_T keeps k_l >= (compute from layer l to the end and back) / hi_T
    down = np.cumsum(comp[::-1])[::-1] * t_ref  # seconds
    kmin = np.minimum(np.maximum(1.0, np.ceil(down / hi_T - COUNT_SLACK)), kmax)
    m = pyo.ConcreteModel(name=f"plan_ilp_{allocation}")
    m._ilp = ModelData(L, P, t_ref, f, b, c, a, w0, kmax, u_lo, u_hi, allocation, mem)
    return m, _Inputs(chain, platform, lin, scale, kmin, K, float(2 * L + K + 2), hi_T, comp, tighten, pairwise, pt)


def _add_time(m: pyo.ConcreteModel, inp: _Inputs, period: float | None) -> None:
    """The period and the start times, in scaled time (module docstring): ``u = T_ref / T``, the forward
    ``tf`` and backward ``tb`` start of every layer in periods (``tf[0] = 0``), the in-flight counts ``k``
    and every backward's length ``bu`` (with recomputation under policies)."""
    d = m._ilp
    L = d.L
    m.Lset = pyo.RangeSet(0, L - 1)
    m.Cset = pyo.RangeSet(0, L - 2) if L > 1 else pyo.Set(initialize=[])
    m.Pset = pyo.RangeSet(0, d.P - 1)
    m.u = pyo.Var(bounds=(d.u_lo, d.u_hi), initialize=d.u_lo)
    if period is not None:
        m.u.fix(d.t_ref / float(period))
    m.tf = pyo.Var(m.Lset, bounds=(0, inp.H))
    m.tb = pyo.Var(m.Lset, bounds=(0, inp.H))
    m.tf[0].fix(0.0)
    kmin, kmax = inp.kmin, d.kmax
    m.k = pyo.Var(m.Lset, domain=pyo.Integers, bounds=lambda _m, l: (kmin[l], kmax[l]))
    if inp.policies is not None:
        add_policy_time(m, d.f, d.b, d.u_lo, d.u_hi)          # m.bu[l]: backward in periods, with recomputation
    else:
        m.bu = pyo.Expression(m.Lset, rule=lambda _m, l: d.b[l] * m.u)


def _add_contiguous_allocation(m: pyo.ConcreteModel) -> None:
    """Rule 1, contiguous (one stage per device, devices in chain order): a staircase
    ``y[l,p] = [device(l) >= p]``, monotone in l with at most one step per layer; ``x[l,p] = y[l,p] - y[l,p+1]``,
    ``cut[l]`` the step after layer l."""
    P = m._ilp.P
    m.Sset = pyo.RangeSet(1, P - 1) if P > 1 else pyo.Set(initialize=[])
    m.y = pyo.Var(m.Lset, m.Sset, domain=pyo.Binary)
    for p in m.Sset:
        m.y[0, p].fix(0)

    def yv(l, p):
        if p <= 0:
            return 1
        if p >= P:
            return 0
        return m.y[l, p]

    m.y_mono = pyo.Constraint(m.Cset, m.Sset, rule=lambda _m, l, p: m.y[l + 1, p] >= m.y[l, p])
    m.y_step = pyo.Constraint(m.Cset, m.Sset,
                              rule=lambda _m, l, p: m.y[l + 1, p] <= yv(l, p - 1) if p >= 2 else pyo.Constraint.Skip)
    m.x = pyo.Expression(m.Lset, m.Pset, rule=lambda _m, l, p: yv(l, p) - yv(l, p + 1))
    m.cut = pyo.Expression(m.Cset, rule=lambda _m, l: sum(m.y[l + 1, p] - m.y[l, p] for p in m.Sset))


def _add_general_allocation(m: pyo.ConcreteModel) -> None:
    """Rule 1, general: a binary ``x[l,p]`` per layer and device, one device per layer; layer 0 on device 0
    and devices used in first-use order (symmetry breaking); ``cut[l]`` = 1 when l and l+1 are apart."""
    P = m._ilp.P
    m.x = pyo.Var(m.Lset, m.Pset, domain=pyo.Binary)
    m.one_device = pyo.Constraint(m.Lset, rule=lambda _m, l: sum(m.x[l, p] for p in m.Pset) == 1)
    m.x[0, 0].fix(1)
    for p in range(1, P):
        m.x[0, p].fix(0)
    # device p is used only after device p-1 has been used (first-use order)
    m.first_use = pyo.Constraint(
        m.Lset, m.Pset,
        rule=lambda _m, l, p: (m.x[l, p] <= sum(m.x[j, p - 1] for j in range(l)))
        if (p >= 1 and l >= 1) else pyo.Constraint.Skip)
    m.cut = pyo.Var(m.Cset, domain=pyo.Binary)
    m.cut_lo = pyo.Constraint(m.Cset, m.Pset, rule=lambda _m, l, p: m.cut[l] >= m.x[l, p] - m.x[l + 1, p])
    m.cut_hi = pyo.Constraint(m.Cset, m.Pset, rule=lambda _m, l, p: m.cut[l] <= 2 - m.x[l, p] - m.x[l + 1, p])


def _add_cut_period(m: pyo.ConcreteModel) -> None:
    """``w[l] = cut[l] u`` (a transfer's length in periods is ``c w``), linearised exactly (McCormick)."""
    u_lo, u_hi = m._ilp.u_lo, m._ilp.u_hi
    m.w = pyo.Var(m.Cset, bounds=(0, u_hi))
    m.w_1 = pyo.Constraint(m.Cset, rule=lambda _m, l: m.w[l] <= u_hi * m.cut[l])
    m.w_2 = pyo.Constraint(m.Cset, rule=lambda _m, l: m.w[l] <= m.u)
    m.w_3 = pyo.Constraint(m.Cset, rule=lambda _m, l: m.w[l] >= m.u - u_hi * (1 - m.cut[l]))
    m.w_4 = pyo.Constraint(m.Cset, rule=lambda _m, l: m.w[l] >= u_lo * m.cut[l])


def _add_precedence(m: pyo.ConcreteModel) -> None:
    """Rules 2-4: forwards in chain order (``fwd``), the turn at the last layer (``turn``, rule 3),
    backwards in reverse order (``bwd``), each after its predecessor and its transfer ``c w``; a stage
    runs back to back, and a wait across a cut is shorter than a period (a longer one can be shifted by
    a whole period, which only lowers in-flight counts)."""
    d = m._ilp
    L, f, c = d.L, d.f, d.c
    m.fwd_lo = pyo.Constraint(m.Cset, rule=lambda _m, l: m.tf[l + 1] - m.tf[l] - f[l] * m.u >= c[l] * m.w[l])
    m.fwd_hi = pyo.Constraint(m.Cset, rule=lambda _m, l: m.tf[l + 1] - m.tf[l] - f[l] * m.u <= c[l] * m.w[l] + m.cut[l])
    m.turn_lo = pyo.Constraint(expr=m.tb[L - 1] - m.tf[L - 1] - f[L - 1] * m.u >= 0)
    m.turn_hi = pyo.Constraint(expr=m.tb[L - 1] - m.tf[L - 1] - f[L - 1] * m.u <= 1)
    m.bwd_lo = pyo.Constraint(m.Cset, rule=lambda _m, l: m.tb[l] - m.tb[l + 1] - m.bu[l + 1] >= c[l] * m.w[l])
    m.bwd_hi = pyo.Constraint(m.Cset,
                              rule=lambda _m, l: m.tb[l] - m.tb[l + 1] - m.bu[l + 1] <= c[l] * m.w[l] + m.cut[l])


def _add_inflight(m: pyo.ConcreteModel, inp: _Inputs) -> None:
    """Rule 7's in-flight counts and rule 5 for a stage's own forward and backward: ``k >= tb + bu - tf``
    (``k_window``: the window, at a stage's first layer) and ``k - 1 <= tb - tf - f u`` (``k_gap``: they do
    not overlap modulo T; with offloaded activations the gap also holds the host round trip, rule 8);
    k is equal within a stage (``k_eq``). Together ``k = ceil(window / T)``, the checker's count."""
    d = m._ilp
    L, f, K = d.L, d.f, inp.K
    m.k_window = pyo.Constraint(m.Lset, rule=lambda _m, l: m.k[l] >= m.tb[l] + m.bu[l] - m.tf[l])
    pt = inp.policies
    host = (inp.platform.host_time(pt.offloaded[2]) / d.t_ref) * 2 if pt is not None else np.zeros(L)
    if np.any(host > 0):
        add_host_link(m, host, f, d.u_hi, d.allocation == "general")   # k_gap with the host round trip
    else:
        m.k_gap = pyo.Constraint(m.Lset, rule=lambda _m, l: m.k[l] - 1 <= m.tb[l] - m.tf[l] - f[l] * m.u)
    m.k_eq_1 = pyo.Constraint(m.Cset, rule=lambda _m, l: m.k[l] - m.k[l + 1] <= K * m.cut[l])
    m.k_eq_2 = pyo.Constraint(m.Cset, rule=lambda _m, l: m.k[l + 1] - m.k[l] <= K * m.cut[l])


def _add_memory(m: pyo.ConcreteModel, inp: _Inputs) -> None:
    """Rule 7 (docs/model.md, "Memory"; :func:`workbench.model.memory_bands.linear_terms`), per device scaled by M:
    ``sum_l a_l z[l,p] + w0_l x[l,p] + extras[p] <= 1`` with ``z[l,p] = k[l] x[l,p]`` from below; with
    ``tighten``, cuts that hold in every integer solution (``z <= kmax x``, ``z >= kmin x``, ``sum_p z = k``
    and, general, pairs of layers that can never share a device)."""
    d = m._ilp
    L, a, w0, kmax, kmin = d.L, d.a, d.w0, d.kmax, inp.kmin
    m.z = pyo.Var(m.Lset, m.Pset, bounds=lambda _m, l, p: (0, kmax[l]))
    m.z_lo = pyo.Constraint(m.Lset, m.Pset,
                            rule=lambda _m, l, p: m.z[l, p] >= m.k[l] - kmax[l] * (1 - m.x[l, p]))
    if inp.policies is not None:
        held = add_policy_memory(m, inp.policies, inp.scale, kmax)
        m.memory = pyo.Constraint(m.Pset, rule=lambda _m, p: held[p] <= 1)
    else:
        _add_memory_extras(m, inp.lin, inp.scale, kmax)
        m.memory = pyo.Constraint(m.Pset, rule=lambda _m, p: sum(a[l] * m.z[l, p] + w0[l] * m.x[l, p]
                                                                  for l in m.Lset) + m.extras[p] <= 1)
    if not inp.tighten:
        return
    # z = k x exactly in integer solutions: these only tighten the relaxation
    m.z_hi = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, p: m.z[l, p] <= kmax[l] * m.x[l, p])
    m.z_min = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, p: m.z[l, p] >= kmin[l] * m.x[l, p])
    if d.allocation == "general":
        # two layers whose least memory (or compute) together exceed a device never share one
        least = kmin * a + w0
        pairs = [(l, q) for l in range(L) for q in range(l + 1, L)
                 if least[l] + least[q] > 1 + MEMORY_SLACK
                 or (inp.comp[l] + inp.comp[q]) * d.t_ref > inp.hi_T * (1 + LOAD_SLACK)]
        if pairs:
            m.CONF = pyo.Set(initialize=pairs, dimen=2)
            m.conflict = pyo.Constraint(m.CONF, m.Pset, rule=lambda _m, l, q, p: m.x[l, p] + m.x[q, p] <= 1)
    m.z_sum = pyo.Constraint(m.Lset, rule=lambda _m, l: sum(m.z[l, p] for p in m.Pset) == m.k[l])


def _add_contiguous_links(m: pyo.ConcreteModel) -> None:
    """Rule 6, contiguous: each cut's transfer fits the period, ``c w <= 1`` (each link carries one)."""
    c = m._ilp.c
    m.link = pyo.Constraint(m.Cset, rule=lambda _m, l: c[l] * m.w[l] <= 1 if c[l] > 0 else pyo.Constraint.Skip)


def _add_general_loads(m: pyo.ConcreteModel, inp: _Inputs) -> None:
    """Rule 5's necessary load and rule 6, general: each device's compute fits the period,
    ``sum_l (f + b) v[l,p] <= 1`` with ``v = x u`` (``device_load``; with recomputation its extra forward);
    per unordered device pair the transfers of the cuts joining them, ``sum_l c g[l,p,q] <= 1`` with
    ``g = e u`` and ``e[l,p,q]`` = the cut after l joins p and q (``link``)."""
    d = m._ilp
    L, P, f, b, c, u_hi = d.L, d.P, d.f, d.b, d.c, d.u_hi
    policies = inp.policies is not None
    m.v = pyo.Var(m.Lset, m.Pset, bounds=(0, u_hi))
    m.v_lo = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, p: m.v[l, p] >= m.u - u_hi * (1 - m.x[l, p]))
    if inp.tighten:
        m.v_hi = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, p: m.v[l, p] <= u_hi * m.x[l, p])
        m.v_sum = pyo.Constraint(m.Lset, rule=lambda _m, l: sum(m.v[l, p] for p in m.Pset) == m.u)
    if policies:     # recomputation adds f v r to the load: vr >= v - u_hi (1 - r)
        m.vr = pyo.Var(m.Lset, m.Pset, bounds=(0, u_hi))
        m.vr_lo = pyo.Constraint(m.Lset, m.Pset, rule=lambda _m, l, p: m.vr[l, p] >= m.v[l, p] - u_hi * (1 - m.r[l, 1]))
    m.device_load = pyo.Constraint(m.Pset, rule=lambda _m, p: sum((f[l] + b[l]) * m.v[l, p]
                                                                  + (f[l] * m.vr[l, p] if policies else 0)
                                                                  for l in m.Lset) <= 1)
    if P > 1 and any(c[l] > 0 for l in range(L - 1)):
        pairs = [(p, q) for p in range(P) for q in range(p + 1, P)]
        cl = [l for l in range(L - 1) if c[l] > 0]
        m.PQ = pyo.Set(initialize=pairs, dimen=2)
        m.CL = pyo.Set(initialize=cl)
        m.e = pyo.Var(m.CL, m.PQ, bounds=(0, 1))
        m.e_1 = pyo.Constraint(m.CL, m.PQ, rule=lambda _m, l, p, q: m.e[l, p, q] >= m.x[l, p] + m.x[l + 1, q] - 1)
        m.e_2 = pyo.Constraint(m.CL, m.PQ, rule=lambda _m, l, p, q: m.e[l, p, q] >= m.x[l, q] + m.x[l + 1, p] - 1)
        m.g = pyo.Var(m.CL, m.PQ, bounds=(0, u_hi))
        m.g_lo = pyo.Constraint(m.CL, m.PQ, rule=lambda _m, l, p, q: m.g[l, p, q] >= m.u - u_hi * (1 - m.e[l, p, q]))
        m.link = pyo.Constraint(m.PQ, rule=lambda _m, p, q: sum(c[l] * m.g[l, p, q] for l in cl) <= 1)


def _add_overlap(m: pyo.ConcreteModel, inp: _Inputs) -> None:
    """Rule 5, general: for layers l < q - 1 on one device (``same[l,q]``), each of the 4 operation pairs
    (a of l, b of q) is apart modulo T: an integer ``n`` with
    ``n + d_a u - (1 - same) <= t_b - t_a <= n + 1 - d_b u + (1 - same)``. (Within a stage the rule for the
    stage's own forward and backward is the ``k`` pair of :func:`_add_inflight`.)"""
    d = m._ilp
    L, f, b, H = d.L, d.f, d.b, inp.H
    policies = inp.policies is not None
    pairs = [(l, q) for l in range(L) for q in range(l + 2, L)]
    m.LM = pyo.Set(initialize=pairs, dimen=2)
    m.OPS = pyo.Set(initialize=[(0, 0), (0, 1), (1, 0), (1, 1)], dimen=2)  # 0 forward, 1 backward
    m.same = pyo.Var(m.LM, bounds=(0, 1))
    m.same_lo = pyo.Constraint(m.LM, m.Pset, rule=lambda _m, l, q, p: m.same[l, q] >= m.x[l, p] + m.x[q, p] - 1)
    m.n = pyo.Var(m.LM, m.OPS, domain=pyo.Integers, bounds=(-H - 2, H + 2))

    def start(l, o):
        return m.tf[l] if o == 0 else m.tb[l]

    def dur(l, o):
        return f[l] if o == 0 else b[l] + (f[l] if policies else 0.0)   # recompute may lengthen it

    def span(l, o):     # the operation's length in periods
        return f[l] * m.u if o == 0 else m.bu[l]

    def ov1(_m, l, q, o1, o2):
        if dur(l, o1) <= 0 or dur(q, o2) <= 0:  # rule 5 ignores empty operations
            return pyo.Constraint.Skip
        return start(q, o2) - start(l, o1) >= m.n[l, q, o1, o2] + span(l, o1) - (1 - m.same[l, q])

    def ov2(_m, l, q, o1, o2):
        if dur(l, o1) <= 0 or dur(q, o2) <= 0:  # rule 5 ignores empty operations
            return pyo.Constraint.Skip
        return start(q, o2) - start(l, o1) <= m.n[l, q, o1, o2] + 1 - span(q, o2) + (1 - m.same[l, q])

    m.overlap_1 = pyo.Constraint(m.LM, m.OPS, rule=ov1)
    m.overlap_2 = pyo.Constraint(m.LM, m.OPS, rule=ov2)
