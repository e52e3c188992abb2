"""A tensor-parallel layer's times: the roofline of its local operations plus its collectives on the link.

:class:`TensorParallelTimes` is the profiler's timing step (``profile_model(times=...)``) for a sharded
layer on one rank. It records the layer's work as :class:`~workbench.profiles.roofline.RooflineTimes` does
(every operation the rank runs on its shards: a ``DTensor`` operation is counted as the local operations it
runs, :mod:`workbench.profiles.local`; the collectives are not HBM kernels and are left out of the
roofline) and the collectives it issues, with :class:`~workbench.parallel.tensor.comm.CollectiveBytes`. Each
collective is priced as a ring over the ``tp`` ranks (:func:`workbench.parallel.collectives.ring_seconds`)
on the link a tensor-parallel group crosses: it stays inside a node, so the GPU's NVLink
(:attr:`~workbench.model.accelerators.Accelerator.link_bandwidth`). Megatron's all-reduces (and, under
sequence parallelism, its all-gathers and reduce-scatters) sit on the critical path: the next operation
needs their result, so they are added to the layer's forward and backward times, not overlapped
(docs/model.md, "Tensor parallelism"). For the layouts that overlap them (``tpo=1``,
:mod:`~workbench.parallel.tensor.overlap`) it also keeps, per layer and phase, the collectives' seconds and what
they add when each overlaps the matmuls :class:`~workbench.parallel.tensor.comm.PairedCollectives` pairs it with
(those matmuls' kernel seconds, :func:`workbench.profiles.kernel_time.kernel_seconds`): :attr:`overlap`.

Before a layer is measured, its measurements run once unrecorded (:func:`warm_up`): a ``DTensor`` propagates
the shapes of an operation it has not met yet (in that context: dispatch modes, saved-tensor hooks) with a
fake run at the global shapes, whose tensors would otherwise count as the layer's work and memory; after one
run they are cached, so a layer built like one already warmed (the same modules, shapes and placements: the
next decoder block) is not warmed again.

>>> from workbench.model.accelerators import accelerator
>>> t = TensorParallelTimes(accelerator("h100-sxm"), tp=8)
>>> round(t.collective_seconds([Collective("forward", "all_reduce", 32 * 2**20)]) * 1e6, 1)  # 2*7/8*32 MiB
130.5
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from workbench.model.accelerators import Accelerator
from workbench.parallel.collectives import ring_seconds
from workbench.parallel.tensor.comm import Collective, CollectiveBytes, PairedCollectives
from workbench.parallel.tensor.overlap import exposed_seconds, sms_of
from workbench.profiles.kernel_time import KINDS, kernel_seconds
from workbench.profiles.roofline import H100_CALIBRATION, Calibration, OpWork, RooflineTimes, estimate, layer_work

__all__ = ["TensorParallelTimes", "warm_up"]


def warm_up(mod: nn.Module, x: torch.Tensor, needs_input_grad: bool,
            then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None) -> None:
    """Run the measurements that follow once, unrecorded (module docstring): the memory columns'
    (:func:`~workbench.profiles.memtrace.layer_memory`) and the work's, under the same dispatch modes and
    saved-tensor hooks (a ``DTensor`` caches an operation's shapes per such context)."""
    from workbench.profiles.memtrace import layer_memory

    layer_memory(mod, x, input_requires_grad=needs_input_grad, then=then)
    with CollectiveBytes():
        layer_work(mod, x, needs_input_grad, then, grad)


def _structure(mod: nn.Module, x: torch.Tensor, needs_input_grad: bool, then: Any) -> tuple:
    """What a layer's operations' shapes depend on: its modules' classes, its parameters' and buffers' shapes,
    dtypes and placements, its input's shape and dtype, and how it is run."""
    tensors = [*mod.parameters(), *mod.buffers()]
    return (tuple(type(m).__name__ for m in mod.modules()),
            tuple((tuple(t.shape), t.dtype, str(getattr(t, "placements", ""))) for t in tensors),
            tuple(x.shape), x.dtype, needs_input_grad, then is not None)


class TensorParallelTimes(RooflineTimes):
    """Per layer: the roofline of its local work plus its collectives over ``tp`` ranks at ``bandwidth``
    (default: the GPU's NVLink, one way) with ``latency`` seconds per ring step; every layer's collectives
    are kept in :attr:`collectives` (module docstring)."""

    def __init__(self, gpu: Accelerator, tp: int, calibration: Calibration = H100_CALIBRATION, *,
                 bandwidth: float | None = None, latency: float = 0.0) -> None:
        super().__init__(gpu, calibration)
        self.tp = int(tp)
        self.bandwidth = float(bandwidth if bandwidth is not None else gpu.link_bandwidth)
        self.latency = float(latency)
        self.collectives: list[list[Collective]] = []
        #: per layer: (comm forward, comm backward, exposed forward, exposed backward) seconds (module docstring)
        self.overlap: list[tuple[float, float, float, float]] = []
        self._warm: set[tuple] = set()

    def collective_seconds(self, records: list[Collective]) -> float:
        """Seconds of ``records`` one after the other, each a ring over the ``tp`` ranks."""
        return sum(ring_seconds(c.kind, c.nbytes, ranks=self.tp, bandwidth=self.bandwidth, latency=self.latency)
                   for c in records)

    def __call__(self, mod: nn.Module, x: torch.Tensor, timer: Any, needs_input_grad: bool,
                 then: Callable[[torch.Tensor], torch.Tensor] | None, grad: torch.Tensor | None, warmup: int,
                 repeats: int) -> tuple[list[float], list[float]]:
        key = _structure(mod, x, needs_input_grad, then)
        if key not in self._warm:          # a block like one already run finds its shapes cached
            warm_up(mod, x, needs_input_grad, then, grad)
            self._warm.add(key)
        with PairedCollectives() as comm:
            work = layer_work(mod, x, needs_input_grad, then, grad)
        pairs, records = comm.pairs, comm.take()
        self.works.append(work)
        self.collectives.append(records)
        forward = [c for c in records if c.phase == "forward"]
        backward = [c for c in records if c.phase == "backward"]
        self.overlap.append(self._overlap(records, pairs, work.forward, work.backward, comm.matmuls))
        backward_work = estimate(work.backward, self.gpu, self.calibration, backward=True)
        return ([estimate(work.forward, self.gpu, self.calibration) + self.collective_seconds(forward)],
                [backward_work + self.collective_seconds(backward)])

    def _overlap(self, records: list[Collective], pairs: list[tuple[int, ...]], forward: OpWork, backward: OpWork,
                 matmuls: dict[str, int]) -> tuple[float, float, float, float]:
        """(comm forward, comm backward, exposed forward, exposed backward) seconds of one layer (module
        docstring): each collective's ring and its paired matmuls' kernel seconds."""
        gemms = {"forward": self._matmul_seconds(forward, False, matmuls["forward"]),
                 "backward": self._matmul_seconds(backward, True, matmuls["backward"])}
        rows = [(c.phase, c.kind, self.collective_seconds([c]), float(sum(gemms[c.phase][m] for m in p)))
                for c, p in zip(records, pairs)]
        sms = sms_of(self.gpu.name) if rows else 0
        out = []
        for phase in ("forward", "backward"):
            mine = [r for r in rows if r[0] == phase]
            out.append((sum(r[2] for r in mine), exposed_seconds(mine, self.tp, sms) if mine else 0.0))
        return out[0][0], out[1][0], out[0][1], out[1][1]

    def _matmul_seconds(self, work: OpWork, backward: bool, seen: int) -> list[float]:
        """The kernel seconds of a phase's matmuls in the order they run (as many as the pairing counted)."""
        mm = work.kind == KINDS.index("matmul")
        if int(mm.sum()) != seen:
            raise RuntimeError(f"tensor-parallel overlap: the work counter has {int(mm.sum())} matmuls in a "
                               f"{'backward' if backward else 'forward'}, the collectives' pairing {seen}")
        seconds = kernel_seconds(work.kind, work.precision, work.flops, work.bytes, work.aligned, self.gpu,
                                 self.calibration, backward)
        return [float(x) for x in seconds[mm]]

    def describe(self) -> str:
        return (super().describe() + f"; plus each tensor-parallel collective as a ring over {self.tp} ranks at "
                f"{self.bandwidth / 1e9:.0f} GB/s one way ({self.gpu.link}), latency {self.latency * 1e6:g} us per "
                "step, on the critical path (not overlapped; with tpo=1 overlapped with their GEMMs as Transformer "
                "Engine's userbuffers do: workbench.parallel.tensor.overlap)")
