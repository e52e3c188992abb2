"""The data-parallel transform of a layout's rank: ``zero`` 0-3 as torch's own pieces (docs/model.md, "Layouts").

=====  ==================================================================================================
zero   what wraps a pipeline stage (its ``nn.Sequential`` of layers) over the ``dp`` sub-mesh
=====  ==================================================================================================
0      ``DistributedDataParallel`` (torch's defaults): every rank holds the whole stage, its gradients, its
       optimizer state and DDP's gradient buckets; gradients are all-reduced (averaged) over ``dp``. Under tensor
       parallelism (``DTensor`` parameters, which DDP refuses) FSDP2's DDP instead, torch's ``replicate``
       (``torch.distributed._composable.replicate_with_fsdp``, torchtitan's DDP): the same all-reduce
1      the same DDP, and the optimizer is ``ZeroRedundancyOptimizer``: each rank keeps the optimizer state of
       its share of the parameters and broadcasts its updated share after the step (under tensor parallelism
       of its share of the rank's local shards, :class:`LocalShards`)
2      FSDP2: ``fully_shard(layer, reshard_after_forward=False)`` on every layer, then on the stage: the
       parameters stay gathered from a layer's forward through its backward; gradients reduce-scattered
3      FSDP2 with ``reshard_after_forward=True``: parameters sharded again after each layer's forward,
       gathered again for its backward
=====  ==================================================================================================

DDP runs with torch's default ``gradient_as_bucket_view=False``: its buckets are a second copy of the
gradients, allocated when it is built (and again when it rebuilds them, in the second step's forward) and
kept; a gradient is copied into its bucket, the bucket all-reduced, and copied back. The buckets are
counted by the memory tracker through the communication hook (:func:`watch_buckets`: torch's own
all-reduce hook, which also keeps each bucket's buffer). Buffers are not re-broadcast before each forward
(``forward_sync_buffers=False``): every rank builds the same model from the same seed.

Under FSDP2 a layer that holds a tied parameter (an embedding and its head on one stage) is not sharded on
its own: FSDP2 wants a shared parameter in one group, so it stays in the stage's (the root's) group.

Inside a pipeline, torch's schedules drive both: ``PipelineStage.backward_maybe_with_nosync`` runs every
micro-batch's backward but the last under ``no_sync`` (DDP) or without gradient sync (FSDP2), and the
schedule's ``REDUCE_GRAD`` action reduces FSDP2's gradients after the last backward.

>>> ZERO_PIECES[1]
'DDP + ZeroRedundancyOptimizer'
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch import nn

__all__ = ["ZERO_PIECES", "shard_data_parallel", "watch_buckets", "ddp_buckets", "make_layout_optimizer",
           "LocalShards", "local_optimizer", "zero_grads", "is_fsdp", "local_tensor"]

#: the torch pieces of each ZeRO level (agreed with the layout model of ``workbench.parallel.data``)
ZERO_PIECES = {0: "DDP", 1: "DDP + ZeroRedundancyOptimizer", 2: "fully_shard(reshard_after_forward=False)",
               3: "fully_shard(reshard_after_forward=True)"}


def shard_data_parallel(stage: nn.Sequential, zero: int, dp_mesh: Any, dp: int,
                        tied_layers: Sequence[int] = (), tp: int = 1) -> nn.Module:
    """``stage`` wrapped for ``zero`` over ``dp_mesh`` (the module a ``PipelineStage`` runs); ``stage`` itself
    when ``dp`` is 1. ``tied_layers``: positions in ``stage`` of layers holding a tied parameter; ``tp``: the
    tensor-parallel degree (above 1 the parameters are DTensors, which DDP does not take)."""
    if dp == 1 or not any(p.requires_grad for p in stage.parameters()):
        return stage          # nothing to reduce (a stage of activations and pooling only)
    if zero in (0, 1) and tp > 1:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        return replicate(stage, mesh=dp_mesh)
    if zero in (0, 1):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(stage, process_group=dp_mesh.get_group(), forward_sync_buffers=False)
        ddp.bucket_buffers = watch_buckets(ddp, dp_mesh.get_group())
        return ddp
    from torch.distributed.fsdp import fully_shard

    reshard = zero == 3
    for j, layer in enumerate(stage):
        if j not in tied_layers and any(p.requires_grad for p in layer.parameters()):
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard)
    return stage


def watch_buckets(ddp: nn.Module, group: Any) -> dict[int, torch.Tensor]:
    """DDP's communication hook as torch's default one (average, all-reduce), keeping each bucket's buffer as
    DDP hands it over (returned, by bucket index), so that the memory tracker can count the buckets DDP
    allocated before it started."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffers: dict[int, torch.Tensor] = {}

    def keep_and_allreduce(state, bucket):  # no annotations: DDP checks them against its own types
        buffers[bucket.index()] = bucket.buffer()
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(group, keep_and_allreduce)
    return buffers


