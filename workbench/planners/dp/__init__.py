"""``dp``: the exact contiguous planner, memory-aware, on chains and on DAG profiles.

* :func:`plan_dp` (:mod:`~workbench.planners.dp.contiguous`): the method; the recurrence and its
  probes are in that module's docstring;
* :mod:`~workbench.planners.dp.memory_dp`: one probe at a period, without an L x L table;
* :mod:`~workbench.planners.dp.auto`: keep, recompute or offload chosen per layer, exactly;
* :mod:`~workbench.planners.dp.graph` and :mod:`~workbench.planners.dp.graph_units`: the layer order of
  a DAG profile.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> plan_dp(Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(4))), Target.of(2)).period
6.0
"""

from workbench.planners.dp.auto import auto_on_chain
from workbench.planners.dp.contiguous import least_contiguous_memory, partition_period, plan_dp, schedule_partition
from workbench.planners.dp.graph import best_order
from workbench.planners.dp.memory_dp import memory_dp

__all__ = ["plan_dp", "least_contiguous_memory", "partition_period", "schedule_partition", "auto_on_chain",
           "memory_dp", "best_order"]
