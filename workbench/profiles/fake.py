"""Fake-tensor profiles: a model of any size profiled for a named GPU without the GPU and without its memory.

Under torch's ``FakeTensorMode`` a tensor has a shape, a dtype and a storage of known size, and no
values: building Llama-3-70B allocates nothing, and every operation of a training step still
dispatches, producing fake results of the right shapes. :func:`fake_profile` builds the model and
its batch inside the mode and runs the profiler (:func:`workbench.profiles.profiler.profile_model`)
there, unchanged but for the times:

* the **memory columns** are measured by the same allocator-level mechanism as a real profile
  (:func:`workbench.profiles.memtrace.layer_memory`: every new storage counted from its creation
  until it is freed) and ``saved_bytes`` by the same saved-tensor hooks, so a fake profile's memory
  columns are a real CPU profile's (``benchmarks/fake_profile.py`` compares them layer by layer);
  the operations are those torch's CPU kernels choose (attention: the CPU flash kernel);
* the **times** are estimates (:mod:`workbench.profiles.roofline`, :mod:`workbench.profiles.kernel_time`):
  each operation's FLOPs and bytes priced on the accelerator (:mod:`workbench.model.accelerators`) at
  published GEMM and attention throughput, calibrated on measured H100 profiles and one measured training
  run. The profile's metadata says so (``timing``, ``times: estimated``) and stores the operations
  (``work``): :func:`for_gpu` and :mod:`workbench.profiles.retime` estimate the times again for another
  GPU from them.

The profile records ``device: cuda (<the GPU>; ...)``: the memory model then prices the optimizer
step as torch runs it on a GPU (``foreach``). ``module.to(dtype)`` fails under fake tensors, so a
model is built in its dtype by setting torch's default dtype (``--dtype`` does so for zoo models;
a ``--module`` function should build with ``torch.set_default_dtype`` set, as ``examples/`` do).

A model whose forward needs values (``.item()``, a data-dependent shape such as ``nonzero``) cannot
run on fake tensors: :class:`FakeProfileError` names the operation and suggests a real profile.

Hugging Face models read the position ids they make (``arange``) to detect sequences packed into
one row, and, when the ids are fake and cannot be read, build a full attention mask where a real run
of the same batch builds none (SDPA's ``is_causal`` then does the masking). A fake profile assumes
one sequence per row, as a real run of the example batch finds (:func:`unpacked_sequences`: the detection
runs, its temporaries allocated as in a real run, and its answer is dropped); an
attention mask the batch passes is still built, as in a real run of a padded batch. Initial values do
not exist either: torch's ``trunc_normal_`` (ViTs, timm models) resamples until no value is out of
range, a test of values; while a fake model is built it draws once and clamps (:func:`value_free_init`).

>>> chain = fake_zoo("tiny-gpt", 2, "h100-sxm")
>>> chain.meta["times"], chain.meta["device"].startswith("cuda"), len(chain)
('estimated', True, 4)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from workbench.model.accelerators import Accelerator, accelerator
from workbench.model.chain import Chain
from workbench.profiles.roofline import H100_CALIBRATION, Calibration, RooflineTimes, gpu_meta

__all__ = ["FakeProfileError", "fake_profile", "fake_zoo", "fake_module", "kernels_meta", "default_dtype",
           "unpacked_sequences", "value_free_init", "for_gpu", "gpu_meta"]


class FakeProfileError(ValueError):
    """The model needs tensor values somewhere (an operation fake tensors cannot run)."""


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """torch's default dtype set to ``dtype`` inside (None: unchanged), restored after.

    >>> with default_dtype(torch.bfloat16):
    ...     torch.nn.Linear(2, 2).weight.dtype
    torch.bfloat16
    >>> torch.get_default_dtype()
    torch.float32
    """
    old = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """Inside, Hugging Face's packed-sequence detection finds no packing in fake position ids (the module
    docstring); real ones it reads as usual. Nothing changes when transformers is not imported.

    >>> with unpacked_sequences():
    ...     pass
    """
    import sys

    from torch._subclasses.fake_tensor import is_fake

    mu = sys.modules.get("transformers.masking_utils")
    find = getattr(mu, "find_packed_sequence_indices", None)
    if find is None:
        yield
        return

    def unpacked(position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        found = find(position_ids, *args, **kwargs)      # its temporaries, as a real run allocates them
        return None if is_fake(position_ids) else found

    mu.find_packed_sequence_indices = unpacked
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = find


@contextlib.contextmanager
def value_free_init() -> Iterator[None]:
    """Inside, ``torch.nn.init.trunc_normal_`` draws a normal sample and clamps it (no test of the values it
    drew, which fake tensors cannot answer); outside, torch's own. For building a fake model only.

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> with FakeTensorMode(), value_free_init():
    ...     torch.nn.init.trunc_normal_(torch.empty(3, 4), std=0.02).shape
    torch.Size([3, 4])
    """
    init = torch.nn.init
    original = getattr(init, "_no_grad_trunc_normal_", None)
    if original is None:           # another torch: nothing to replace
        yield
        return

    def clamped(tensor: torch.Tensor, mean: float, std: float, a: float, b: float, generator: Any = None) -> Any:
        with torch.no_grad():
            return tensor.normal_(mean, std, generator=generator).clamp_(min=a, max=b)

    init._no_grad_trunc_normal_ = clamped
    try:
        yield
    finally:
        init._no_grad_trunc_normal_ = original


def _needs_values(e: Exception) -> FakeProfileError | None:
    """The one-line error for an operation fake tensors cannot run (None if ``e`` is not one)."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    if not isinstance(e, (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)):
        return None
    op = str(getattr(e, "func", "") or (e.args[0] if e.args else type(e).__name__))
    why = {"DataDependentOutputException": "needs a tensor's value (.item(), a Python bool or int of a tensor)",
           "DynamicOutputShapeException": "has an output shape that depends on the values (nonzero, masked_select, "
                                          "unique...)",
           "UnsupportedOperatorException": "has no fake-tensor implementation"}[type(e).__name__]
    return FakeProfileError(f"the model cannot run on fake tensors: operation {op} {why}; profile it for real "
                            "(without --fake) instead")


