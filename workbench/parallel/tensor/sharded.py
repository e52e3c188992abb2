"""The shared core of a rank's profile under tensor parallelism, fake or real: the model sharded by torch's API and
profiled on one rank (:func:`profile_sharded`), the build function of a ``FILE.py:FUNC`` spec (:func:`build_of`).
:mod:`~workbench.parallel.tensor.profile` runs it under fake tensors on a fake process group,
:mod:`~workbench.parallel.tensor.real` on gloo ranks with real tensors; both say what the profile means.

>>> import torch
>>> first_tensor({"input_ids": torch.zeros(2, 8), "labels": torch.ones(2, 8)}).shape
torch.Size([2, 8])
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from typing import Any, Callable, Iterator, Mapping

from torch import nn

from workbench.model.accelerators import Accelerator
from workbench.model.chain import Chain
from workbench.parallel.tensor.boundaries import local_chain
from workbench.parallel.tensor.comm import summary, waited_collectives
from workbench.parallel.tensor.plan import TensorPlan
from workbench.parallel.tensor.shard import shard_model
from workbench.parallel.tensor.times import TensorParallelTimes

__all__ = ["Build", "build_of", "first_tensor", "profile_sharded", "with_collectives", "tp_meta",
           "uncounted_propagation"]

#: a build function: () -> (model, example_inputs, example_targets, loss_fn), as ``--module FUNC`` returns
Build = Callable[..., tuple[Any, Any, Any, Callable]]


@contextlib.contextmanager
def _loss_parallel(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        yield


@contextlib.contextmanager
def uncounted_propagation() -> Iterator[None]:
    """DTensor's sharding propagation runs an operator on fake tensors of the global shapes to read its output's
    metadata. On a real rank it enters a fake mode of its own, above the memory tracker, which never sees those
    tensors; under the profile's fake mode it re-enters that mode, below the tracker, which counted them (the
    split loss's handlers, which propagate uncached: two whole logits in the head's forward peak, measured against
    gloo ranks). Inside this context propagation runs with the current modes set aside, as on a real rank (where a
    propagation cannot, it runs as torch runs it)."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def apart(self: Any, op_schema: Any) -> Any:
        try:
            with _disable_current_modes():
                return original(self, op_schema)
        except Exception:  # noqa: BLE001 - e.g. a fake tensor of the profile's mode among the arguments
            return original(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = apart
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


def with_collectives(chain: Chain, times: TensorParallelTimes) -> Chain:
    """``chain`` with each layer's collective bytes (forward, backward), their seconds overlapped or not
    (:attr:`TensorParallelTimes.overlap`) and their summary in the metadata."""
    from workbench.model.chain import OVERLAP_FIELDS

    layers = []
    for layer, records, seconds in zip(chain.layers, times.collectives, times.overlap, strict=True):
        layers.append(dataclasses.replace(
            layer, comm_forward_bytes=float(sum(c.nbytes for c in records if c.phase == "forward")),
            comm_backward_bytes=float(sum(c.nbytes for c in records if c.phase == "backward")),
            **dict(zip(OVERLAP_FIELDS, seconds))))
    every = [c for records in times.collectives for c in records]
    return dataclasses.replace(chain, layers=tuple(layers), meta={**chain.meta, "tp_collectives": summary(every)})


def first_tensor(inputs: Any) -> Any:
    """The example batch's first tensor (the token ids: its second dimension is the sequence)."""
    import torch.utils._pytree as pytree

    return next((t for t in pytree.tree_leaves(inputs) if hasattr(t, "shape")), None)


def profile_sharded(model: nn.Module, inputs: Any, targets: Any, loss: Callable | None, mesh: Any,
                    plan: TensorPlan, times: TensorParallelTimes, meta: Mapping[str, Any],
                    progress: bool = False) -> Chain:
    """``model``'s chain found (:func:`~workbench.profiles.discover.discover_layers`, on the whole model), then
    the model sharded by ``plan`` on ``mesh`` (the chain's layers share its modules, so they are sharded too)
    and the chain profiled on this rank with ``times`` (fake or real tensors alike: the same code measures
    both)."""
    from workbench.profiles.discover import discover_layers
    from workbench.profiles.profiler import profile_model

    found = discover_layers(model, inputs, loss, targets)      # whole: the chain's layers share its modules
    shard_model(model, mesh, plan)
    with _loss_parallel(plan.loss_parallel), waited_collectives(), uncounted_propagation():
        modules, chain_loss = local_chain(found.modules, found.input, mesh, found.loss)
        info = {**meta, "layers_found": found.how, "tp": plan.tp, "tp_plan": plan.describe(),
                "sequence_parallel": str(plan.sequence_parallel).lower(),
                "loss_parallel": str(plan.loss_parallel).lower()}
        chain = profile_model(modules, found.input, "cpu", names=found.names, warmup=0, repeats=1, meta=info,
                              progress=progress, threads=None, loss=chain_loss,
                              target=targets if chain_loss is not None else None, times=times)
    assert isinstance(chain, Chain)
    return with_collectives(_canonical_ties(chain, found), times)


def _canonical_ties(chain: Chain, found: Any) -> Chain:
    """The ``tied`` metadata naming each shared parameter as the model does (the chain profiled was a list)."""
    tied = json.loads(chain.meta.get("tied") or "[]")
    if not tied or len(tied) != len(found.tied):
        return chain
    for t, whole in zip(tied, found.tied):
        t["parameter"] = whole.parameter
    return dataclasses.replace(chain, meta={**chain.meta, "tied": json.dumps(tied, separators=(",", ":"))})


def tp_meta(acc: Accelerator, times: TensorParallelTimes, rank: int) -> dict[str, str]:
    return {"device": f"cuda ({acc.label}; fake tensors on this machine)", "gpu": acc.name, "times": "estimated",
            "timing": times.describe(), "tp_rank": f"{rank} (every rank holds the same shapes: tp divides every "
                                                  "size it splits)",
            "threads": "n/a", "source": "workbench fake profiler, tensor parallel",
            "memory_columns": "allocator-level under FakeTensorMode, per rank: workbench.profiles.memtrace."
                              "AllocationTracker on the rank's local shards (a DTensor counts its local tensor)"}


def build_of(spec_or_build: str | Build, micro_batch_size: int | None = None, seed: int = 0) -> Build:
    """The build function of a ``FILE.py:FUNC`` spec or a callable; with ``micro_batch_size`` it is called
    with ``batch_size=`` (refused, naming the function, when it takes no ``batch_size``)."""
    kwargs = {} if micro_batch_size is None else {"batch_size": int(micro_batch_size)}
    if isinstance(spec_or_build, str):
        from workbench.profiles.usermodel import load_user_model

        spec = spec_or_build

        def build() -> tuple[Any, Any, Any, Callable]:
            um = load_user_model(spec, seed, **kwargs)
            return um.model, um.inputs, um.targets, um.loss

        fn_name, fn = spec, None
    else:
        fn = spec_or_build
        fn_name = getattr(fn, "__qualname__", repr(fn))

        def build() -> tuple[Any, Any, Any, Callable]:
            import torch

            torch.manual_seed(seed)
            return fn(**kwargs)
    if kwargs and fn is not None and "batch_size" not in inspect.signature(fn).parameters:
        raise ValueError(f"micro-batch size {micro_batch_size}: {fn_name} takes no batch_size argument")
    return build
