"""Sequence-parallel collectives as Megatron-Core runs them: on sequence-first activations, no reorder copy.

Megatron-Core keeps a decoder's activations sequence-first, ``[s, b, h]`` (its embedding transposes
``[b s h] -> [s b h]`` once, "to avoid explicit transposes": ``megatron/core/models/common/embeddings/
language_model_embedding.py``; ``transformer_block.py``: ``hidden_states: [s, b, h]``), so sequence parallelism
splits dimension 0 and its collectives read and write their buffers as they are:
``megatron/core/tensor_parallel/mappings.py``, ``_gather_along_first_dim`` (``all_gather_into_tensor`` into
one new ``[s, b, h]`` buffer, returned as it is) and ``_reduce_scatter_along_first_dim``
(``reduce_scatter_tensor`` of the input itself into the ``[s / tp, b, h]`` output); Transformer Engine's
userbuffers overlap does the same.

Hugging Face's models are batch-first, ``[b, s, h]``: torch's sequence parallelism shards dimension 1, and its
functional collectives (``torch.distributed._functional_collectives``, which ``DTensor`` redistributes with)
work on dimension 0 and reorder around it. ``all_gather_single(x, gather_dim=1)`` gathers ``[tp b, s / tp, h]``
and then copies it into ``[b, s, h]`` (``torch._utils._maybe_view_chunk_cat``: ``torch.cat(torch.chunk(res,
tp, 0), dim=1)``, a view only when ``b = 1``); ``reduce_scatter_single(x, scatter_dim=1)`` first copies its input
into ``[tp b, s / tp, h]`` (``_chunk_or_narrow_cat``). Each copy reads and writes ``b s h`` elements and
allocates a second full-size buffer beside the collective's.

Inside :func:`sequence_first_collectives` (entered by :func:`workbench.profiles.fused.fused_kernels`, which
models the Megatron-Core + Transformer Engine stack), a gather or scatter along dimension 1 of a tensor of 3
or more dimensions (the sequence of a ``[b, s, ...]`` activation) runs the collective along dimension 0 as
before (the same bytes, recorded by torch's ``CommDebugMode`` as before) and the reorder with the profiler
suspended (:func:`workbench.profiles.recording.suspended`): no memory-bound kernel is recorded, and no buffer is
counted for it. The all-gather's reordered result takes over the bytes of the collective's buffer (it is the
one buffer, as Megatron's); the reduce-scatter's reordered input is not counted (Megatron reads its input in
place). The values are the same as torch's (the same copy, only unrecorded).

>>> import torch.distributed._functional_collectives as funcol
>>> before = funcol.all_gather_single
>>> with sequence_first_collectives():
...     funcol.all_gather_single is before
False
>>> funcol.all_gather_single is before
True
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

__all__ = ["sequence_first_collectives", "is_sequence_dim", "SEQUENCE_DIM"]

#: the sequence dimension of a Hugging Face activation, ``[batch, sequence, ...]``
SEQUENCE_DIM = 1


def is_sequence_dim(t: torch.Tensor, dim: int) -> bool:
    """Whether ``dim`` of ``t`` is the sequence of a ``[batch, sequence, ...]`` activation: dimension 1 of a
    tensor of 3 or more dimensions (a 2-d tensor's dimension 1 is a feature: a column-parallel weight).

    >>> is_sequence_dim(torch.zeros(2, 8, 4), 1), is_sequence_dim(torch.zeros(2, 8, 4), -1)
    (True, False)
    """
    return t.dim() >= 3 and dim % t.dim() == SEQUENCE_DIM


def _reordered(source: torch.Tensor, reorder: Callable[[torch.Tensor], torch.Tensor], adopt: bool
               ) -> torch.Tensor:
    """``reorder(source)`` run unrecorded; with ``adopt``, the result takes over ``source``'s counted bytes."""
    from workbench.profiles.recording import dispatch_modes, suspended

    with suspended():
        out = reorder(source)
    if adopt:
        for mode in dispatch_modes():
            if hasattr(mode, "carry_over"):
                mode.carry_over(source, out)
    return out


def _gather(original: Callable) -> Callable:
    """``all_gather_single`` along the sequence: gathered along dimension 0, the reorder unrecorded."""

    def all_gather_single(self: torch.Tensor, gather_dim: int, group: Any, tag: str = "") -> torch.Tensor:
        if not is_sequence_dim(self, gather_dim):
            return original(self, gather_dim, group, tag)
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        gathered = original(self, 0, group, tag)
        if isinstance(gathered, AsyncCollectiveTensor):
            gathered = gathered.wait()
        size = gathered.shape[0] // self.shape[0]
        return _reordered(gathered, lambda g: torch.cat(torch.chunk(g, size, dim=0), dim=gather_dim), adopt=True)

    return all_gather_single


def _scatter(original: Callable) -> Callable:
    """``reduce_scatter_single`` along the sequence: the input's reorder unrecorded, scattered along 0."""

    def reduce_scatter_single(self: torch.Tensor, reduceOp: str, scatter_dim: int, group: Any, tag: str = ""
                              ) -> torch.Tensor:
        if not is_sequence_dim(self, scatter_dim):
            return original(self, reduceOp, scatter_dim, group, tag)
        import torch.distributed._functional_collectives as funcol
        from torch.distributed import distributed_c10d as c10d

        size = c10d._get_group_size_by_name(funcol._resolve_group(group, tag))
        if self.size(scatter_dim) % size:
            return original(self, reduceOp, scatter_dim, group, tag)        # torch's own error
        stacked = _reordered(self, lambda t: torch.cat(torch.chunk(t, size, dim=scatter_dim), dim=0), adopt=False)
        return original(stacked, reduceOp, 0, group, tag)

    return reduce_scatter_single


@contextlib.contextmanager
def sequence_first_collectives() -> Iterator[None]:
    """Inside, torch's functional all-gather and reduce-scatter along the sequence run as Megatron-Core's do
    on its sequence-first activations (module docstring)."""
    import torch.distributed._functional_collectives as funcol

    gather, scatter = funcol.all_gather_single, funcol.reduce_scatter_single
    funcol.all_gather_single, funcol.reduce_scatter_single = _gather(gather), _scatter(scatter)
    try:
        yield
    finally:
        funcol.all_gather_single, funcol.reduce_scatter_single = gather, scatter
