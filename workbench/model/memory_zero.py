"""What one rank of a data-parallel group holds, per layer and ZeRO level (docs/model.md, "Layouts").

The memory model (:mod:`workbench.model.memory`) computes a layer's terms for a *replica*: the parameters
W_l, its gradients G_l, the optimizer's n states and, under ``bf16-mixed``, fp32 masters (``wide`` w = 2 for a
bf16 profile). Over a data-parallel group of D ranks, the ZeRO level ``zero`` says what each rank keeps, as
torch runs it:

* **0, DDP** (``DistributedDataParallel``): a replica plus DDP's gradient buckets, one gradient-sized
  buffer resident from construction (torch's default ``gradient_as_bucket_view=False``; the gradients are
  copied into the buckets, all-reduced there and copied back). :func:`ddp_buckets`.
* **1, DDP + ZeroRedundancyOptimizer**: as DDP, with the optimizer state and the fp32 masters (and their
  gradients) of 1/D of the parameters (:func:`optimizer_bytes`, :func:`master_bytes`); the step's
  temporaries are a shard's.
* **2, FSDP2** ``fully_shard(reshard_after_forward=False)`` on every layer: the rank keeps 1/D of every
  parameter (in fp32 under ``bf16-mixed``: the shard *is* the master) and of every gradient
  (:func:`parameter_bytes`, :func:`gradient_bytes`); a layer's parameters are all-gathered before its
  forward and stay unsharded until its backward has run (:func:`unsharded_between`, counted with the
  micro-batch's activations); during a forward the next layer's all-gather is prefetched
  (:func:`forward_gathers`); after a layer's backward its gradients are copied into a reduce-scatter
  buffer and scattered (:func:`reduce_scatter_buffers`).
* **3, FSDP2** ``fully_shard(reshard_after_forward=True)``: as 2, but a layer's parameters are unsharded
  only around its own forward and its own backward, each time with the neighbour's prefetched
  (:func:`forward_gathers`, :func:`backward_gathers`).

Under a **pipeline** of more than one stage (``pipelined``) torch's ``PipelineStage`` runs every
micro-batch's backward but the last without resharding and without reducing
(``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``), and reduce-scatters once at
the end of the step: a stage's parameters and gradients stay unsharded through the step, on top of the
shards (an upper bound for zero 3, whose forwards reshard).

Tied parameters keep the replica's terms. Every function takes per-layer arrays and returns one.

>>> import numpy as np
>>> W = np.array([4.0, 8.0, 4.0])
>>> dp = DataParallel(dp=4, zero=3)
>>> forward_gathers(W, dp).tolist(), backward_gathers(W, dp).tolist()   # the layer's and a neighbour's
([12.0, 12.0, 4.0], [4.0, 12.0, 12.0])
>>> optimizer_bytes(W, 2, 1.0, dp).tolist()                               # Adam's two states, a quarter each
[2.0, 4.0, 2.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DataParallel", "ddp_buckets", "parameter_bytes", "master_bytes", "optimizer_bytes", "gradient_bytes",
           "made_gradients", "created_gradients", "unsharded_between", "forward_gathers", "backward_gathers",
           "backward_prefetch", "reduce_scatter_buffers", "step_share", "shard_layer_terms", "TORCH_MAPPING"]

#: each ZeRO level as torch runs it (docs/model.md, "Layouts")
TORCH_MAPPING = {
    0: "DistributedDataParallel (gradient_as_bucket_view=False: torch's default)",
    1: "DistributedDataParallel + torch.distributed.optim.ZeroRedundancyOptimizer",
    2: "FSDP2 fully_shard(reshard_after_forward=False) on every layer and the root",
    3: "FSDP2 fully_shard(reshard_after_forward=True) on every layer and the root, prefetching one layer",
}


@dataclass(frozen=True)
class DataParallel:
    """One rank's data-parallel set-up: ``dp`` ranks in its group, the ZeRO level, and whether its pipeline has
    more than one stage (torch's ``PipelineStage`` then keeps FSDP's parameters unsharded through the step)."""

    dp: int = 1
    zero: int = 0
    pipelined: bool = False

    @property
    def fsdp(self) -> bool:
        """Parameters and gradients sharded (zero 2 and 3: FSDP2)."""
        return self.dp > 1 and self.zero >= 2

    @property
    def per_layer(self) -> bool:
        """FSDP2 gathers and reduces layer by layer within each micro-batch (no pipeline around it)."""
        return self.fsdp and not self.pipelined


def ddp_buckets(G: np.ndarray, dp: DataParallel) -> np.ndarray:
    """DDP's gradient buckets (zero 0 and 1): one copy of the gradients, resident."""
    return G.copy() if dp.dp > 1 and dp.zero <= 1 else np.zeros_like(G)


