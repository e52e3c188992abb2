"""``ilp``: the plan ILP (Pyomo + HiGHS), contiguous or general, and the searches around it.

Reading order (docs/model.md, "Planners"): :func:`plan_ilp` (:mod:`~workbench.planners.ilp.planner`, the
dispatch) takes :class:`IlpOptions` (:mod:`~workbench.planners.ilp.options`) and runs, with the one phase
runner of :mod:`~workbench.planners.ilp.runner`, the phases of :mod:`~workbench.planners.ilp.phases`
(feasibility, incumbent, stage bound, search, cover, MILP) over the model of
:mod:`~workbench.planners.ilp.model` (one function per constraint family), solved and read back by
:mod:`~workbench.planners.ilp.solve`. Around it: the bounds (:mod:`~workbench.planners.ilp.bounds`,
:mod:`~workbench.planners.ilp.stage_bound`), the searches (:mod:`~workbench.planners.ilp.search`,
:mod:`~workbench.planners.ilp.cover`), long chains on blocks (:mod:`~workbench.planners.ilp.coarsen`,
:mod:`~workbench.planners.ilp.coarse`) and activation policies (:mod:`~workbench.planners.ilp.policies`,
:mod:`~workbench.planners.ilp.auto`).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 100, 10) for i in range(4)))
>>> plan_ilp(ch, Target.of(2, memory=10_000, memory_model="paper")).status
'optimal'
"""

from workbench.planners.ilp.model import build_model
from workbench.planners.ilp.options import COARSEN_ABOVE, IlpOptions
from workbench.planners.ilp.planner import plan_ilp
from workbench.planners.ilp.solve import plan_from_model, solve_model
from workbench.planners.ilp.stage_bound import stage_path_bound

__all__ = ["plan_ilp", "IlpOptions", "COARSEN_ABOVE", "build_model", "solve_model",
           "plan_from_model", "stage_path_bound"]
