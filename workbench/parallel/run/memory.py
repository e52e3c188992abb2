"""A layout rank's memory, measured by torch's trackers, independently of any prediction.

Each rank runs one step under ``torch.distributed._tools``' ``MemTracker`` (DDP, ZeRO-1, no data
parallelism) or ``FSDPMemTracker`` (FSDP2, ``zero`` 2 and 3), which see every storage the step creates
and the state registered before it (parameters, gradients, optimizer state, the pipeline's receive
buffers and the step's batch), and keep the peak of their sum and its parts. On a GPU the CUDA
allocator's ``max_memory_allocated`` is the peak instead.

:meth:`RankMemory.collectives` names the buffers of collectives the rank held at its peak: FSDP2's
all-gather outputs and reduce-scatter inputs (``FSDPMemTracker``'s own categories), DDP's gradient buckets
(with ``gradient_as_bucket_view=True`` they are the gradients themselves, so their bytes are the
gradients'), and the pipeline's receive buffers (torch preallocates one per micro-batch and keeps them).

>>> breakdown = {"Sharded Param": 10, "All Gather": 4, "Reduce Scatter": 0, "Total": 14}
>>> collective_buffers(breakdown, receive_bytes=8, bucket_bytes=0)
{'all_gather': 4, 'reduce_scatter': 0, 'pipeline_receive': 8}
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import nn

__all__ = ["RankMemory", "collective_buffers", "tensor_bytes"]


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors`` (a storage shared by two views counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return int(sum(seen.values()))


def collective_buffers(breakdown: dict[str, int], *, receive_bytes: int, bucket_bytes: int) -> dict[str, int]:
    """The collectives' buffers in a peak's ``breakdown`` (FSDP2's categories) plus those measured beside it:
    the pipeline's receive buffers and DDP's buckets (omitted where zero)."""
    out: dict[str, int] = {}
    if "All Gather" in breakdown or "Reduce Scatter" in breakdown:
        out["all_gather"] = int(breakdown.get("All Gather", 0))
        out["reduce_scatter"] = int(breakdown.get("Reduce Scatter", 0))
    if bucket_bytes:
        out["ddp_buckets"] = int(bucket_bytes)
    if receive_bytes:
        out["pipeline_receive"] = int(receive_bytes)
    return out


def _named_no_modules() -> Any:
    from workbench.runtime.rank import _NoModules

    class NamedNoModules(_NoModules):
        """No module hooks (as the pipeline runtime's probe: they refuse the split backward's
        ``autograd.grad``); a name for each FSDP2 module, which ``FSDPMemTracker`` asks for."""

        def get_known_fqn(self, mod: nn.Module) -> str:
            return f"{type(mod).__name__}@{id(mod):x}"

    return NamedNoModules()


class _Roots:
    """Several FSDP2 roots (a rank's stages) seen as one by ``FSDPMemTracker``, which walks one root."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.roots = list(modules)

    def modules(self) -> Iterator[nn.Module]:
        for m in self.roots:
            yield from m.modules()

    def buffers(self) -> Iterator[torch.Tensor]:
        for m in self.roots:
            yield from m.buffers()


def _pipeline_fsdp_tracker() -> type:
    """``FSDPMemTracker`` for a pipeline stage, which runs its module's forward once per micro-batch: torch's
    tracker takes a root's second forward for a second iteration and refuses it, so each forward starts the
    module's own statistics afresh (the rank's peak and its parts, which are what is read, are kept)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class PipelineFSDPMemTracker(FSDPMemTracker):
        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def again(*args: Any, **kwargs: Any) -> Any:
                self.memory_tracking.pop(fsdp_mod, None)
                return inner(*args, **kwargs)

            return again

    return PipelineFSDPMemTracker


class RankMemory:
    """The peak of one step of a rank and its parts (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.tracker: Any = None
        self._peak = 0.0

    @contextmanager
    def tracking(self, modules: Sequence[nn.Module], optimizer: Any, resident: Sequence[torch.Tensor],
                 fsdp: bool) -> Iterator["RankMemory"]:
        """Track the step run inside: ``modules`` (the stages, wrapped or not), ``optimizer`` (this rank's
        state), ``resident`` tensors made before (receive buffers, the step's batch)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield self
            torch.cuda.synchronize(self.device)
            self._peak = float(torch.cuda.max_memory_allocated(self.device))
            return
        if fsdp:
            from torch.distributed.fsdp import FSDPModule

            roots = [m for m in modules if isinstance(m, FSDPModule)]      # a stage without parameters is not one
            self.tracker = _pipeline_fsdp_tracker()(roots[0], optimizer)
            self.tracker._root_mod = _Roots(roots)
            self.tracker._mod_tracker = _named_no_modules()   # storages only: its hooks refuse autograd.grad
            self.tracker.track_inputs(tuple(resident))
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            from workbench.runtime.rank import _NoModules

            self.tracker = MemTracker()
            self.tracker._mod_tracker = _NoModules()     # storages only (see workbench.runtime.rank.MemoryProbe)
            self.tracker.track_external(*modules, *([optimizer] if optimizer is not None else []), *resident)
        del resident       # the trackers keep weak references: holding them here would keep alive what torch frees
        with self.tracker:
            yield self
        self._peak = float(self.breakdown().get("Total", 0))

    def peak(self) -> float:
        """The peak bytes of the tracked step."""
        return self._peak

    def breakdown(self) -> dict[str, int]:
        """The parts of the peak, by the tracker's category names (GPU: only ``Total``)."""
        if self.tracker is None:
            return {"Total": int(self._peak)}
        snap = self.tracker.get_tracker_snapshot("peak").get(self.device, {})
        return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