def for_gpu(chain: Chain, times: RooflineTimes | None, gpu: str | Accelerator) -> Chain:
    """The fake profile ``chain`` with its times estimated for another ``gpu`` from the same work (``times``,
    :func:`fake_profile`'s ``return_work``, or None: the operations the profile stores): one fake run serves
    every GPU (the memory columns do not depend on it).

    >>> chain, times = fake_zoo("tiny-gpt", 2, "h100-sxm", return_work=True)
    >>> slow = for_gpu(chain, times, "a100-40gb")
    >>> slow.meta["gpu"], slow.total_compute > chain.total_compute, slow[1].saved_bytes == chain[1].saved_bytes
    ('a100-40gb', True, True)
    >>> for_gpu(chain, None, "a100-40gb").total_compute == slow.total_compute
    True
    """

    from workbench.profiles.retime import retimed
    from workbench.profiles.roofline import estimate

    acc = gpu if isinstance(gpu, Accelerator) else accelerator(gpu)
    if times is None:
        return retimed(chain, acc)
    layers = tuple(dataclasses.replace(l, forward=estimate(w.forward, acc, times.calibration),
                                       backward=estimate(w.backward, acc, times.calibration, backward=True))
                   for l, w in zip(chain.layers, times.works))
    return dataclasses.replace(chain, layers=layers, meta={**chain.meta, **gpu_meta(acc, times.calibration)})


