"""Run a plan on torch.distributed, one process per device, and compare the measurement with the prediction.

``python -m workbench run`` (:mod:`workbench.front.running`) and ``torchrun -m workbench.runtime.engine`` start
the ranks; each rank runs its devices' program (:mod:`workbench.schedules.program`) on one of two engines.

- :mod:`~workbench.runtime.engine`: :func:`run_plan`, the engine's choice, the ``torchrun`` entry;
- :mod:`~workbench.runtime.config`: :class:`~workbench.runtime.config.RunConfig`, what a rank needs;
- :mod:`~workbench.runtime.worker`: a rank's process (process group, engine, saved result);
- :mod:`~workbench.runtime.rank`: a rank's layers, optimizer, clock and allocator-level memory probe;
- :mod:`~workbench.runtime.training`: optimizers by name, fp32 masters for bf16-mixed;
- :mod:`~workbench.runtime.policy_layers`: layers that recompute or offload their activations, and the offload stores;
- :mod:`~workbench.runtime.torch_engine`: the plan on ``torch.distributed.pipelining``'s own engine;
- :mod:`~workbench.runtime.export`: plans as ``torch.distributed.pipelining`` action lists;
- :mod:`~workbench.runtime.pipedream`: the PipeDream fallback (weight stashing, a step after every backward),
  with :mod:`~workbench.runtime.messages`: its receive order, tags and sends in flight;
- :mod:`~workbench.runtime.session`: what ``run`` and ``torchrun`` check before a run and conclude after it;
- :mod:`~workbench.runtime.gradients`: the gradient check against one process;
- :mod:`~workbench.runtime.summary`: a run's summary against its prediction (``summary.json``, the table);
- :mod:`~workbench.runtime.compare`: predicted against measured, calibration;
- :mod:`~workbench.runtime.period_budget`: where a measured period goes, part by part;
- :mod:`~workbench.runtime.replay`: each device of a plan alone;
- :mod:`~workbench.runtime.witness`: torch's MemTracker around a plain training step (the memory model's witness).

Importing this package does not import torch; the submodules do.
"""

__all__ = ["run_plan", "Workload", "RunResult", "reference_gradients", "grad_error"]


def __getattr__(name):  # lazy: keep `import workbench.runtime` cheap
    if name in __all__:
        from workbench.runtime import engine

        return getattr(engine, name)
    raise AttributeError(name)
