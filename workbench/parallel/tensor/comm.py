"""The collectives a layer issues, and their bytes: torch's ``CommDebugMode``, which counts them, plus sizes.

:class:`CollectiveBytes` is torch's ``CommDebugMode`` (``torch.distributed.tensor.debug``: a dispatch mode
that lets a ``DTensor`` desugar an operation into its local operations and collectives, then counts the
collectives) recording, for each collective, whether it ran in the forward or in the backward (autograd's
graph task, :func:`torch._C._current_graph_task_id`), its kind and the bytes of the tensor it moves, in the
convention of :mod:`workbench.parallel.collectives` (and nccl-tests'): an all-reduce's tensor, an
all-gather's gathered output, a reduce-scatter's input before it is split, an all-to-all's input. Under a
fake process group nothing is sent, and the shapes, hence the bytes, are those a real group moves.
:class:`PairedCollectives` also finds the matmuls each collective can overlap (tensor parallelism's
communication overlap, :mod:`~workbench.parallel.tensor.overlap`).

>>> import torch
>>> from workbench.parallel.tensor.mesh import tp_mesh
>>> from torch.distributed.tensor import DTensor, Partial, Replicate
>>> with tp_mesh(2) as mesh, CollectiveBytes() as comm:
...     y = DTensor.from_local(torch.ones(4, 8), mesh, (Partial(),)).redistribute(mesh, (Replicate(),))
>>> comm.records, comm.get_total_counts()        # the count is CommDebugMode's own
([Collective(phase='forward', kind='all_reduce', nbytes=128)], 1)
>>> comm.total("forward"), comm.total("backward")
(128, 0)
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._pytree import tree_leaves

from workbench.profiles.local import local_bytes, on_meta, storage_keys

__all__ = ["Collective", "CollectiveBytes", "PairedCollectives", "PHASES", "summary", "waited_collectives"]

PHASES = ("forward", "backward")

#: operation name (any of torch's collective namespaces) -> the kind :mod:`workbench.parallel.collectives` prices
_KINDS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "all_to_all_single": "all_to_all", "alltoall_base_": "all_to_all", "alltoall_": "all_to_all",
}
_NAMESPACES = {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d"}


@dataclass(frozen=True)
class Collective:
    """One collective: ``phase`` (forward or backward), ``kind`` and the bytes of the tensor it moves."""

    phase: str
    kind: str
    nbytes: int


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _nbytes(kind: str, namespace: str, args: tuple, out: Any) -> int:
    """The collective's tensor bytes (module docstring). Functional collectives take the input first and return
    the output; torch's in-place ``c10d`` ones take the outputs first (the inputs second, but for an all-reduce)."""
    if namespace != "c10d":
        moved = out if kind == "all_gather" else args[:1]
    else:
        moved = args[:1] if kind in ("all_reduce", "all_gather") else args[1:2]
    return sum(local_bytes(t) for t in _tensors(moved))


