"""Run plans on torch.distributed and compare the measurement with the prediction (issues 6, 16).

- :mod:`~workbench.profiles.workload`: what to train (a zoo model or ``FILE.py:FUNC``), picklable;
- :mod:`~workbench.schedules.program`: per-device programs unrolled from a plan;
- :mod:`~workbench.runtime.rank`: a rank's layers, optimizer, clock and allocator-level memory probe;
- :mod:`~workbench.runtime.torch_engine`: the plan on ``torch.distributed.pipelining``'s own engine;
- :mod:`~workbench.runtime.pipedream`: the PipeDream fallback (weight stashing, a step after every backward);
- :mod:`~workbench.runtime.messages`: the fallback's receive order, tags and sends in flight;
- :mod:`~workbench.runtime.config`: :class:`~workbench.runtime.config.RunConfig`, what a rank needs;
- :mod:`~workbench.runtime.worker`: a rank's process (process group, engine, saved result);
- :mod:`~workbench.runtime.engine`: :func:`run_plan`, engine choice, ``torchrun`` entry;
- :mod:`~workbench.runtime.gradients`: the gradient check against one process;
- :mod:`~workbench.runtime.session`: what ``run`` and ``torchrun`` check before a run and conclude after it;
- :mod:`~workbench.runtime.replay`: each device of a plan alone;
- :mod:`~workbench.runtime.compare`: predicted against measured, calibration;
- :mod:`~workbench.runtime.export`: plans as ``torch.distributed.pipelining`` action lists;
- :mod:`~workbench.runtime.summary`: a run's summary against its prediction (``summary.json``, the table);
- :mod:`~workbench.front.running`: ``python -m workbench run``.

Importing this package does not import torch; the submodules do.
"""

__all__ = ["run_plan", "Workload", "RunResult", "reference_gradients", "grad_error"]


def __getattr__(name):  # lazy: keep `import workbench.runtime` cheap
    if name in __all__:
        from workbench.runtime import engine

        return getattr(engine, name)
    raise AttributeError(name)