def fake_profile(build: Callable[[], tuple[Any, Any, Any, Callable]], gpu: str | Accelerator, *,
                 calibration: Calibration = H100_CALIBRATION, meta: Mapping[str, Any] | None = None,
                 progress: bool = False, return_work: bool = False, split_at: tuple[str, ...] = (),
                 kernels: str = "eager") -> Chain | tuple[Chain, RooflineTimes]:
    """Profile ``build()``'s ``(model, example_inputs, example_targets, loss_fn)`` under fake tensors for
    ``gpu`` (see the module docstring). ``build`` runs inside the fake mode: nothing it creates is
    allocated. ``return_work``: also the :class:`~workbench.profiles.roofline.RooflineTimes` with every
    layer's work (for calibration). ``split_at``: module names to cut the model before (``--split-at``).
    ``kernels``: ``eager`` (Hugging Face's kernels as they dispatch) or ``fused`` (:mod:`workbench.profiles.fused`;
    the metadata then records ``kernels: fused``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.profiles.fused import check_kernels, fused_kernels
    from workbench.profiles.profiler import profile_model

    acc = gpu if isinstance(gpu, Accelerator) else accelerator(gpu)
    times = RooflineTimes(acc, calibration)
    info = {**gpu_meta(acc, calibration), "threads": "n/a", "source": "workbench fake profiler",
            "memory_columns": "allocator-level under FakeTensorMode: workbench.profiles.memtrace.AllocationTracker "
                              "(storages counted, nothing allocated; operations as torch's CPU kernels choose them)",
            **kernels_meta(check_kernels(kernels)), **(meta or {})}
    try:
        with FakeTensorMode():
            with value_free_init():
                model, inputs, targets, loss = build()
            with unpacked_sequences(), fused_kernels(model, kernels):
                chain = profile_model(model, inputs, "cpu", warmup=0, repeats=1, meta=info, progress=progress,
                                      threads=None, loss=loss, target=targets, times=times, split_at=split_at)
    except Exception as e:  # noqa: BLE001 - only the fake-tensor failures are translated
        err = _needs_values(e)
        if err is None:
            raise
        raise err from None
    assert isinstance(chain, Chain)
    if len(times.works) == len(chain.layers):      # the operations, to estimate the times again for another GPU
        from workbench.profiles.retime import encode_works

        chain = dataclasses.replace(chain, meta={**chain.meta, "work": encode_works(times.works)})
    return (chain, times) if return_work else chain


def kernels_meta(kernels: str) -> dict[str, str]:
    """The metadata a profile of ``kernels`` records: nothing for ``eager`` (a profile without the key is eager),
    else ``kernels`` and what was fused.

    >>> kernels_meta("eager"), sorted(kernels_meta("fused"))
    ({}, ['kernels', 'kernels_fused'])
    """
    if kernels == "eager":
        return {}
    return {"kernels": kernels,
            "kernels_fused": "norms, gated MLP (act(gate) * up) or activation, rotary embedding, cross-entropy: one "
                             "kernel each (workbench.profiles.fused); attention at the fused kernel's rate "
                             "(workbench.profiles.kernel_time, attention_fused)"}


def fake_zoo(name: str, batch_size: int, gpu: str | Accelerator, *, dtype: str | torch.dtype | None = None,
             seed: int = 0, calibration: Calibration = H100_CALIBRATION, progress: bool = False,
             return_work: bool = False, kernels: str = "eager", **model_kwargs: Any
             ) -> Chain | tuple[Chain, RooflineTimes]:
    """A zoo model (:mod:`workbench.profiles.zoo`) profiled fake for ``gpu``, built in ``dtype`` (default
    float32) with its loss in the last layer, as :func:`~workbench.profiles.profiler.profile_zoo` profiles it."""
    from workbench.profiles import zoo

    dt = zoo.as_dtype(dtype)
    cfg = zoo.model_config(name, **model_kwargs)

    def build() -> tuple[Any, Any, Any, Callable]:
        with default_dtype(dt):
            model = zoo.build_model(name, seed=seed, **model_kwargs)
        x, y = zoo.sample_batch(name, batch_size, seed=seed, dtype=dt, **model_kwargs)
        return model, x, y, zoo.loss_fn(name)

    meta = {"network": name, "model": name, "model_config": json.dumps(cfg, separators=(",", ":"))}
    return fake_profile(build, gpu, calibration=calibration, meta=meta, progress=progress, return_work=return_work,
                        kernels=kernels)


def fake_module(spec: str, gpu: str | Accelerator, *, seed: int = 0, calibration: Calibration = H100_CALIBRATION,
                progress: bool = False, split_at: tuple[str, ...] = (), batch_size: int | None = None,
                kernels: str = "eager") -> Chain:
    """``--module FILE.py:FUNC`` profiled fake for ``gpu``: ``FUNC()`` (``FUNC(batch_size=...)`` when given) runs
    inside the fake mode (the metadata records ``module``, so ``run --profile`` finds the model again), cut before
    ``split_at``."""
    from workbench.profiles.usermodel import load_user_model, parse_spec

    def build() -> tuple[Any, Any, Any, Callable]:
        um = load_user_model(spec, seed, **({} if batch_size is None else {"batch_size": batch_size}))
        for note in um.notes if progress else ():
            print(f"note: {note}", flush=True)
        return um.model, um.inputs, um.targets, um.loss

    path, func = parse_spec(spec)
    meta = {"network": f"{Path(path).stem}:{func}", "module": spec}
    chain = fake_profile(build, gpu, calibration=calibration, meta=meta, progress=progress, split_at=split_at,
                         kernels=kernels)
    assert isinstance(chain, Chain)
    return chain
