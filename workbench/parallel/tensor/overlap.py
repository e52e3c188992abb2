"""Tensor parallelism's communication overlap: a collective split into chunks and pipelined with the GEMM it feeds
or drains (docs/model.md, "Communication overlap").

Without it (torch eager, the workbench's runtime, torchtitan's default) every collective of a layer sits on its
critical path (:mod:`~workbench.parallel.tensor.times`). With it, as NeMo/Megatron-Core run (``tp_comm_overlap``:
Transformer Engine's userbuffers) and torch's async TP (torchtitan's ``enable_async_tensor_parallel``, under
``torch.compile``), sequence parallelism's all-gather before a column-parallel GEMM and its reduce-scatter after a
row-parallel GEMM run in chunks beside the GEMM's chunks. Each collective ``C`` seconds long (a ring on the link,
:func:`workbench.parallel.collectives.ring_seconds`) paired with GEMMs of ``G`` seconds (the matmuls
:class:`~workbench.parallel.tensor.comm.PairedCollectives` finds) takes, with its GEMMs (:func:`overlapped_seconds`):

* ``ring_exchange`` (all-gathers, forward and backward: TE's ``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``,
  ``fc2_dgrad``): ``tp`` GEMM chunks ``g = G / tp`` and ``tp - 1`` point-to-point steps ``c = C / (tp - 1)`` on the
  copy engines (TE's ``use_ce=True``), the local chunk first: ``g + (tp - 1) max(g, c)``; no SM taken;
* ``pipeline`` (the forward's reduce-scatters: ``proj_fprop``, ``fc2_fprop``): ``n = 4`` chunks, the GEMM on the
  SMs the communication kernels leave (``set_sm_margin``: ``s = SMs / (SMs - 16)``), each chunk's reduce-scatter
  beside the next chunk's GEMM, the last one exposed: ``g + (n - 1) max(g, c) + c`` with ``g = s G / n``,
  ``c = C / n``;
* ``bulk`` (the backward's reduce-scatters: ``qkv_dgrad``/``qkv_wgrad``, ``fc1_*``): the whole collective beside a
  GEMM of as many FLOPs (TE overlaps it with the weight-gradient GEMM, torch with the input-gradient one, the one
  paired here), on 16 SMs: ``max(s G, C)``.

Each is at least ``max(G, C)`` and at least ``G``; what it adds beyond ``G`` is the layer's ``exposed_*`` column,
and :func:`overlapped_chain` prices a layer's phase as ``compute + exposed`` (``compute = phase - comm``). An
all-reduce (tensor parallelism without sequence parallelism) and a collective with no GEMM stay whole.

Constants (TE ``transformer_engine/pytorch/module/base.py``, ``initialize_ub``'s ``get_default_config``, the
defaults Megatron-Core's ``--tp-comm-overlap`` runs without a per-model file): ``num_splits`` = tp for
``ring_exchange``, 4 for ``pipeline``; ``num_sm`` 16 for ``pipeline`` and ``bulk`` (1 for ``ring_exchange``, whose
copies use the copy engines); ``set_sm_margin`` on except for ``ring_exchange``. SMs per GPU: :data:`SMS`.

>>> round(overlapped_seconds("forward", "all_gather", comm=3.0, gemm=8.0, tp=4, sms=132), 6)   # c=1 <= g=2: hidden
8.0
>>> round(overlapped_seconds("forward", "reduce_scatter", comm=4.0, gemm=8.0, tp=4, sms=132), 3)
10.103
"""

from __future__ import annotations

import dataclasses

from workbench.model.chain import OVERLAP_FIELDS, Chain

__all__ = ["METHODS", "SMS", "PIPELINE_SPLITS", "COMM_SMS", "overlapped_seconds", "exposed_seconds",
           "overlapped_chain", "sms_of"]

#: (phase, collective) -> Transformer Engine's overlap method (``initialize_ub``'s ``methods``)
METHODS = {("forward", "all_gather"): "ring_exchange", ("backward", "all_gather"): "ring_exchange",
           ("forward", "reduce_scatter"): "pipeline", ("backward", "reduce_scatter"): "bulk"}
