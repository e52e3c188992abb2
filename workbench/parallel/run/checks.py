"""What a layout run refuses before any rank starts: one ``ValueError`` naming the values (``error:``, exit 2).

* the plan's layout (its ``"parallel"`` object, :func:`layout_of_plan`) against the plan's pipeline: every
  stage on a pipeline coordinate below ``pp``, every coordinate holding a stage;
* more ranks than the run can start: on one machine at most ``max_ranks`` processes (``--max-ranks``), under
  ``torchrun`` exactly the ranks it started;
* a model whose sizes ``tp`` does not divide (:func:`~workbench.parallel.run.tensor.check_tensor_parallel`);
* ``zero`` without data parallelism, a periodic plan that needs weight stashing (the PipeDream engine runs
  ``tp = dp = 1`` only), a ``--steps`` that leaves a flushed plan a partial optimizer step, a micro-batch size
  other than the model's;
* a schedule that splits the backward (``interleaved-zb``, ``zbv``, ``dualpipev``) under data parallelism
  other than ``zero = 2``: torch's gradients then come out wrong (DDP, and FSDP2 resharding after each
  forward; measured against one process on 4 ranks: relative errors of 0.4 to 2.2).

>>> import json
>>> layout_of_plan({"parallel": {"tp": 2, "pp": 1, "dp": 2, "zero": 3}}).describe()
'TP 2 x PP 1 x DP 2, FSDP'
>>> layout_of_plan({"devices": 2}) is None
True
>>> check_ranks(Layout(tp=2, pp=8, dp=4), max_ranks=16)
Traceback (most recent call last):
ValueError: the layout TP 2 x PP 8 x DP 4, DDP needs 64 ranks but this run can start 16 on one machine \
(--max-ranks; across machines: torchrun --nnodes N ... -m workbench.runtime.engine)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from workbench.model.layout import Layout

__all__ = ["layout_of_plan", "is_layout_run", "check_ranks", "check_layout_plan", "layout_micro_batches",
           "check_layout_model", "DEFAULT_MAX_RANKS"]

#: processes a run starts on one machine at most, unless ``--max-ranks`` says otherwise
DEFAULT_MAX_RANKS = 16


def layout_of_plan(plan_json: str | Path | Mapping[str, Any]) -> Layout | None:
    """The layout of a plan JSON (a file or its object): its ``"parallel"`` object (also under ``"extra"``),
    None for a plan without one."""
    if isinstance(plan_json, Mapping):
        data: Any = plan_json
    else:
        try:
            data = json.loads(Path(plan_json).read_text())
        except (OSError, ValueError):
            return None             # Plan.from_json says what is wrong with the file
    if not isinstance(data, Mapping):
        return None
    par = data.get("parallel")
    if par is None and isinstance(data.get("extra"), Mapping):
        par = data["extra"].get("parallel")
    return None if par is None else Layout.from_dict(par)


def is_layout_run(layout: Layout | None) -> bool:
    """Whether a plan's layout needs the layout runtime (tensor or data parallelism); a pure pipeline
    (``tp = dp = 1``) runs on the pipeline runtime, as before layouts."""
    return layout is not None and (layout.tp > 1 or layout.dp > 1)


def check_ranks(layout: Layout, *, max_ranks: int | None = None, started: int | None = None) -> None:
    """Refuse a layout needing more ranks than one machine's ``max_ranks``, or other than the ``started``
    ranks of torchrun."""
    if started is not None and started != layout.devices:
        raise ValueError(f"the layout {layout.describe()} needs {layout.devices} ranks but torchrun started "
                         f"{started} (--nnodes x --nproc-per-node must be {layout.devices})")
    if max_ranks is not None and layout.devices > max_ranks:
        raise ValueError(f"the layout {layout.describe()} needs {layout.devices} ranks but this run can start "
                         f"{max_ranks} on one machine (--max-ranks; across machines: torchrun --nnodes N ... "
                         "-m workbench.runtime.engine)")


def check_layout_plan(plan, layout: Layout, where: str = "the plan") -> None:
    """Refuse a plan whose pipeline does not match the layout, or that the layout runtime cannot run."""
    layout.check()
    if not plan.feasible or not plan.stages:
        raise ValueError(f"{where}: the plan is infeasible; nothing to run")
    devices = sorted({st.device for st in plan.stages})
    if devices != list(range(layout.pp)):
        raise ValueError(f"{where}: the plan's stages sit on pipeline devices {devices} but the layout has pp="
                         f"{layout.pp}: each of 0..{layout.pp - 1} must hold a stage")
    from workbench.schedules.registry import TORCH_SCHEDULES, schedule_of

    splits = plan.schedule in TORCH_SCHEDULES and schedule_of(plan.schedule).split_backward
    if splits and layout.dp > 1 and layout.zero != 2:
        how = "DDP" if layout.zero < 2 else "FSDP resharding after each forward"
        raise ValueError(f"{where}: torch's {plan.schedule} schedule splits each backward into its input and weight "
                         f"gradients, and with zero={layout.zero} ({how}) torch's gradients come out wrong (measured "
                         "against one process): run it with zero=2, or a schedule that does not split the backward")
    if layout.tp_overlap:
        raise ValueError(f"{where}: the layout overlaps its tensor-parallel collectives with their GEMMs (tpo=1: "
                         "Transformer Engine's userbuffers, torch's async TP under compile), which the layout runtime "
                         "(eager torch on gloo) does not do: plan it with tpo=0 to run it")
    if layout.dp_overlap:
        raise ValueError(f"{where}: the layout runs ZeRO-1 as Megatron's overlapped distributed optimizer (dpo=1: "
                         "bucketed reduce-scatter behind the backward, all-gather behind the next forward), which the "
                         "layout runtime (DDP + ZeroRedundancyOptimizer) does not do: plan it with dpo=0 to run it")
    weights = (plan.setup or {}).get("weights", "stash")
    if plan.schedule == "periodic" and weights == "stash" and any(st.in_flight > 1 for st in plan.stages):
        raise ValueError(f"{where}: a periodic plan with weight stashing runs on the PipeDream engine, which runs "
                         f"tp=1, dp=1 only; plan the layout with --weights single or a flushed schedule")


def layout_micro_batches(plan, layout: Layout, steps: int | None) -> tuple[int, int]:
    """(micro-batches per replica and optimizer step, optimizer steps) of a run of ``steps`` mini-batches per
    replica (``--steps``: mini-batches, as for every method; default one optimizer step). A flushed plan runs its
    micro-batches (the layout's, else the plan's, else 2 x pp) per step, so ``steps`` must be a multiple of them
    (one line naming the counts it can run, :func:`~workbench.schedules.program.optimizer_steps`); a periodic plan
    runs its ``steps`` mini-batches as one step's micro-batches.

    >>> from workbench.model.plan import Plan
    >>> plan = Plan(1.0, (0,), (), 1, schedule="1f1b", micro_batches=4)
    >>> layout_micro_batches(plan, Layout(dp=2), None), layout_micro_batches(plan, Layout(dp=2), 8)
    ((4, 1), (4, 2))
    """
    from workbench.schedules.program import optimizer_steps
    from workbench.schedules.registry import schedule_of

    planned = layout.micro_batches or plan.micro_batches
    if not schedule_of(plan.schedule).flushed:
        return int(steps or planned or 2 * layout.pp), 1
    m = int(planned or 2 * layout.pp)
    if steps is None:
        return m, 1
    count, per_step = optimizer_steps(plan.with_(micro_batches=m), int(steps))
    return per_step, count


def check_layout_model(layout: Layout, model, batch_size: int | None) -> None:
    """Refuse a model whose sizes ``tp`` does not divide, or whose example batch is not the layout's micro-batch."""
    from workbench.parallel.run.tensor import check_tensor_parallel

    check_tensor_parallel(model, layout.tp)
    mbs = layout.micro_batch_size
    if mbs is not None and batch_size is not None and mbs != batch_size:
        raise ValueError(f"the layout's micro-batch size is {mbs} but the model's batch holds {batch_size} "
                         "samples: build the model with the plan's micro-batch size")


