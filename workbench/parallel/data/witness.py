"""The data-parallel memory witness: torch's own trackers around real DDP and FSDP2 steps of one rank of a world.

:func:`rank_peak` builds nothing of the workbench's memory model: it takes a ``build()`` function (a
``--module`` builder: ``(model, inputs, targets, loss_fn)``), wraps the model as torch's data parallelism
runs it for the ZeRO level (:data:`workbench.model.memory_zero.TORCH_MAPPING`) on a **fake process group**
of ``dp`` ranks (``torch.testing._internal.distributed.fake_pg``: collectives return at once, every rank's
buffers are allocated as on a real group), runs ordinary training steps (``zero_grad()`` setting the gradients to
None, ``micro_batches`` backwards, the optimizer step) and returns the peak bytes of rank 0 that torch's tracker
saw: ``FSDPMemTracker`` for FSDP2, ``MemTracker`` for DDP. One step runs first, untracked (the steady state).

* zero 2 and 3: every layer of the chain the workbench's profiler finds (``fsdp_units``) is one ``fully_shard``
  unit and the root another, with FSDP2's one-layer prefetch set explicitly
  (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``): on a GPU the CPU runs ahead and
  issues the next all-gather while a layer computes, on this CPU only an explicit prefetch does. Under
  ``fake=True`` everything runs under ``FakeTensorMode`` (nothing is allocated: any model size), with one sequence
  per row as a fake profile assumes (:func:`workbench.profiles.fake.unpacked_sequences`).
  ``bf16-mixed``: the model is built in fp32 and ``MixedPrecisionPolicy(param_dtype=bfloat16)`` computes in bf16.
* zero 0 and 1: ``DistributedDataParallel`` (with a no-op communication hook: the fake group's all-reduce
  future carries no tensor) and, for 1, ``ZeroRedundancyOptimizer``; DDP does not run on fake tensors (its
  reducer reads tensor data), so these run for real, small models only. The tracker is entered before DDP is
  built, so that it sees DDP's buckets.

>>> import torch
>>> def build():
...     model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
...     x = torch.randn(4, 64)
...     return model, x, x, torch.nn.functional.mse_loss
>>> rank_peak(build, dp=2, zero=0, optimizer="sgd") > 2 * 2 * 64 * 65 * 4     # parameters, gradients, buckets
True
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch

__all__ = ["rank_peak", "fake_world", "fsdp_units"]

Build = Callable[[], tuple[Any, Any, Any, Callable]]


@contextlib.contextmanager
def fake_world(dp: int) -> Iterator[Any]:
    """A fake process group of ``dp`` ranks, this process rank 0, and its one-dimensional CPU device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; the witness needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp)
    try:
        yield init_device_mesh("cpu", (dp,))
    finally:
        dist.destroy_process_group()


def fsdp_units(model: torch.nn.Module, x: Any) -> list[torch.nn.Module]:
    """The modules the workbench's profiler finds as the chain's layers, in order (each an FSDP unit): a layer
    of several modules (``a+b``) is its modules, each wrapped."""
    from workbench.profiles.discover import discover_layers

    found = discover_layers(model, x)
    named = dict(model.named_modules())
    units = []
    for layer in found.names:
        for name in str(layer).split("+"):
            if name in named and any(p.requires_grad for p in named[name].parameters()):
                units.append(named[name])
    return units


def _shard(model: torch.nn.Module, units: Sequence[torch.nn.Module], mesh: Any, zero: int, mixed: bool) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if mixed else MixedPrecisionPolicy()
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=zero == 3, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=zero == 3, mp_policy=policy)
    for a, b in zip(units, units[1:]):
        a.set_modules_to_forward_prefetch([b])
        b.set_modules_to_backward_prefetch([a])


def _replicate(model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    net = DistributedDataParallel(model)

    def no_op(state, bucket):  # noqa: ANN001, ANN202 - DDP reads the annotations of a hook: none here
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    net.register_comm_hook(None, no_op)
    return net


def _optimizer(params: list, name: str, zero: int) -> torch.optim.Optimizer:
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]
    if zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=0.0, foreach=True)
    return cls(params, lr=0.0, foreach=True)


def rank_peak(build: Build, *, dp: int, zero: int, optimizer: str = "adamw", micro_batches: int = 1,
              fake: bool = False, mixed: bool = False, steps: int = 2) -> int:
    """Peak bytes of rank 0 of ``dp`` ranks training ``build()``'s model under ZeRO ``zero`` (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.profiles.fake import default_dtype, unpacked_sequences, value_free_init

    if zero <= 1 and fake:
        raise ValueError("DDP (zero 0 and 1) does not run on fake tensors; use fake=False with a small model")
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with fake_world(dp) as mesh, mode, default_dtype(torch.float32 if mixed else None), value_free_init(), \
            unpacked_sequences():
        model, x, y, loss_fn = build()
        if zero >= 2:
            _shard(model, fsdp_units(model, x), mesh, zero, mixed)
            return _tracked(model, model, x, y, loss_fn, _optimizer(list(model.parameters()), optimizer, zero),
                            micro_batches, steps, fsdp=True)
        return _tracked_ddp(model, x, y, loss_fn, optimizer, zero, micro_batches, steps)


def _tracked_ddp(model: torch.nn.Module, x: Any, y: Any, loss_fn: Callable, optimizer: str, zero: int,
                 micro_batches: int, steps: int) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, x, y)
    with tracker:                       # DDP's buckets are made when it is built
        net = _replicate(model)
        opt = _optimizer(list(model.parameters()), optimizer, zero)
        for _ in range(steps + 1):
            _step(net, x, y, loss_fn, opt, micro_batches, tracker.reset_mod_stats)
    return _peak(tracker)


def _tracked(model: torch.nn.Module, net: torch.nn.Module, x: Any, y: Any, loss_fn: Callable,
             opt: torch.optim.Optimizer, micro_batches: int, steps: int, fsdp: bool) -> int:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    _step(net, x, y, loss_fn, opt, micro_batches)
    tracker = FSDPMemTracker(model, opt)
    tracker.track_inputs((x, y))
    with tracker:
        for _ in range(steps):
            _step(net, x, y, loss_fn, opt, micro_batches, tracker.reset_mod_stats)
    return _peak(tracker)


def _step(net: torch.nn.Module, x: Any, y: Any, loss_fn: Callable, opt: torch.optim.Optimizer,
          micro_batches: int, before_forward: Callable[[], None] | None = None) -> None:
    """One training step; ``before_forward`` runs before each micro-batch's forward (a tracker's
    ``reset_mod_stats``: MemTracker follows one call of each module at a time; the peak is kept)."""
    opt.zero_grad()
    for _ in range(micro_batches):
        if before_forward is not None:
            before_forward()
        loss_fn(net(x), y).backward()
    opt.step()


def _peak(tracker: Any) -> int:
    peaks = tracker.get_tracker_snapshot("peak")
    return int(max(d["Total"] for d in peaks.values()))
