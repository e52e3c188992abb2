"""One rank's profile under tensor parallelism: the sharded layers measured, not the whole ones divided.

:func:`tensor_parallel_profile` builds the model under fake tensors, shards it over a fake process group of
``tp`` ranks with torch's own API (:mod:`~workbench.parallel.tensor.plan`, :mod:`~workbench.parallel.tensor.shard`)
and runs the profiler (:func:`workbench.profiles.profiler.profile_model`) on rank 0's chain, unchanged:

* every **memory column** is measured as in any profile, by the same allocator-level tracker and saved-tensor
  hooks, on what the rank holds (a ``DTensor`` counts its local shard, :mod:`workbench.profiles.local`): the
  sharded weights and gradients, the activations of the local heads and MLP columns, the buffers the
  collectives allocate;
* every **collective** a layer issues in its forward and in its backward is counted by torch's
  ``CommDebugMode`` (:mod:`~workbench.parallel.tensor.comm`): its bytes are the layer's ``comm_forward_bytes``
  and ``comm_backward_bytes`` (docs/model.md, "Tensor parallelism"), the kinds and counts in the metadata's
  ``tp_collectives``;
* **times**: the roofline of the local operations plus each collective as a ring on the GPU's NVLink, on the
  critical path (:mod:`~workbench.parallel.tensor.times`).

Every rank holds the same shapes, since ``tp`` must divide every size it splits (a model it does not divide
is refused naming them), so rank 0's chain is every rank's; the metadata says so (``tp``, ``tp_rank``).
``tp=1`` is the plain fake profile. ``fake=False`` measures the same on ``tp`` gloo ranks of this machine
(:mod:`~workbench.parallel.tensor.real`). Results are cached by content (:mod:`workbench.profiles.cache`): the
module file's bytes, the function, ``tp``, the options, the GPU and the micro-batch size.

>>> from workbench.parallel.tensor.tiny import tiny_llama
>>> chain = tensor_parallel_profile(tiny_llama, "h100-sxm", 2, cache=False)
>>> chain.meta["tp"], chain[1].comm_forward_bytes == 2 * 2 * 16 * 64 * 4   # 2 all-reduces of b x s x h fp32
('2', True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from torch import nn

from workbench.model.accelerators import Accelerator, accelerator
from workbench.model.chain import Chain
from workbench.parallel.tensor.boundaries import local_chain
from workbench.parallel.tensor.comm import summary, waited_collectives
from workbench.parallel.tensor.plan import TensorPlan, plan_model
from workbench.parallel.tensor.shard import shard_model
from workbench.parallel.tensor.times import TensorParallelTimes
from workbench.profiles.roofline import H100_CALIBRATION, Calibration

__all__ = ["tensor_parallel_profile", "profile_sharded", "fake_tensor_parallel", "Build", "build_of", "first_tensor",
           "with_collectives", "describe_meta"]

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


def with_collectives(chain: Chain, times: TensorParallelTimes) -> Chain:
    """``chain`` with each layer's collective bytes (forward, backward) and their summary in the metadata."""
    layers = []
    for layer, records in zip(chain.layers, times.collectives):
        layers.append(dataclasses.replace(
            layer, comm_forward_bytes=float(sum(c.nbytes for c in records if c.phase == "forward")),
            comm_backward_bytes=float(sum(c.nbytes for c in records if c.phase == "backward"))))
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
    with _loss_parallel(plan.loss_parallel), waited_collectives():
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


def _tp_meta(acc: Accelerator, times: TensorParallelTimes, rank: int) -> dict[str, str]:
    return {"device": f"cuda ({acc.label}; fake tensors on this machine)", "gpu": acc.name, "times": "estimated",
            "timing": times.describe(), "tp_rank": f"{rank} (every rank holds the same shapes: tp divides every "
                                                  "size it splits)",
            "threads": "n/a", "source": "workbench fake profiler, tensor parallel",
            "memory_columns": "allocator-level under FakeTensorMode, per rank: workbench.profiles.memtrace."
                              "AllocationTracker on the rank's local shards (a DTensor counts its local tensor)"}