#: chunks of a ``pipeline`` overlap and SMs its (and ``bulk``'s) communication kernels take (TE's defaults)
PIPELINE_SPLITS = 4
COMM_SMS = 16
#: streaming multiprocessors per GPU (NVIDIA's datasheets and architecture whitepapers: A100 108, H100 SXM5 132,
#: H100 PCIe 114, H200 132 (the H100 SXM's GH100 configuration), B200 148, L40S 142; AMD's MI300X 304 compute units)
SMS = {"a100": 108, "h100-sxm": 132, "h100-96gb": 132, "h100-pcie": 114, "h200": 132, "b200": 148, "l40s": 142,
       "mi300x": 304}


def sms_of(gpu_name: str) -> int:
    """The SMs of a GPU of :mod:`workbench.model.accelerators` by name (its family's prefix).

    >>> sms_of("a100-80gb"), sms_of("h100-96gb-500w")
    (108, 132)
    """
    for prefix, n in sorted(SMS.items(), key=lambda kv: -len(kv[0])):
        if gpu_name.startswith(prefix):
            return n
    raise ValueError(f"tensor-parallel overlap: SMs of GPU {gpu_name!r} not known (known: {', '.join(SMS)})")


def overlapped_seconds(phase: str, kind: str, comm: float, gemm: float, tp: int, sms: int) -> float:
    """Seconds of one collective of ``comm`` seconds and the GEMMs of ``gemm`` seconds it is paired with, overlapped
    (module docstring); ``comm + gemm`` for an all-reduce or another collective TE does not overlap."""
    method = METHODS.get((phase, kind))
    if method is None or gemm <= 0 or comm <= 0:
        return comm + gemm
    slow = sms / (sms - COMM_SMS)
    if method == "ring_exchange":
        if tp < 2:
            return comm + gemm
        g, c = gemm / tp, comm / (tp - 1)
        return g + (tp - 1) * max(g, c)
    if method == "pipeline":
        g, c = slow * gemm / PIPELINE_SPLITS, comm / PIPELINE_SPLITS
        return g + (PIPELINE_SPLITS - 1) * max(g, c) + c
    return max(slow * gemm, comm)


def exposed_seconds(pairs: list[tuple[str, str, float, float]], tp: int, sms: int) -> float:
    """What a phase's collectives ``(phase, kind, comm seconds, paired GEMM seconds)`` add beyond its GEMMs when
    they overlap them (module docstring).

    >>> exposed_seconds([("forward", "all_reduce", 2.0, 0.0), ("forward", "all_gather", 3.0, 2.0)], 4, 132)
    3.5
    """
    return sum(overlapped_seconds(p, k, c, g, tp, sms) - g for p, k, c, g in pairs)


def overlapped_chain(chain: Chain) -> Chain:
    """``chain`` with every layer's forward and backward priced with its collectives overlapped: ``phase - comm +
    exposed`` (module docstring; a chain already overlapped, its ``tp_overlap`` metadata ``true``, as it is). A
    chain whose layers lack the columns (profiled before they were kept) is refused in one line.

    >>> from workbench.model.chain import Layer
    >>> ch = Chain((Layer("a", 1.0, 2.0, comm_forward=0.25, comm_backward=0.5, exposed_forward=0.0,
    ...                   exposed_backward=0.125),))
    >>> lay = overlapped_chain(ch).layers[0]
    >>> lay.forward, lay.backward
    (0.75, 1.625)
    """
    if chain.meta.get("tp_overlap") == "true":
        return chain
    layers = []
    for layer in chain.layers:
        values = [getattr(layer, f) for f in OVERLAP_FIELDS]
        if any(v is None for v in values):
            raise ValueError(f"tpo=1: layer {layer.name!r} of this profile has no {', '.join(OVERLAP_FIELDS)} "
                             "(a tensor-parallel profile of the fake profiler keeps them: profile it again)")
        comm_f, comm_b, exp_f, exp_b = values
        layers.append(dataclasses.replace(layer, forward=max(layer.forward - comm_f, 0.0) + exp_f,
                                          backward=max(layer.backward - comm_b, 0.0) + exp_b))
    return dataclasses.replace(chain, layers=tuple(layers), meta={**chain.meta, "tp_overlap": "true"})
