"""What every rank does whichever engine runs its program: its layers, optimizer, clock and memory probe.

A rank (one process per device of the plan) builds the whole model from the
workload (same seed everywhere, so the copies agree), finds its layers
(:meth:`~workbench.runtime.engine.Workload.layers`), keeps those of its own
stages (:class:`RankModel`), learns every layer's output shape with a dry
forward, and then lets an engine run the program: torch's pipeline engine
(:mod:`~workbench.runtime.torch_engine`) or the PipeDream fallback
(:mod:`~workbench.runtime.pipedream`). Both use the pieces here:

* :func:`make_optimizer`: ``none``, ``sgd``, ``momentum`` (0.9), ``adam`` or
  ``adamw``, a real ``torch.optim`` optimizer, by default with a learning rate
  of 0 (gradients stay comparable with one process; the optimizer still
  allocates its state and runs its step). Gradient buffers stay allocated
  between steps (``zero_grad(set_to_none=False)``);
* :class:`Recorder`: the start and end of every operation (``time.perf_counter``
  from a common origin, CUDA events on a GPU) and the CPU time its thread spent in each (``time.thread_time``,
  rows of ``CPU_COLUMNS``);
* :class:`MemoryProbe`: the allocator-level memory of the rank, not the
  profiler's saved-tensor count: on CPU ``torch.distributed._tools.mem_tracker.MemTracker``
  (parameters, buffers, gradients, activations, temporaries, optimizer state,
  other), on a GPU ``torch.cuda.memory_allocated`` / ``max_memory_allocated``.

>>> make_optimizer("momentum", [torch.nn.Parameter(torch.zeros(2))]).defaults["momentum"]
0.9
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from workbench.runtime.policy_layers import with_policy
from workbench.runtime.training import OPTIMIZERS, make_optimizer

__all__ = ["OPTIMIZERS", "make_optimizer", "RankModel", "Recorder", "MemoryProbe", "layer_output_shapes",
           "chain_input", "shared_origin", "CPU_COLUMNS"]

#: a run's CPU times, one row per operation: the rank's thread's CPU seconds in it (``cpu``) and its thread CPU
#: clock when it started (``cpu_start``), so that the CPU time between two operations is known too
CPU_COLUMNS = ["device", "stage", "kind", "batch", "cpu", "cpu_start"]

def chain_input(inputs: Any) -> torch.Tensor:
    """The tensor that enters a chain: the inputs themselves, or their first tensor.

    >>> chain_input({"ids": torch.zeros(2), "mask": torch.ones(2)}).tolist()
    [0.0, 0.0]
    """
    if isinstance(inputs, torch.Tensor):
        return inputs
    import torch.utils._pytree as pytree

    leaves = [l for l in pytree.tree_leaves(inputs) if isinstance(l, torch.Tensor)]
    if not leaves:
        raise ValueError("the inputs hold no tensor")
    return leaves[0]


def layer_output_shapes(modules: Sequence[nn.Module], x0: torch.Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every layer's output: a dry forward on the meta device (no arithmetic, no
    memory), or on the CPU in eval mode without autograd where a layer cannot run on meta tensors.

    >>> layer_output_shapes([nn.Linear(3, 5), nn.ReLU()], torch.zeros(2, 3))
    [((2, 5), torch.float32), ((2, 5), torch.float32)]
    """
    import copy
    import warnings

    for where in ("meta", "cpu"):
        shapes: list[tuple[tuple[int, ...], torch.dtype]] = []
        try:
            with torch.no_grad():
                h = x0.to(where)
                for m in modules:
                    with warnings.catch_warnings():   # torch's pytree warns when a recorded call is copied
                        warnings.simplefilter("ignore", FutureWarning)
                        mm = copy.deepcopy(m).to(where) if where == "meta" else m
                    was_training = mm.training
                    mm.eval()
                    h = mm(h)
                    mm.train(was_training)
                    shapes.append((tuple(h.shape), h.dtype))
            return shapes
        except (NotImplementedError, RuntimeError, TypeError, ValueError):
            if where == "cpu":
                raise
    raise AssertionError("unreachable")


