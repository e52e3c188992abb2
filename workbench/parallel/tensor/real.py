"""The same per-rank profile on real ranks: ``tp`` processes of this machine, gloo, real CPU tensors.

:func:`gloo_tensor_parallel` spawns ``tp`` processes (``torch.multiprocessing``), each joining a gloo
process group; every rank builds the model with the same seed, shards it with the same plan and profiles its
chain with the same code as a fake profile (:func:`~workbench.parallel.tensor.profile.profile_sharded`): the
same allocator-level tracker, now on real tensors, while the collectives really run between the ranks. It
returns every rank's chain, so a fake profile can be checked against all of them (issue 37: every memory
column within 1 %; ``tests/test_tensor_parallel_real.py``, ``benchmarks/tensor_parallel.py``). The times are
the same estimates (the roofline on the GPU named), not the CPU's. A model ``tp`` does not divide is refused
before any rank starts (the plan is checked on a fake copy); a rank that fails stops them all, and the error
names it.

:func:`gloo_held_gradients` runs the sharded model's forward and backward once on the same gloo ranks and
returns what each rank's parameters hold in ``.grad`` (the local shard, its placements, the whole gradient
gathered), to check the profile's ``grad_bytes`` against the gradients held and the gradients against one
process (the vocabulary-parallel embedding's is held as its ``Shard(0)`` shard, as its weight).

>>> chains = gloo_tensor_parallel("tiny", "h100-sxm", 2)      # doctest: +SKIP
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.model.accelerators import Accelerator, accelerator
from workbench.model.chain import Chain

__all__ = ["gloo_tensor_parallel", "gloo_held_gradients", "HeldGradient", "check_plan"]


def check_plan(build: Any, tp: int, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Build the model under fake tensors (nothing allocated) and plan it: a ``ValueError`` naming the sizes
    ``tp`` does not divide, before any rank starts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.parallel.tensor.plan import plan_model
    from workbench.parallel.tensor.sharded import first_tensor
    from workbench.profiles.fake import value_free_init

    with FakeTensorMode(), value_free_init():
        model, inputs, _, _ = build()
        ids = first_tensor(inputs)
        plan_model(model, tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                   sequence=int(ids.shape[1]) if ids is not None and ids.dim() > 1 else None)


def _rank(rank: int, tp: int, init: str, source: Any, gpu: str, sequence_parallel: bool, loss_parallel: bool,
          micro_batch_size: int | None, seed: int, out: str) -> None:
    """One rank: join the gloo group, build, shard, profile, write ``out/rank{rank}.csv``."""
    import torch.distributed as dist

    from workbench.parallel.tensor.mesh import tp_mesh
    from workbench.parallel.tensor.plan import plan_model
    from workbench.parallel.tensor.sharded import build_of, first_tensor, profile_sharded
    from workbench.parallel.tensor.times import TensorParallelTimes
    from workbench.profiles.csvio import write_profile

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=tp)
    try:
        acc = accelerator(gpu)
        times = TensorParallelTimes(acc, tp)
        model, inputs, targets, loss = build_of(source, micro_batch_size, seed)()
        ids = first_tensor(inputs)
        plan = plan_model(model, tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                          sequence=int(ids.shape[1]) if ids is not None and ids.dim() > 1 else None)
        meta = {"device": "cpu (gloo ranks, real tensors)", "gpu": acc.name, "times": "estimated",
                "timing": times.describe(), "tp_rank": str(rank), "source": "workbench profiler, tensor parallel "
                "on gloo ranks", "memory_columns": "allocator-level on real CPU tensors, per rank: workbench."
                "profiles.memtrace.AllocationTracker on the rank's local shards"}
        with tp_mesh(tp) as mesh:
            chain = profile_sharded(model, inputs, targets, loss, mesh, plan, times, meta)
        write_profile(chain, Path(out) / f"rank{rank}.csv")
    finally:
        dist.destroy_process_group()


def gloo_tensor_parallel(source: Any, gpu: str | Accelerator, tp: int, *, sequence_parallel: bool = False,
                         loss_parallel: bool = False, micro_batch_size: int | None = None,
                         seed: int = 0) -> list[Chain]:
    """Every rank's chain of ``source`` (a ``FILE.py:FUNC`` spec or a picklable build function) sharded over
    ``tp`` gloo ranks (module docstring)."""
    import torch.multiprocessing as mp

    from workbench.parallel.tensor.sharded import build_of
    from workbench.profiles.csvio import read_profile

    acc = gpu if isinstance(gpu, Accelerator) else accelerator(gpu)
    check_plan(build_of(source, micro_batch_size, seed), tp, sequence_parallel, loss_parallel)
    with tempfile.TemporaryDirectory(prefix="workbench-tp-") as tmp:
        init = f"file://{Path(tmp) / 'rendezvous'}"
        mp.spawn(_rank, args=(tp, init, source, acc.name, sequence_parallel, loss_parallel, micro_batch_size, seed,
                              tmp), nprocs=tp, join=True)
        return [read_profile(Path(tmp) / f"rank{r}.csv") for r in range(tp)]


@dataclass(frozen=True)
class HeldGradient:
    """A parameter's ``.grad`` on one rank after one backward: its placements, local shard and whole value."""

    placements: tuple[str, ...]
    local: torch.Tensor
    whole: torch.Tensor


def _held_rank(rank: int, tp: int, init: str, source: Any, seed: int, out: str) -> None:
    """One rank: join the gloo group, build, shard, one forward and backward, save each ``.grad``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from workbench.parallel.tensor.mesh import tp_mesh
    from workbench.parallel.tensor.plan import plan_model
    from workbench.parallel.tensor.shard import shard_model
    from workbench.parallel.tensor.sharded import build_of

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=tp)
    try:
        model, inputs, targets, loss = build_of(source, None, seed)()
        with tp_mesh(tp) as mesh:
            shard_model(model, mesh, plan_model(model, tp))
            out_ = model(**inputs) if isinstance(inputs, dict) else model(inputs)
            loss(out_, targets).backward()
            held = {}
            for name, p in model.named_parameters():
                g = p.grad
                if isinstance(g, DTensor):
                    held[name] = (tuple(repr(x) for x in g.placements), g.to_local().clone(), g.full_tensor())
                elif g is not None:
                    held[name] = ((), g.clone(), g.clone())
        torch.save(held, Path(out) / f"held{rank}.pt")
        dist.barrier()                   # no rank leaves while another's gather is still in flight
    finally:
        dist.destroy_process_group()


def gloo_held_gradients(source: Any, tp: int, *, seed: int = 0) -> list[dict[str, HeldGradient]]:
    """Every rank's ``{parameter name: HeldGradient}`` after one forward and backward of ``source`` sharded
    over ``tp`` gloo ranks (module docstring); a parameter without a gradient is left out."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="workbench-tp-") as tmp:
        init = f"file://{Path(tmp) / 'rendezvous'}"
        mp.spawn(_held_rank, args=(tp, init, source, seed, tmp), nprocs=tp, join=True)
        return [{n: HeldGradient(*v) for n, v in torch.load(Path(tmp) / f"held{r}.pt").items()} for r in range(tp)]