def parameter_bytes(W: np.ndarray, shard_factor: float, dp: DataParallel) -> np.ndarray:
    """Resident parameter bytes: the replica's W; under FSDP a 1/D shard in the shard's dtype (``shard_factor``:
    w under bf16-mixed, whose fp32 shard is the master, else 1), plus the unsharded W under a pipeline."""
    if not dp.fsdp:
        return W.copy()
    return shard_factor * W / dp.dp + (W if dp.pipelined else 0.0)


def master_bytes(W: np.ndarray, G: np.ndarray, wide: float, mixed: bool, zeros: bool,
                 dp: DataParallel) -> np.ndarray:
    """fp32 masters under bf16-mixed (and, under ``zeros``, their gradients): a replica's, 1/D under ZeRO-1,
    none under FSDP (the fp32 shard is the master, counted by :func:`parameter_bytes`)."""
    if not mixed or dp.fsdp:
        return np.zeros_like(W)
    share = 1.0 / dp.dp if dp.zero == 1 else 1.0
    return share * (wide * W + (wide * G if zeros else 0.0))


def optimizer_bytes(W: np.ndarray, states: int, wide: float, dp: DataParallel) -> np.ndarray:
    """The optimizer's state: n states per parameter (in fp32 under bf16-mixed), 1/D of it from ZeRO-1 on."""
    share = 1.0 / dp.dp if dp.zero >= 1 else 1.0
    return states * wide * W * share


def gradient_bytes(G: np.ndarray, shard_factor: float, zeros: bool, dp: DataParallel) -> np.ndarray:
    """Resident gradients: under ``zeros`` the replica's (a 1/D shard under FSDP, plus the unsharded ones a
    pipeline keeps), and DDP's buckets under either loop."""
    held = made_gradients(G, shard_factor, dp) if zeros else np.zeros_like(G)
    return held + ddp_buckets(G, dp)


def made_gradients(G: np.ndarray, shard_factor: float, dp: DataParallel) -> np.ndarray:
    """Under ``none``: the gradient bytes a layer's backward makes that stay until the step (the replica's G; a
    1/D shard under FSDP, plus the unsharded G a pipeline accumulates)."""
    if not dp.fsdp:
        return G.copy()
    return shard_factor * G / dp.dp + (G if dp.pipelined else 0.0)


def created_gradients(G: np.ndarray, wide: float, mixed: bool, shard_factor: float,
                      dp: DataParallel) -> np.ndarray:
    """Under ``none``: the gradient bytes the step finds (with the fp32 masters' gradients the step makes under
    bf16-mixed: a shard's under ZeRO-1)."""
    if dp.fsdp:
        return made_gradients(G, shard_factor, dp)
    share = 1.0 / dp.dp if dp.zero == 1 else 1.0
    return G * (1.0 + (wide * share if mixed else 0.0))


def unsharded_between(W: np.ndarray, dp: DataParallel) -> np.ndarray:
    """zero 2 without a pipeline: a layer's unsharded parameters, from its forward's all-gather to the end of
    its backward, held like the micro-batch's activations."""
    return W.copy() if dp.per_layer and dp.zero == 2 else np.zeros_like(W)


