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

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any, Mapping

from workbench.model.accelerators import Accelerator, accelerator
from workbench.model.chain import Chain
from workbench.parallel.tensor.plan import plan_model
from workbench.parallel.tensor.sharded import Build, build_of, first_tensor, profile_sharded, tp_meta
from workbench.parallel.tensor.times import TensorParallelTimes
from workbench.profiles.roofline import H100_CALIBRATION, Calibration

__all__ = ["tensor_parallel_profile", "fake_tensor_parallel", "describe_meta"]

def fake_tensor_parallel(build: Build, gpu: str | Accelerator, tp: int, *, sequence_parallel: bool = False,
                         loss_parallel: bool = False, calibration: Calibration = H100_CALIBRATION,
                         meta: Mapping[str, Any] | None = None, progress: bool = False, kernels: str = "eager"
                         ) -> Chain:
    """Rank 0's profile of ``build()``'s model sharded over a fake group of ``tp`` ranks (module docstring), with
    ``kernels`` (``eager``, or ``fused``: :mod:`workbench.profiles.fused`, run on the ranks' ``DTensor``\\ s)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.parallel.tensor.mesh import tp_mesh
    from workbench.profiles.fake import _needs_values, kernels_meta, unpacked_sequences, value_free_init
    from workbench.profiles.fused import check_kernels, fused_kernels

    acc = gpu if isinstance(gpu, Accelerator) else accelerator(gpu)
    times = TensorParallelTimes(acc, tp, calibration)
    info = {**tp_meta(acc, times, 0), **kernels_meta(check_kernels(kernels)), **(meta or {})}
    try:
        with tp_mesh(tp) as mesh, FakeTensorMode():
            with value_free_init():
                model, inputs, targets, loss = build()
            ids = first_tensor(inputs)
            plan = plan_model(model, tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                              sequence=int(ids.shape[1]) if ids is not None and ids.dim() > 1 else None)
            with unpacked_sequences(), fused_kernels(model, kernels):
                return profile_sharded(model, inputs, targets, loss, mesh, plan, times, info, progress)
    except Exception as e:  # noqa: BLE001 - only the fake-tensor failures are translated
        err = _needs_values(e)
        if err is None:
            raise
        raise err from None


def _network(spec_or_build: str | Build) -> str:
    """The profile's network name: ``FILE:FUNC`` of a spec (the file's stem), a build function's name."""
    if isinstance(spec_or_build, str):
        from workbench.profiles.usermodel import parse_spec

        path, func = parse_spec(spec_or_build)
        return f"{Path(path).stem}:{func}"
    return str(getattr(spec_or_build, "__name__", "model"))


def _key(spec_or_build: str | Build, gpu: str, tp: int, sequence_parallel: bool, loss_parallel: bool,
         micro_batch_size: int | None, kernels: str = "eager") -> dict[str, Any] | None:
    """The cache key: the module file's digest and the function (a spec), or the function's module file and
    name (a callable); None when the function's source cannot be found (not cached). ``kernels`` enters it when
    not ``eager`` (an eager profile's key is as before)."""
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
            "micro_batch_size": micro_batch_size, **({} if kernels == "eager" else {"kernels": kernels})}


def tensor_parallel_profile(spec_or_build: str | Build, gpu: str, tp: int, *, sequence_parallel: bool = False,
                            loss_parallel: bool = False, fake: bool = True, micro_batch_size: int | None = None,
                            cache: bool | str | Path = True, progress: bool = False, seed: int = 0,
                            kernels: str = "eager") -> Chain:
    """Rank 0's chain of ``spec_or_build`` (``"FILE.py:FUNC"`` or a build function) over ``tp`` ranks for
    ``gpu`` (module docstring). ``cache``: True for the default folder, a folder, or False. ``kernels``:
    ``eager`` or ``fused`` (:mod:`workbench.profiles.fused`; fake profiles only)."""
    from workbench.profiles.fused import check_kernels

    if check_kernels(kernels) != "eager" and not fake:
        raise ValueError(f"kernels {kernels!r}: fused kernels are priced under fake tensors only (fake=True)")
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

            chain = fake_profile(build, acc, meta=meta, progress=progress, kernels=kernels)
            assert isinstance(chain, Chain)
            return dataclasses.replace(chain, meta={**chain.meta, "tp": "1", "tp_rank": "0"})
        return fake_tensor_parallel(build, acc, tp, sequence_parallel=sequence_parallel,
                                    loss_parallel=loss_parallel, meta=meta, progress=progress, kernels=kernels)

    key = (_key(spec_or_build, acc.name, tp, sequence_parallel, loss_parallel, micro_batch_size, kernels) if fake
           else None)
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
