"""The pipeline transform of a layout's rank: torch's ``PipelineStage`` per own stage, and the plan's schedule.

A rank at pipeline coordinate ``pp`` runs the plan's stages whose ``device`` is ``pp`` (a plan of a layout is
the pipeline of one replica: its devices are the ``pp`` coordinates), each as torch's ``PipelineStage`` over
the rank's ``pp`` group (``mesh["pp"].get_group()``: the ranks of its ``dp`` and ``tp`` coordinates, in
pipeline order). The module a stage runs is the stage's layers after the tensor- and data-parallel
transforms (a DDP or FSDP2 module: torch's schedules handle both, see :mod:`~workbench.parallel.run.data`).

The schedule is torch's class where one runs the plan's method, computing its own order: ``ScheduleGPipe``
and ``Schedule1F1B`` for GPipe and 1F1B (one stage per rank), the multi-stage classes of
:data:`workbench.schedules.registry.TORCH_SCHEDULES` (interleaved 1F1B, looped BFS, zero bubble, V). The seed's periodic
plans (one weight version) run their own order, unrolled (:func:`~workbench.schedules.program.programs_for`),
lowered to torch's actions (:func:`~workbench.runtime.export.programs_to_actions`) and run by
``_PipelineScheduleRuntime``, which adds the sends, receives and FSDP2's gradient reduction itself. A
periodic plan with weight stashing needs the PipeDream engine, which runs ``tp = dp = 1`` only: it is
refused for layouts.

>>> schedule_kind("interleaved-1f1b"), schedule_kind("1f1b"), schedule_kind("periodic")
('torch class ScheduleInterleaved1F1B', 'torch class Schedule1F1B', "the plan's order")
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from workbench.methods import METHODS

__all__ = ["schedule_kind", "build_stages", "make_schedule", "needs_programs", "receive_buffers",
           "SINGLE_STAGE_CLASSES"]


def schedule_kind(method: str) -> str:
    """How a plan of ``method`` is run: torch's class, or the plan's order through torch's runtime."""
    from workbench.schedules.registry import TORCH_SCHEDULES, schedule_of

    if method in TORCH_SCHEDULES:
        return f"torch class {schedule_of(method).torch_class}"
    if method in SINGLE_STAGE_CLASSES:
        return f"torch class {SINGLE_STAGE_CLASSES[method]}"
    return "the plan's order"


def _meta(shape: Sequence[int], dtype: torch.dtype, grad: bool) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta").requires_grad_(grad and dtype.is_floating_point)


def build_stages(plan, modules: dict[int, nn.Module], shapes: Sequence[tuple[tuple[int, ...], torch.dtype]],
                 x0: torch.Tensor, group: Any, device: torch.device) -> list[Any]:
    """A ``PipelineStage`` per own stage (``modules``: stage index -> the module it runs), over ``group``;
    ``shapes`` the output (shape, dtype) of every layer on one micro-batch, ``x0`` one micro-batch's input."""
    from torch.distributed.pipelining import PipelineStage

    n = len(plan.stages)
    out = []
    for s, mod in sorted(modules.items()):
        st = plan.stages[s]
        x_in = _meta(*shapes[st.first - 1], grad=True) if st.first > 0 else x0.to("meta")
        out.append(PipelineStage(mod, s, n, device, input_args=(x_in,),
                                 output_args=(_meta(*shapes[st.last], grad=True),), group=group))
    return out


#: the workbench's flushed methods that torch runs with its single-stage classes (one stage per rank)
SINGLE_STAGE_CLASSES = {m.name: m.single_stage_class for m in METHODS if m.single_stage_class}


def make_schedule(plan, stages: list[Any], micro_batches: int, loss_fn: Any, programs: list | None = None) -> Any:
    """The schedule of ``plan`` over this rank's ``stages`` (see the module docstring); gradients summed over
    the micro-batches (``scale_grads=False``), as one process sums them over its mini-batches. ``programs``:
    the plan's unrolled order, for a plan that no torch class runs."""
    from torch.distributed.pipelining import schedules as ts

    from workbench.schedules.registry import TORCH_SCHEDULES, schedule_of

    if plan.schedule in TORCH_SCHEDULES:
        cls = getattr(ts, schedule_of(plan.schedule).torch_class)
        return cls(stages, micro_batches, loss_fn=loss_fn, scale_grads=False)
    if plan.schedule in SINGLE_STAGE_CLASSES and len(stages) == 1:
        cls = getattr(ts, SINGLE_STAGE_CLASSES[plan.schedule])
        return cls(stages[0], micro_batches, loss_fn=loss_fn, scale_grads=False)
    from workbench.runtime.export import programs_to_actions

    schedule = ts._PipelineScheduleRuntime(stages, micro_batches, loss_fn=loss_fn, scale_grads=False)
    actions = {d: [ts._Action.from_str(a) for a in acts] for d, acts in programs_to_actions(programs, plan).items()}
    schedule._prepare_schedule_with_comms(actions)
    return schedule


def needs_programs(plan) -> bool:
    """Whether the plan runs its own unrolled order (no torch class runs it)."""
    from workbench.schedules.registry import TORCH_SCHEDULES

    return plan.schedule not in TORCH_SCHEDULES and plan.schedule not in SINGLE_STAGE_CLASSES


def receive_buffers(stages: list[Any]) -> list[torch.Tensor]:
    """The receive buffers torch preallocated for the stages (input activations, output gradients)."""
    from workbench.runtime.torch_engine import _stage_buffers

    return [t for stage in stages for t in _stage_buffers(stage)]