@dataclass
class RankModel:
    """A rank's share of the model: per own stage an ``nn.Sequential`` of its layers, on ``device``.

    ``names[s]`` maps the stage module's parameter names to the model's (for gradients), ``shapes``
    the output (shape, dtype) of every layer of the whole chain, ``loss`` the last layer's loss,
    ``offload_stages`` the own stages holding a layer whose activations are offloaded (both engines
    run those under :class:`~workbench.runtime.policy_layers.StageOffloads`).
    """

    stages: dict[int, nn.Sequential]
    names: dict[int, dict[str, str]]
    shapes: list[tuple[tuple[int, ...], torch.dtype]]
    loss: Any
    tied: tuple
    layer_names: tuple[str, ...]
    offload_stages: frozenset[int] = frozenset()

    @classmethod
    def build(cls, plan, workload, rank: int, device: torch.device) -> "RankModel":
        return cls.from_layers(plan, workload.layers(), chain_input(workload.batch(0)[0]), rank, device)

    @classmethod
    def from_layers(cls, plan, layers, x0: torch.Tensor, rank: int, device: torch.device, *,
                    modules: Sequence[nn.Module] | None = None, loss: Any = None,
                    shapes: list[tuple[tuple[int, ...], torch.dtype]] | None = None) -> "RankModel":
        """The stages of ``rank`` from a model's discovered ``layers``; ``modules``, ``loss`` and ``shapes``
        replace the layers' own where a transform changed them (tensor parallelism: the same parameters,
        sharded, in wrappers that pass local tensors), parameters keeping the model's names."""
        if len(layers) != len(plan.assignment):
            raise ValueError(f"the model has {len(layers)} layers, the plan {len(plan.assignment)}")
        modules = list(modules if modules is not None else layers.modules)
        shapes = shapes if shapes is not None else layer_output_shapes(modules, x0)
        stages: dict[int, nn.Sequential] = {}
        names: dict[int, dict[str, str]] = {}
        policies = tuple(getattr(plan, "activations", ()) or ()) or ("keep",) * len(plan.assignment)
        for s, st in enumerate(plan.stages):
            if st.device != rank:
                continue
            # each layer with its activation policy (docs/model.md, "Activation policies"): recompute and
            # offload wrap it; a parameter keeps the model's name whatever wraps it (found by identity)
            full = {id(p): layers.parameter_names[l][n] for l in range(st.first, st.last + 1)
                    for n, p in layers.modules[l].named_parameters()}
            mods = [with_policy(modules[l].to(device), policies[l]) for l in range(st.first, st.last + 1)]
            seq = nn.Sequential(*mods).train()
            stages[s] = seq
            names[s] = {n: full[id(p)] for n, p in seq.named_parameters()}
        offload = frozenset(s for s in stages if "offload" in policies[plan.stages[s].first:plan.stages[s].last + 1])
        return cls(stages, names, shapes, loss if loss is not None else layers.loss, layers.tied, layers.names,
                   offload)

    def parameters(self, s: int) -> dict[str, nn.Parameter]:
        return dict(self.stages[s].named_parameters())