def check_loss_parallel(layout: Layout, workload, model) -> None:
    """With the vocabulary-parallel loss (``lp=1``), refuse a model whose chain does not end with its LM head's
    logits (a loss computed inside the model), or whose loss is not a plain cross-entropy of them
    (:func:`~workbench.parallel.run.tensor.cross_entropy_refusal`), naming the loss; nothing otherwise."""
    if not layout.loss_parallel or layout.tp == 1:
        return
    import torch

    from workbench.parallel.run.tensor import cross_entropy_refusal, tensor_parallel_plan
    from workbench.profiles.discover import discover_layers
    from workbench.runtime.rank import chain_input

    tensor = tensor_parallel_plan()
    plan = tensor.plan_model(model, layout.tp, loss_parallel=True)     # refuses a model without an LM head
    inputs, target = workload.batch(0)
    layers = discover_layers(model, inputs, workload.loss, target)
    name = f"{workload.name}'s loss {_loss_name(workload.loss)}"
    lp = "lp=1 (the vocabulary-parallel loss, torch's loss_parallel)"
    if layers.loss is None:
        raise ValueError(f"{lp} needs a loss of the head's logits; {workload.name} has none")
    h = chain_input(inputs)
    with torch.no_grad():
        for m in layers.modules:
            h = m(h)
    if not (isinstance(h, torch.Tensor) and h.dim() >= 2 and h.shape[-1] == plan.sizes.vocab):
        got = f"a tensor of shape {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__
        raise ValueError(f"{lp} computes the loss on the LM head's logits ({plan.sizes.vocab} per token), but "
                         f"{workload.name}'s chain ends at {layers.names[-1]} with {got} (a loss computed inside the "
                         "model, e.g. from labels=?): return the logits and a cross-entropy loss of them, or plan "
                         "with lp=0")
    why = cross_entropy_refusal(layers.loss, h, target)
    if why:
        raise ValueError(f"{lp} runs a plain cross-entropy of the logits only, and {name} is not one: {why}; "
                         "plan with lp=0")


def _loss_name(loss: Any) -> str:
    """The name of a workload's loss: the user's function for a ``--module`` workload, else its own."""
    from functools import partial

    if isinstance(loss, partial) and getattr(loss.func, "__name__", "") == "_user_loss":
        from workbench.profiles.workload import _user_example

        loss = _user_example(*loss.args)[2]
    while isinstance(loss, partial):
        loss = loss.func
    return getattr(loss, "__qualname__", None) or type(loss).__name__
