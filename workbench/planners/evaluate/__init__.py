"""The per-allocation evaluator: the exact least period of one allocation (brute force and the ILP's
searches use it; tests/oracles.py checks it independently).

* :mod:`~workbench.planners.evaluate.allocation`: one allocation's stages, contiguous closed form,
  memory floors;
* :mod:`~workbench.planners.evaluate.orders`: a general allocation's orders modulo T, certified;
* :mod:`~workbench.planners.evaluate.period`: :func:`allocation_period`, :func:`allocation_best`,
  :func:`path_period`.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> allocation_period(Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 0) for i in range(3))), Target.of(2), (0, 0, 1))[0]
6.0
"""

from workbench.planners.evaluate.allocation import allocation_of, contiguous_period
from workbench.planners.evaluate.orders import general_period
from workbench.planners.evaluate.period import allocation_best, allocation_period, normalise, path_period

__all__ = ["allocation_period", "allocation_best", "path_period", "normalise", "general_period", "allocation_of",
           "contiguous_period"]