def forward_gathers(W: np.ndarray, dp: DataParallel) -> np.ndarray:
    """How far a layer's forward climbs for FSDP2's all-gathers: the next layer's parameters, prefetched
    (zero 2 and 3), and the layer's own (zero 3, resharded after its forward)."""
    if not dp.per_layer:
        return np.zeros_like(W)
    following = np.concatenate([W[1:], [0.0]])
    return following + (W if dp.zero == 3 else 0.0)


def backward_gathers(W: np.ndarray, dp: DataParallel) -> np.ndarray:
    """zero 3: a layer's backward gathers its parameters again and prefetches the previous layer's."""
    if not (dp.per_layer and dp.zero == 3):
        return np.zeros_like(W)
    previous = np.concatenate([[0.0], W[:-1]])
    return W + previous


def backward_prefetch(W: np.ndarray, dp: DataParallel) -> np.ndarray:
    """zero 3: the previous layer's parameters, gathered ahead while a layer's backward ends."""
    if not (dp.per_layer and dp.zero == 3):
        return np.zeros_like(W)
    return np.concatenate([[0.0], W[:-1]])


def reduce_scatter_buffers(G: np.ndarray, inp: np.ndarray, shard_factor: float, dp: DataParallel) -> np.ndarray:
    """FSDP2 layer by layer: once a layer's backward has run (its temporaries freed, its unsharded parameters
    resharded), its gradients (G) are copied into a reduce-scatter input (G) and scattered into a 1/D output,
    while the gradient of its input (``inp`` bytes) waits for the previous layer: the climb at that moment,
    which a backward reaches when it exceeds the backward's own."""
    if not dp.per_layer:
        return np.zeros_like(G)
    return 2.0 * G + shard_factor * G / dp.dp + inp


def step_share(dp: DataParallel, *, foreach: bool) -> float:
    """The share of the replica's optimizer-step temporaries a rank makes: 1/D from ZeRO-1 on with a foreach
    step (a shard's parameters), and under FSDP with the loop (each parameter is a shard); ZeroRedundancyOptimizer
    with the loop steps whole parameters, the largest one as before."""
    if dp.zero >= 2 or (dp.zero == 1 and foreach):
        return 1.0 / dp.dp
    return 1.0


def shard_layer_terms(W: np.ndarray, G: np.ndarray, bwd: np.ndarray, inp: np.ndarray, *, states: int, wide: float,
                      mixed: bool, zeros: bool, foreach: bool, dp: DataParallel) -> dict[str, np.ndarray | float]:
    """Every term :mod:`workbench.model.memory` takes from here for one chain: the resident ``parameters``,
    ``gradients``, ``master`` and ``optimizer``; under ``none`` the ``made`` and ``created`` gradients; what a
    layer adds to a micro-batch's activations (``act``) and to its forward's climb (``fwd``); its backward's
    climb (``bwd``, from the replica's ``bwd`` and the bytes ``inp`` entering each layer); the ``step`` share.

    >>> W = np.array([4.0, 4.0])
    >>> t = shard_layer_terms(W, W, W, W, states=2, wide=1.0, mixed=False, zeros=False, foreach=True,
    ...                       dp=DataParallel(2, 0))
    >>> t["gradients"].tolist(), t["optimizer"].tolist()      # DDP's buckets; a replica's Adam states
    ([4.0, 4.0], [8.0, 8.0])
    """
    shard = wide if (mixed and dp.fsdp) else 1.0
    return {
        "parameters": parameter_bytes(W, shard, dp),
        "gradients": gradient_bytes(G, shard, zeros, dp),
        "master": master_bytes(W, G, wide, mixed, zeros, dp),
        "optimizer": optimizer_bytes(W, states, wide, dp),
        "made": made_gradients(G, shard, dp),
        "created": created_gradients(G, wide, mixed, shard, dp),
        "act": unsharded_between(W, dp),
        "fwd": forward_gathers(W, dp),
        "bwd": np.maximum(bwd + backward_gathers(W, dp),
                          reduce_scatter_buffers(G, inp, shard, dp) + backward_prefetch(W, dp)),
        "step": step_share(dp, foreach=foreach),
    }