class CollectiveBytes(CommDebugMode):
    """``CommDebugMode`` that also keeps every collective's phase, kind and bytes in :attr:`records`."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Collective] = []
        self._quiet = warnings.catch_warnings()

    def __enter__(self) -> "CollectiveBytes":
        self._quiet.__enter__()      # its module tracker's backward hooks warn on a layer whose input is data
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._quiet.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
            return out
        kind = _KINDS.get(func._overloadpacket.__name__) if func.namespace in _NAMESPACES else None
        if kind is not None:
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            self.records.append(Collective(phase, kind, _nbytes(kind, func.namespace, args, out)))
        return out

    def take(self) -> list[Collective]:
        """The records since the last call, cleared."""
        out, self.records = self.records, []
        return out

    def total(self, phase: str) -> int:
        """Bytes of every collective recorded in ``phase``."""
        return sum(c.nbytes for c in self.records if c.phase == phase)


#: matmul operations and the position of the operand a gathered tensor must be (the rows of A in A @ B)
_MATMULS = {"mm": 0, "bmm": 0, "addmm": 1, "baddbmm": 1}


class PairedCollectives(CollectiveBytes):
    """:class:`CollectiveBytes` that also finds, for each collective, the matmuls it can overlap
    (:attr:`pairs`, aligned with :attr:`records`: per phase, the indices of the phase's matmuls in the order they
    run, :attr:`matmuls` counting them), as Transformer Engine's userbuffers and torch's async TP pair them:

    * an **all-gather** with the matmuls whose A operand (its rows) is the gathered tensor, or a view or copy of
      it (TE's ``qkv_fprop``/``fc1_fprop`` and ``proj_dgrad``/``fc2_dgrad``; torch's ``fused_all_gather_matmul``);
    * a **reduce-scatter** with the matmuls whose results it reduces (through views, sums and copies: TE's
      ``proj_fprop``/``fc2_fprop``, torch's ``fused_matmul_reduce_scatter``; the backward's, whose input is the
      sum of the input-gradient matmuls of q, k, v or gate, up);
    * an all-reduce with none (TE overlaps only sequence parallelism's pair).

    A matmul is paired with one collective at most (the first). Operations on ``meta`` tensors (a DTensor's shape
    probes) are not counted, as the work counter does not count them."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[int, ...]] = []
        self.matmuls = {"forward": 0, "backward": 0}
        self._gathered: dict[tuple, int] = {}          # storage -> the all-gather record it holds
        self._made_by: dict[tuple, frozenset] = {}     # storage -> the (phase, matmul) whose results it holds
        self._taken: set[tuple[str, int]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        before = len(self.records)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
            return out
        outs = _tensors(out)
        if len(self.records) > before:
            self._pair(self.records[-1], func.namespace, args, out)
        elif outs and not any(on_meta(t) for t in outs):
            self._follow(func, args, kwargs or {}, outs)
        return out

    def _keys(self, tensors: Iterable[torch.Tensor]) -> list[tuple]:
        return [k for t in tensors for k in storage_keys(t)]

    def _pair(self, record: Collective, namespace: str, args: tuple, out: Any) -> None:
        index, pairs = len(self.records) - 1, ()
        if record.kind == "all_gather":
            for k in self._keys(_tensors(out if namespace != "c10d" else args[:1])):
                self._gathered[k] = index
        elif record.kind == "reduce_scatter":
            source = args[:1] if namespace != "c10d" else args[1:2]
            made = frozenset().union(*(self._made_by.get(k, frozenset()) for k in self._keys(_tensors(source))))
            pairs = tuple(sorted(m for phase, m in made if phase == record.phase and (phase, m) not in self._taken))
            self._taken.update((record.phase, m) for m in pairs)
        self.pairs.append(pairs)

    def _follow(self, func: Any, args: tuple, kwargs: dict, outs: list[torch.Tensor]) -> None:
        phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        name = func._overloadpacket.__name__
        out_keys = self._keys(outs)
        if name in _MATMULS and func.namespace == "aten":
            m = self.matmuls[phase]
            self.matmuls[phase] += 1
            a = args[_MATMULS[name]]
            rows = a.dim() >= 2 and a.stride(-1) == 1
            gathered = [self._gathered[k] for k in self._keys([a]) if k in self._gathered] if rows else []
            gathered = [g for g in gathered if self.records[g].phase == phase]
            if gathered and (phase, m) not in self._taken:
                self.pairs[gathered[0]] = self.pairs[gathered[0]] + (m,)
                self._taken.add((phase, m))
            for k in out_keys:
                self._gathered.pop(k, None)
                self._made_by[k] = frozenset({(phase, m)})
            return
        ins = self._keys(_tensors((args, kwargs)))
        gathered = next((self._gathered[k] for k in ins if k in self._gathered), None)
        made = frozenset().union(*(self._made_by.get(k, frozenset()) for k in ins))
        for k in out_keys:                 # a view or an in-place op writes its input's storage: it keeps both
            if gathered is not None:
                self._gathered[k] = gathered
            elif k not in ins:
                self._gathered.pop(k, None)
            self._made_by[k] = made | (self._made_by.get(k, frozenset()) if k in ins else frozenset())


def summary(records: Iterable[Collective]) -> str:
    """``'forward: 2 all_reduce (256 B); backward: 2 all_reduce (256 B)'`` (phases with none left out).

    >>> summary([Collective("forward", "all_reduce", 128), Collective("forward", "all_reduce", 128)])
    'forward: 2 all_reduce (256 B)'
    """
    parts = []
    records = list(records)
    for phase in PHASES:
        counts = Counter(c.kind for c in records if c.phase == phase)
        sizes: Counter[str] = Counter()
        for c in records:
            if c.phase == phase:
                sizes[c.kind] += c.nbytes
        if counts:
            parts.append(f"{phase}: " + ", ".join(f"{n} {k} ({sizes[k]} B)" for k, n in counts.items()))
    return "; ".join(parts)


def _held_elsewhere(t: torch.Tensor) -> bool:
    """Whether something besides the caller holds ``t`` or its storage (a collective's work object, on its
    thread): the tensor's own references, and the storage's (``t`` and the storage object asked for here)."""
    return t._use_count() > 1 or torch._C._storage_Use_Count(t.untyped_storage()._cdata) > 2


@contextlib.contextmanager
def waited_collectives(settle: float = 0.5) -> Iterator[None]:
    """Inside, every functional collective is waited for where it is issued, as torch does under fake tensors
    (and when compiling), and its buffer is held by the caller alone when the next operation starts. Eager
    torch hands back an ``AsyncCollectiveTensor`` that waits at its first use, and one never used (a layer's
    input gradient dropped by the profiler) keeps its buffer until the process ends; and gloo's worker thread
    drops its own reference to a finished collective's tensor a moment after the wait returns, so when the
    caller frees it would race with the ranks' threads. Here the wait also lets that reference go (at most
    ``settle`` seconds): the memory a rank measures is then the program's, not the threads' timing."""
    import time

    import torch.distributed._functional_collectives as funcol
    from torch._subclasses.fake_tensor import is_fake

    wrap, wait = funcol._maybe_wrap_tensor, funcol.wait_tensor

    def waited(t: torch.Tensor) -> torch.Tensor:
        out = wait(t)
        if not is_fake(out):
            deadline = time.monotonic() + settle
            while _held_elsewhere(out) and time.monotonic() < deadline:
                time.sleep(0)
        return out

    funcol._maybe_wrap_tensor = funcol.wait_tensor = waited     # the backwards of its autograd ones wait too
    try:
        yield
    finally:
        funcol._maybe_wrap_tensor, funcol.wait_tensor = wrap, wait
