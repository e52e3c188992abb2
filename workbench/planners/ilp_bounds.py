"""Lower bounds and a logic-based Benders search for the GENERAL allocation problem.

The *master* at a fixed period T is a pure assignment problem (no start times):

* ``x[l,p]`` layer l on device p (one device each, devices in first-use order);
* ``cut[l]`` = layers l and l+1 on different devices;
* ``k[l]`` integer in-flight count, equal within a stage, with
  ``k[l] T >= D_l + 2 sum_{i >= l} c_i cut[i]`` (``D_l`` = compute from layer l to the
  end and back): the window of l's stage contains l's forward, everything downstream,
  the transfers across every later cut (both ways) and l's backward;
* memory per device (rule 7 with ``z = k x``), device load ``<= T``, link load per
  device pair ``<= T`` (rules 5-7 relaxed: no start times, no overlap).

Every valid plan with period ``<= T`` gives a feasible master solution, so an
infeasible master proves ``T* > T``: :func:`master_lower_bound` bisects on T for
the largest such T (a valid lower bound on the period of any general plan).

:func:`benders` is exact: with an incumbent period ``T_inc`` it solves the master
at ``T_inc (1 - eps)``; each master solution is an allocation whose exact least
period is computed (:func:`workbench.planners.ilp_search.allocation_best`); better
ones become the incumbent (and the master period drops), the others are cut off by
a no-good cut (valid for every lower period). An infeasible master proves the
incumbent optimal.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import highspy
import numpy as np

from ..chain import Chain, Platform
from ..plan import lower_bound

__all__ = ["Master", "master_lower_bound", "benders"]

INF = highspy.kHighsInf


class Master:
    """The assignment master at a fixed period (rebuilt per T; no-good cuts carried over)."""

    def __init__(self, chain: Chain, platform: Platform) -> None:
        self.chain, self.platform = chain, platform
        self.L, self.P = len(chain), platform.devices
        self.comp = chain.forward + chain.backward
        self.down = np.cumsum(self.comp[::-1])[::-1]
        L = self.L
        self.c = np.array([platform.comm_time(chain.cut(l)) if l < L - 1 else 0.0 for l in range(L)])
        s = 1.0 if platform.stash else 0.0
        self.a = chain.saved_array + s * chain.weights
        self.w0 = (platform.weight_factor - s) * chain.weights
        self.nogoods: list[tuple[int, ...]] = []

    def solve(self, T: float, time_limit: float | None = None) -> tuple[str, tuple[int, ...] | None]:
        """('infeasible'|'feasible'|'timeout', assignment) of the master at period T."""
        L, P = self.L, self.P
        M = self.platform.memory
        mem = math.isfinite(M)
        down, c, a, w0, comp = self.down, self.c, self.a, self.w0, self.comp
        tol = 1e-9
        # kmax per layer (alone on a device)
        kmax = np.full(L, 10**6, dtype=float)
        struct = math.ceil((down[0] + 2 * c.sum()) / T + 1e-9) + 2 * L + 2
        kmax[:] = struct
        if mem:
            for l in range(L):
                if a[l] > 0:
                    kmax[l] = min(kmax[l], math.floor((M - w0[l]) / a[l] * (1 + 1e-9)))
        kmin = np.maximum(1.0, np.ceil(down / T * (1 - tol) - 1e-12))
        if np.any(kmin > kmax) or np.any(comp > T * (1 + tol)):
            return "infeasible", None
        K = float(kmax.max())
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("presolve_rule_off", 8192)
        h.setOptionValue("mip_feasibility_tolerance", 1e-9)
        if time_limit is not None:
            h.setOptionValue("time_limit", max(float(time_limit), 0.01))
        x = [[h.addBinary() for _ in range(P)] for _ in range(L)]
        cut = [h.addBinary() for _ in range(L - 1)]
        k = [h.addIntegral(lb=float(kmin[l]), ub=float(kmax[l])) for l in range(L)]
        for l in range(L):
            h.addConstr(sum(x[l]) == 1)
        h.addConstr(x[0][0] == 1)
        for p in range(1, P):
            for l in range(L):
                if l == 0:
                    h.addConstr(x[0][p] == 0)
                else:
                    h.addConstr(x[l][p] - sum(x[j][p - 1] for j in range(l)) <= 0)
        for l in range(L - 1):
            for p in range(P):
                h.addConstr(cut[l] - x[l][p] + x[l + 1][p] >= 0)
                h.addConstr(cut[l] + x[l][p] + x[l + 1][p] <= 2)
            h.addConstr(k[l] - k[l + 1] - K * cut[l] <= 0)
            h.addConstr(k[l + 1] - k[l] - K * cut[l] <= 0)
        # k_l T >= D_l + 2 sum_{i>=l} c_i cut_i
        for l in range(L - 1):
            terms = [(2 * c[i] / T) * cut[i] for i in range(l, L - 1) if c[i] > 0]
            if terms:
                h.addConstr(k[l] - sum(terms) >= down[l] / T * (1 - tol))
        # device load
        for p in range(P):
            h.addConstr(sum((comp[l] / T) * x[l][p] for l in range(L)) <= 1 + tol)
        # memory
        if mem:
            z = [[h.addVariable(lb=0.0, ub=float(kmax[l])) for _ in range(P)] for l in range(L)]
            for l in range(L):
                for p in range(P):
                    h.addConstr(z[l][p] - k[l] - kmax[l] * x[l][p] >= -kmax[l])
                    h.addConstr(z[l][p] - kmax[l] * x[l][p] <= 0)
                    h.addConstr(z[l][p] - kmin[l] * x[l][p] >= 0)
                h.addConstr(sum(z[l]) - k[l] == 0)
            for p in range(P):
                h.addConstr(sum((a[l] / M) * z[l][p] + (w0[l] / M) * x[l][p] for l in range(L)) <= 1 + tol)
            # pairs that cannot share a device
            least = kmin * a + w0
            for l in range(L):
                for q in range(l + 1, L):
                    if least[l] + least[q] > M * (1 + tol) or comp[l] + comp[q] > T * (1 + tol):
                        for p in range(P):
                            h.addConstr(x[l][p] + x[q][p] <= 1)
        # link load per device pair
        cl = [l for l in range(L - 1) if c[l] > 0]
        if P > 1 and cl and float(c.max()) > 0:
            for p in range(P):
                for q in range(p + 1, P):
                    es = []
                    for l in cl:
                        e = h.addVariable(lb=0.0, ub=1.0)
                        h.addConstr(e - x[l][p] - x[l + 1][q] >= -1)
                        h.addConstr(e - x[l][q] - x[l + 1][p] >= -1)
                        es.append((c[l] / T) * e)
                    if sum(c[l] for l in cl) > T * (1 + tol):
                        h.addConstr(sum(es) <= 1 + tol)
        # no-good cuts: allocation a (first-use normalised) excluded
        for ng in self.nogoods:
            h.addConstr(sum(x[l][ng[l]] for l in range(L)) <= L - 1)
        h.run()
        st = h.getModelStatus()
        if st == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", None
        info = h.getInfo()
        if info.primal_solution_status == 2:  # feasible point
            sol = h.getSolution().col_value
            assign = []
            for l in range(L):
                vals = [sol[x[l][p].index] for p in range(P)]
                assign.append(int(np.argmax(vals)))
            return "feasible", tuple(assign)
        return "timeout", None


def master_lower_bound(chain: Chain, platform: Platform, hi: float, *, deadline: float | None = None,
                       rel: float = 1e-3, lo: float | None = None) -> float:
    """Largest T (to relative precision ``rel``) at which the master is proved infeasible: a valid
    lower bound on the period of every general plan. ``hi``: a known feasible period."""
    from .ilp_model import memory_period_bound

    m = Master(chain, platform)
    base = max(lower_bound(chain, platform), memory_period_bound(chain, platform), lo or 0.0)
    if not math.isfinite(base):
        return base
    best = base  # valid
    lo_T, hi_T = base, hi
    while hi_T > lo_T * (1 + rel):
        if deadline is not None and time.perf_counter() > deadline:
            break
        mid = (lo_T + hi_T) / 2
        left = None if deadline is None else deadline - time.perf_counter()
        st, _ = m.solve(mid, time_limit=left)
        if st == "infeasible":
            lo_T = mid
            best = max(best, mid)
        elif st == "feasible":
            hi_T = mid
        else:
            break
    return best


def benders(chain: Chain, platform: Platform, T_inc: float, *, deadline: float | None = None,
            eps: float = 1e-6, on_improve=None):
    """Exact search below ``T_inc``: returns (status, best (T, assignment, f, b) or None, n_iter).
    status 'optimal' means no allocation has a period below the final incumbent (/(1+eps))."""
    from .ilp_search import allocation_best, normalise

    m = Master(chain, platform)
    best = None
    T = T_inc
    it = 0
    while True:
        if deadline is not None and time.perf_counter() > deadline:
            return "timeout", best, it
        left = None if deadline is None else deadline - time.perf_counter()
        st, assign = m.solve(T / (1 + eps), time_limit=left)
        it += 1
        if st == "infeasible":
            return "optimal", best, it
        if st == "timeout":
            return "timeout", best, it
        assign = normalise(assign)
        try:
            r = allocation_best(chain, platform, assign, T / (1 + eps), deadline=deadline)
        except TimeoutError:
            return "timeout", best, it
        if deadline is not None and time.perf_counter() > deadline and r is None:
            return "timeout", best, it
        if r is not None and r[0] < T / (1 + eps):
            T = r[0]
            best = (r[0], assign, r[1], r[2])
            if on_improve is not None:
                on_improve(best, it)
        m.nogoods.append(assign)


def _pack(hit):
    if hit is None:
        return None
    return (float(hit[0]), tuple(int(a) for a in hit[1]), list(map(float, hit[2])), list(map(float, hit[3])))


def side_search(chain: Chain, platform: Platform, T_inc: float, seconds: float, emit=None):
    """Master lower bound (a third of the time at most) then Benders below ``T_inc``, within
    ``seconds``: (bound, Benders status, best hit or None, master solves). ``emit`` receives
    every intermediate result (status 'timeout' until the end) and the final one."""
    t0 = time.perf_counter()
    end = t0 + max(seconds, 0.0)
    mlb = 0.0
    try:
        mlb = float(master_lower_bound(chain, platform, T_inc, deadline=t0 + seconds / 3, rel=2e-3))
        if emit is not None:
            emit((mlb, "timeout", None, 0))
        if T_inc <= mlb * (1 + 1e-9):
            st, hit, it = "optimal", None, 0
        else:
            cb = (lambda h, i: emit((mlb, "timeout", _pack(h), i))) if emit is not None else None
            st, hit, it = benders(chain, platform, T_inc, deadline=end, on_improve=cb)
        out = (mlb, st, _pack(hit), it)
    except Exception as e:  # noqa: BLE001 - the side search must never break the solve
        out = (mlb, f"error: {e!r}", None, 0)
    if emit is not None:
        emit(out)
    return out


def side_main() -> None:  # pragma: no cover - run in a child process by workbench.planners.ilp
    """Child process entry: arguments pickled on stdin, length-prefixed pickled results on stdout."""
    import os
    import pickle
    import struct
    import sys

    try:
        os.nice(15)  # the MILP in the parent keeps priority
    except OSError:
        pass
    args = pickle.load(sys.stdin.buffer)

    def emit(obj):
        data = pickle.dumps(obj)
        sys.stdout.buffer.write(struct.pack("<I", len(data)) + data)
        sys.stdout.buffer.flush()

    side_search(*args, emit=emit)