def fake_tensor_parallel(build: Build, gpu: str | Accelerator, tp: int, *, sequence_parallel: bool = False,
                         loss_parallel: bool = False, calibration: Calibration = H100_CALIBRATION,
                         meta: Mapping[str, Any] | None = None, progress: bool = False) -> Chain:
    """Rank 0's profile of ``build()``'s model sharded over a fake group of ``tp`` ranks (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.parallel.tensor.mesh import tp_mesh
    from workbench.profiles.fake import _needs_values, unpacked_sequences, value_free_init

    acc = gpu if isinstance(gpu, Accelerator) else accelerator(gpu)
    times = TensorParallelTimes(acc, tp, calibration)
    info = {**_tp_meta(acc, times, 0), **(meta or {})}
    try:
        with tp_mesh(tp) as mesh, FakeTensorMode():
            with value_free_init():
                model, inputs, targets, loss = build()
            ids = first_tensor(inputs)
            plan = plan_model(model, tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                              sequence=int(ids.shape[1]) if ids is not None and ids.dim() > 1 else None)
            with unpacked_sequences():
                return profile_sharded(model, inputs, targets, loss, mesh, plan, times, info, progress)
    except Exception as e:  # noqa: BLE001 - only the fake-tensor failures are translated
        err = _needs_values(e)
        if err is None:
            raise
        raise err from None


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


def _network(spec_or_build: str | Build) -> str:
    """The profile's network name: ``FILE:FUNC`` of a spec (the file's stem), a build function's name."""
    if isinstance(spec_or_build, str):
        from workbench.profiles.usermodel import parse_spec

        path, func = parse_spec(spec_or_build)
        return f"{Path(path).stem}:{func}"
    return str(getattr(spec_or_build, "__name__", "model"))


def _key(spec_or_build: str | Build, gpu: str, tp: int, sequence_parallel: bool, loss_parallel: bool,
         micro_batch_size: int | None) -> dict[str, Any] | None:
    """The cache key: the module file's digest and the function (a spec), or the function's module file and
    name (a callable); None when the function's source cannot be found (not cached)."""
    from workbench.experiments.provenance import file_digest

    if isinstance(spec_or_build, str):
        from workbench.profiles.usermodel import parse_spec

        path, func = parse_spec(spec_or_build)
    else:
        try:
            path, func = inspect.getsourcefile(spec_or_build) or "", spec_or_build.__qualname__
        except TypeError:
            return None
    if not path or not Path(path).is_file():
        return None
    return {"kind": "tensor-parallel fake profile", "module_sha256": file_digest(path), "function": func, "tp": tp,
            "sequence_parallel": sequence_parallel, "loss_parallel": loss_parallel, "gpu": gpu,
            "micro_batch_size": micro_batch_size}


def tensor_parallel_profile(spec_or_build: str | Build, gpu: str, tp: int, *, sequence_parallel: bool = False,
                            loss_parallel: bool = False, fake: bool = True, micro_batch_size: int | None = None,
                            cache: bool | str | Path = True, progress: bool = False, seed: int = 0) -> Chain:
    """Rank 0's chain of ``spec_or_build`` (``"FILE.py:FUNC"`` or a build function) over ``tp`` ranks for
    ``gpu`` (module docstring). ``cache``: True for the default folder, a folder, or False."""
    acc = accelerator(gpu)
    build = build_of(spec_or_build, micro_batch_size, seed)
    meta = {"network": _network(spec_or_build), **({"module": spec_or_build} if isinstance(spec_or_build, str)
                                                    else {})}

    def compute() -> Chain:
        if not fake:
            from workbench.parallel.tensor.real import gloo_tensor_parallel

            return gloo_tensor_parallel(spec_or_build, acc, tp, sequence_parallel=sequence_parallel,
                                        loss_parallel=loss_parallel, micro_batch_size=micro_batch_size,
                                        seed=seed)[0]
        if tp == 1 and not (sequence_parallel or loss_parallel):
            from workbench.profiles.fake import fake_profile

            chain = fake_profile(build, acc, meta=meta, progress=progress)
            assert isinstance(chain, Chain)
            return dataclasses.replace(chain, meta={**chain.meta, "tp": "1", "tp_rank": "0"})
        return fake_tensor_parallel(build, acc, tp, sequence_parallel=sequence_parallel,
                                    loss_parallel=loss_parallel, meta=meta, progress=progress)

    key = _key(spec_or_build, acc.name, tp, sequence_parallel, loss_parallel, micro_batch_size) if fake else None
    if cache is False or key is None:
        return compute()
    from workbench.profiles.cache import cached_profile

    folder = None if cache is True else Path(cache)
    return cached_profile(key, compute, folder)[0]


def describe_meta(chain: Chain) -> str:
    """One line of what a tensor-parallel profile holds (for the command line)."""
    m = chain.meta
    return (f"tp={m.get('tp')}, rank {str(m.get('tp_rank', '0')).split()[0]}; {m.get('tp_plan', '')}; collectives: "
            f"{m.get('tp_collectives', 'none')}; "
            + json.dumps({k: m[k] for k in ("sequence_parallel", "loss_parallel") if k in m}))