class Recorder:
    """Operation marks on a common clock: ``perf_counter`` on CPU, CUDA events on a GPU.

    ``origin`` is the same instant on every rank (rank 0's ``perf_counter``, broadcast), so the
    times of the ranks of one machine share one axis; ``rows()`` gives them in the trace's format.
    ``cpu`` holds a row of :data:`CPU_COLUMNS` per operation: the calling thread's CPU time in it and the
    thread's CPU clock at its start.

    >>> rec = Recorder(0, cuda=False)
    >>> with rec.op("F", 0, 3):
    ...     _ = sum(range(1000))
    >>> [(m[0], m[2]) for m in rec.marks], [(c[2], c[3], c[4] >= 0, c[5] > 0) for c in rec.cpu]
    ([('F', 3)], [('F', 3, True, True)])
    """

    def __init__(self, rank: int, cuda: bool, origin: float | None = None) -> None:
        self.rank, self.cuda = rank, cuda
        self.marks: list[tuple[str, int, int, Any, Any]] = []
        self.cpu: list[tuple[int, int, str, int, float, float]] = []
        if cuda:
            self.base = torch.cuda.Event(enable_timing=True)
            self.base.record()
        self._base_perf = time.perf_counter()   # CLOCK_MONOTONIC: one axis for the processes of a machine
        self.origin = self._base_perf if origin is None else origin

    def restart(self, origin: float) -> None:
        """Forget every mark (the warm-up's) and measure from ``origin`` (:func:`shared_origin`)."""
        self.origin = origin
        self.marks.clear()
        self.cpu.clear()

    def now(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def seconds(self, mark: Any) -> float:
        if self.cuda:
            return self.base.elapsed_time(mark) / 1e3 + (self._base_perf - self.origin)
        return mark - self.origin

    @contextmanager
    def op(self, kind: str, stage: int, batch: int) -> Iterator[None]:
        c0 = time.thread_time()
        t0 = self.now()
        yield
        t1 = self.now()
        self.marks.append((kind, stage, batch, t0, t1))
        self.cpu.append((self.rank, stage, kind, batch, time.thread_time() - c0, c0))

    def add(self, kind: str, stage: int, batch: int, t0: Any, t1: Any, cpu: tuple[float, float] | None = None) -> None:
        """A mark timed by the caller; ``cpu``: (the thread's CPU seconds in it, its CPU clock at the start)."""
        self.marks.append((kind, stage, batch, t0, t1))
        if cpu is not None:
            self.cpu.append((self.rank, stage, kind, batch, *cpu))

    def rows(self, plan) -> list[tuple]:
        out = []
        for kind, s, i, a, b in self.marks:
            st = plan.stages[s]
            out.append((self.rank, s, st.first, st.last, kind, i, self.seconds(a), self.seconds(b)))
        return out


def shared_origin(origin: float, backend: str, device: torch.device) -> float:
    """Rank 0's ``origin`` on every rank, after a barrier: the one clock origin of a run (both engines)."""
    t = torch.tensor([origin], dtype=torch.float64)
    if backend == "nccl":
        t = t.to(device)
    dist.barrier()
    dist.broadcast(t, src=0)
    return float(t.item())


_RESIDENT = ("Parameter", "Buffer", "Gradient", "Optstate")


class _NoModules:
    """Stands for MemTracker's module tracker: no module hooks, never in a backward."""

    is_bw = False
    parents = {"Global"}

    def register_user_hooks(self, *hooks: Any) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def __enter__(self) -> "_NoModules":
        return self

    def __exit__(self, *args: Any) -> None:
        pass


class MemoryProbe:
    """The rank's allocator-level memory (see the module docstring); ``None`` outside :meth:`tracking`.

    On CPU, ``tracking(*state)`` runs ``MemTracker`` with ``track_external(*state)`` (the stage
    modules with their gradients, the optimizer, receive buffers); :meth:`sample` returns
    (activations, resident state, total) now, :meth:`peak` the peak total and :meth:`breakdown`
    its parts (``Parameter``, ``Buffer``, ``Gradient``, ``Activation`` (everything made by the
    forwards and backwards, temporaries included), ``Optstate``, ``Other`` (the receive buffers)).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.tracker: Any = None

    @contextmanager
    def tracking(self, *state: Any) -> Iterator["MemoryProbe"]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield self
            torch.cuda.synchronize(self.device)
            return
        from torch.distributed._tools.mem_tracker import MemTracker

        self.tracker = MemTracker()
        # storages only: MemTracker's module tracker would attribute memory to modules, which the ranks
        # do not need, and it misfiles weights swapped in by torch.func.functional_call as parameters
        # and refuses torch.autograd.grad; without it, temporaries of a backward count as activations
        self.tracker._mod_tracker = _NoModules()
        self.tracker.track_external(*[s for s in state if s is not None])
        del state        # MemTracker keeps weak references: holding them here would keep alive what torch frees
        with self.tracker:
            yield self

    def _snap(self, kind: str) -> dict[str, int]:
        snap = self.tracker.get_tracker_snapshot(kind).get(self.device, {})
        return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}

    def sample(self) -> tuple[float, float, float]:
        if self.cuda:
            total = float(torch.cuda.memory_allocated(self.device))
            return total, 0.0, total
        snap = self._snap("current")
        resident = float(sum(snap.get(k, 0) for k in _RESIDENT))
        total = float(snap.get("Total", 0))
        return total - resident, resident, total

    def peak(self) -> float:
        if self.cuda:
            return float(torch.cuda.max_memory_allocated(self.device))
        return float(self._snap("peak").get("Total", 0)) if self.tracker is not None else 0.0

    def breakdown(self) -> dict[str, int]:
        """The parts of the peak (CPU: MemTracker's categories; GPU: only ``Total``)."""
        if self.cuda:
            return {"Total": int(self.peak())}
        if self.tracker is None:
            return {}
        return {k: v for k, v in self._snap("peak").items() if k != "Temp"}   # no module tracker: no Temp
