"""Run plans on torch.distributed and compare the measurement with the prediction (issue 6).

- :mod:`~workbench.runtime.program`: per-device programs unrolled from a plan;
- :mod:`~workbench.runtime.worker`: what one rank does;
- :mod:`~workbench.runtime.engine`: :func:`run_plan`, :class:`Workload`, reference gradients;
- :mod:`~workbench.runtime.compare`: predicted against measured, calibration;
- :mod:`~workbench.runtime.export`: plans as ``torch.distributed.pipelining`` action lists;
- :mod:`~workbench.runtime.commands`: ``python -m workbench run``.

Importing this package does not import torch; the submodules do.
"""

__all__ = ["run_plan", "Workload", "RunResult", "reference_gradients", "grad_error"]


def __getattr__(name):  # lazy: keep `import workbench.runtime` cheap
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
