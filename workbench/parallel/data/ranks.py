"""Every rank's predicted peak, for the runtime that measures it (docs/model.md, "Layouts").

A layout's ranks hold what their pipeline rank holds (the ``pp`` coordinate; every data-parallel replica and
every tensor-parallel rank of it the same, the chain being one rank's). :func:`rank_memory` is the predicted
peak of one rank of the layout running ``plan`` (the pipeline of one replica) on ``chain`` (one rank's), under
the platform's training set-up with the layout's data-parallel group (:mod:`workbench.model.memory_zero`):

* a flushed plan: the simulated peak of its pipeline rank (GPipe and 1F1B:
  :func:`workbench.schedules.simulate.simulate`; torch's multi-stage schedules: the order's peaks,
  :class:`workbench.schedules.order_memory.OrderMemory`);
* a periodic plan: the memory model's peak (:func:`workbench.model.memory_views.plan_memory`);

plus, with ``engine=True`` (the default), what torch's pipeline engine holds beyond the model (receive buffers
per micro-batch, the sends it keeps: :func:`workbench.runtime.summary.engine_extra`), since the runtime runs
torch's engine; a 1F1B plan with one stage per pipeline rank runs torch's ``Schedule1F1B``, which keeps one send
each way, not every micro-batch's (:func:`sends_kept`: GPT-2's last of 2 pipeline ranks was over-predicted by
``N - 1`` input gradients, -2.1 % at tp 2). A flushed plan is predicted with one weight version whatever the
platform says (:meth:`~workbench.model.target.Target.for_layout`): the layout runtime runs it on torch's engine,
where every pipeline rank holding a copy of a tied parameter (GPT-2's head, tied to its embedding) keeps that
copy's gradient and optimizer state and steps it; the PipeDream engine's terms (``weights="stash"``: the sharer
sends its gradient to the owner, which keeps a receive buffer per mini-batch in flight) under-predicted that rank by
the copy's Adam states (+17 % on GPT-2's last of 2 ranks). :func:`rank_memory_terms` splits the model's part by term.

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.model.layout import Layout
>>> from workbench.planners import plan
>>> ch = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6) for i in range(4)), input_bytes=1e6)
>>> lay = Layout(pp=2, dp=2, zero=2)
>>> p = plan(ch, Target.of(2, weights="single", dp=2, zero=2), "1f1b", micro_batches=4)
>>> rank_memory(p, ch, Target.of(2, weights="single"), lay, 3, engine=False) == p.memory[1]   # rank 3: pp 1
True
"""

from __future__ import annotations

from workbench.model.chain import Chain
from workbench.model.layout import Layout
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.schedules.registry import schedule_of

__all__ = ["rank_memory", "rank_memory_terms", "pipeline_peaks", "single_stage", "sends_kept"]


def single_stage(plan: Plan) -> bool:
    """Whether ``plan`` is one stage (``pp`` = 1): the layout runtime then runs torchtitan's training loop, each
    micro-batch's forward and backward in turn with no pipeline engine around them, as the model prices it
    (FSDP2 layer by layer, each micro-batch reduced: :mod:`workbench.model.memory_zero`)."""
    return len(plan.stages) == 1


def sends_kept(plan: Plan) -> int | None:
    """The sends the layout runtime's schedule keeps per stage each way (:mod:`workbench.parallel.run.pipeline`):
    one for a plan torch runs with ``Schedule1F1B`` (one stage per pipeline rank; it waits for each send and keeps
    the last), None (every micro-batch's, to the end of the step) for the others.

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.planners import plan as make_plan
    >>> ch = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6) for i in range(4)), input_bytes=1e6)
    >>> [sends_kept(make_plan(ch, Target.of(2), m, micro_batches=4)) for m in ("1f1b", "gpipe")]
    [1, None]
    """
    from workbench.parallel.run.pipeline import SINGLE_STAGE_CLASSES
    from workbench.schedules.registry import TORCH_SCHEDULES

    if plan.schedule in TORCH_SCHEDULES or len(plan.stages) != plan.devices:
        return None
    return 1 if SINGLE_STAGE_CLASSES.get(plan.schedule) == "Schedule1F1B" else None


def pipeline_peaks(plan: Plan, chain: Chain, platform: Target) -> list[float]:
    """The model's peak per pipeline rank of ``plan`` (module docstring)."""
    from workbench.methods import method
    from workbench.model.activations import apply_policies
    from workbench.model.memory_views import plan_memory

    eff = apply_policies(chain, plan.activations) if plan.activations else chain
    if plan.schedule == "periodic":
        return plan_memory(eff, platform, plan.stages)
    if method(plan.schedule).torch_schedule:
        from workbench.schedules.order_memory import OrderMemory
        from workbench.schedules.torch_orders import torch_order

        S = len(plan.stages)
        om = OrderMemory(eff, platform, [s.device for s in plan.stages],
                         torch_order(plan.schedule, plan.devices, S // plan.devices, int(plan.micro_batches or 1)))
        return list(om.peaks([(s.first, s.last) for s in plan.stages]))
    from workbench.schedules.simulate import simulate

    return list(simulate(plan, chain, platform, batches=int(plan.micro_batches or 1)).peak_memory())


def rank_memory(plan: Plan, chain: Chain, platform: Target, layout: Layout, rank: int, *,
                engine: bool = True) -> float:
    """The predicted peak bytes of ``rank`` (the layout's rank order: tp innermost, then dp, then pp) running
    ``plan`` on ``chain`` (module docstring); ``platform`` carries the hardware and the training set-up
    (:meth:`Target.for_layout <workbench.model.target.Target.for_layout>` gives it the layout)."""
    pipeline = layout.coords(rank)[0]
    p = platform.for_layout(layout, flushed=schedule_of(plan.schedule).flushed)
    if single_stage(plan) and schedule_of(plan.schedule).flushed:
        plan = plan.with_(schedule="1f1b")      # the loop's order: each micro-batch's forward, then its backward
    model = pipeline_peaks(plan, chain, p)[pipeline]
    if not engine or single_stage(plan):       # one stage runs without torch's pipeline engine
        return float(model)
    n, kept = int(plan.micro_batches or 1), sends_kept(plan)
    if kept is None:
        from workbench.runtime.summary import engine_extra

        return float(model + engine_extra(plan, chain, p, n, "torch")[pipeline])
    from workbench.schedules.order_memory import engine_extra as flushed_engine_extra

    return float(model + flushed_engine_extra(plan, chain, p, n, kept)[pipeline])


def rank_memory_terms(plan: Plan, chain: Chain, platform: Target, layout: Layout, rank: int) -> dict[str, float]:
    """The memory model's terms for ``rank``'s pipeline rank (parameters, gradients, optimizer state, masters,
    activations with every stage's in-flight count, buffers, the largest transient: the model's split,
    :func:`workbench.model.memory_views.memory_breakdown`), under the layout's data-parallel group."""
    from workbench.model.activations import apply_policies
    from workbench.model.memory_views import memory_breakdown

    eff = apply_policies(chain, plan.activations) if plan.activations else chain
    pipeline = platform.for_layout(layout, flushed=schedule_of(plan.schedule).flushed)
    return memory_breakdown(eff, pipeline, plan.stages)[layout.coords(rank)[0]]