def ddp_buckets(module: nn.Module) -> list[torch.Tensor]:
    """The gradient buckets a DDP module handed to its all-reduce last (none for another module)."""
    return list(getattr(module, "bucket_buffers", {}).values())


def make_layout_optimizer(name: str, params: Iterable[nn.Parameter], lr: float, zero: int, dp: int,
                          dp_group: Any = None) -> torch.optim.Optimizer | None:
    """torch's optimizer ``name`` (:func:`~workbench.runtime.training.make_optimizer`); for ``zero`` 1 with
    ``dp`` > 1 the same class and settings inside torch's ``ZeroRedundancyOptimizer`` over ``dp_group`` (over
    the local shards of tensor-parallel parameters: :class:`LocalShards`)."""
    from workbench.runtime.training import make_optimizer

    params = list({id(p): p for p in params}.values())
    opt = make_optimizer(name, params, lr)
    if opt is None or zero != 1 or dp == 1:
        return opt
    from torch.distributed.optim import ZeroRedundancyOptimizer

    settings = {k: v for k, v in opt.defaults.items() if k not in ("differentiable",)}
    if not any(hasattr(p, "to_local") for p in params):
        return ZeroRedundancyOptimizer(params, optimizer_class=type(opt), process_group=dp_group, **settings)
    shards = LocalShards(params)
    return shards.wrap(ZeroRedundancyOptimizer(shards.local, optimizer_class=type(opt), process_group=dp_group,
                                               **settings))


class LocalShards:
    """Plain parameters over the local shards of ``DTensor`` parameters (the same storage), so that torch's
    ``ZeroRedundancyOptimizer`` shards the optimizer state of a tensor-parallel rank's shards over its ``dp``
    group, as Megatron's distributed optimizer does within each tensor-parallel rank; before each step the
    gradients' local shards are handed to the plain parameters."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = list(params)
        self.local = [nn.Parameter(local_tensor(p.data)) if hasattr(p, "to_local") else p for p in self.params]

    def sync_grads(self) -> None:
        for p, q in zip(self.params, self.local):
            if q is not p:
                q.grad = None if p.grad is None else local_tensor(p.grad.redistribute(p.device_mesh, p.placements)
                                                                  if hasattr(p.grad, "redistribute") else p.grad)

    def wrap(self, opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
        step = opt.step

        def stepped(*args: Any, **kwargs: Any) -> Any:
            self.sync_grads()
            return step(*args, **kwargs)

        opt.step = stepped  # type: ignore[method-assign]
        return opt


def local_optimizer(opt: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
    """The optimizer that holds this rank's state: ``ZeroRedundancyOptimizer``'s local one, or ``opt``."""
    return getattr(opt, "optim", opt)


def is_fsdp(module: nn.Module) -> bool:
    """Whether FSDP2 manages ``module`` (``fully_shard`` made it an ``FSDPModule``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def zero_grads(params: Sequence[nn.Parameter], loop: str) -> None:
    """Between steps, as ``loop`` says (``none``: set to None, torch's default; ``zeros``: in place)."""
    in_place = loop == "zeros"
    for p in params:
        if p.grad is None:
            continue
        if in_place:
            p.grad.zero_()
        else:
            p.grad = None


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s shard on this rank (FSDP2, tensor parallelism), or ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t
