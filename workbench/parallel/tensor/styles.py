"""Parallel styles of our own: a sub-block's hidden-state input, and GPT-2's ``Conv1D`` split as Megatron splits it.

:class:`PrepareHiddenState`: torch's ``PrepareModuleInput`` needs to know whether a module receives its input
by position or by keyword: torchtitan's blocks call ``attention(x, ...)``, Hugging Face's call
``self_attn(hidden_states=..., ...)``. :class:`PrepareHiddenState` converts the first positional tensor,
else the ``hidden_states`` (or ``x``) keyword, from ``input_layout`` to ``desired_layout`` as a ``DTensor``
(torch's ``DTensor.from_local`` and ``redistribute``), and leaves the other arguments alone. One such
tensor then feeds the sub-block's column-wise projections: its gradient is summed over them as a partial
``DTensor`` and all-reduced (reduce-scattered under sequence parallelism) once, in the backward of
``from_local``, where three separately converted inputs would be reduced three times.

GPT-2 (Hugging Face's ``GPT2LMHeadModel``) computes its projections with ``Conv1D``: a linear layer whose
weight is stored transposed, ``[in, out]``, and applied as ``addmm(bias, x, weight)``. torch's
``ColwiseParallel`` and ``RowwiseParallel`` split ``nn.Linear`` and ``nn.Embedding`` only;
:class:`Conv1DColwise` and :class:`Conv1DRowwise` are the same styles (the same input and output layouts,
torch's own ``distribute_module``) for a ``Conv1D``: column-wise shards its weight on dim 1 and its bias on
dim 0, row-wise shards its weight on dim 0 and keeps its bias whole (``Replicate``: added once, after the
partial sums are reduced).

GPT-2's attention projects query, key and value with one ``Conv1D``, ``c_attn``, whose ``3 h`` output
columns are ``[q | k | v]``, each ``h`` wide, head after head. Split as it is, rank 0 of 2 would hold all the
query columns and half the keys. Megatron-LM stores its fused projection so that a contiguous shard holds
the rank's own heads' query, key and value; :class:`Conv1DColwise` with ``parts=3`` does the same by
permuting the columns before sharding them (:func:`fused_order`): ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``
where ``q_r`` are the query columns of heads ``r h / tp .. (r + 1) h / tp``. Rank ``r``'s shard is then
``[q_r | k_r | v_r]``, and the attention's own ``split(split_size)`` with the local split size
(``h / tp``, set by :mod:`~workbench.parallel.tensor.shard`) hands it its heads' query, key and value.

The permuted parameter, gathered whole (``full_tensor()``), is in the permuted order:
:func:`model_order` puts a whole tensor (the weight, its gradient, an optimizer's state) back into the
model's own order (:meth:`~workbench.parallel.tensor.plan.TensorPlan.permuted` names the parameters and how
they are permuted).

The token embedding split over the vocabulary (:class:`VocabParallelEmbedding`, torch's ``RowwiseParallel``)
would get its weight's gradient back whole: torch's backward of an embedding on a ``DTensor`` gives a
``Replicate`` ``[vocab, hidden]`` gradient, which ``.grad`` then holds through the step. Megatron's
``VocabParallelEmbedding`` holds its shard's gradient only; so does this style: its forward passes the weight
through :class:`ShardedGradient` (identity forward; its backward redistributes the gradient to the weight's
placements, ``Replicate`` to ``Shard(0)`` a local slice, no communication). It is in the module's forward, not
a tensor hook, so it survives ``module.to(device)`` (which swaps a ``DTensor`` parameter and drops its hooks).

>>> PrepareHiddenState.__mro__[1].__name__
'ParallelStyle'
>>> fused_order(12, 3, 2).tolist()          # q k v of 4 columns each, 2 ranks
[0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
>>> t = torch.arange(12.0)
>>> torch.equal(model_order(t[fused_order(12, 3, 2)], 0, 3, 2), t)
True
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

__all__ = ["PrepareHiddenState", "HIDDEN_KEYWORDS", "Conv1DColwise", "Conv1DRowwise", "is_conv1d", "fused_order",
           "model_order", "ShardedGradient", "VocabParallelEmbedding"]

#: the keywords a block may pass its hidden state by
HIDDEN_KEYWORDS = ("hidden_states", "x", "hidden")


class PrepareHiddenState(ParallelStyle):
    """The module's hidden-state input as a ``DTensor`` of ``desired_layout`` (module docstring)."""

    def __init__(self, input_layout: Any, desired_layout: Any) -> None:
        super().__init__()
        self.input_layout, self.desired_layout = input_layout, desired_layout

    def _convert(self, t: Any, mesh: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        d = t if isinstance(t, DTensor) else DTensor.from_local(t, mesh, (self.input_layout,), run_check=False)
        if d.placements != (self.desired_layout,):
            d = d.redistribute(placements=(self.desired_layout,))
        return d

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        def pre(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args and isinstance(args[0], torch.Tensor):
                return (self._convert(args[0], device_mesh), *args[1:]), kwargs
            key = next((k for k in HIDDEN_KEYWORDS if isinstance(kwargs.get(k), torch.Tensor)), None)
            if key is None:
                raise ValueError(f"tensor parallelism: {type(module).__name__} received no hidden state (neither a "
                                 f"first positional tensor nor a keyword {', '.join(HIDDEN_KEYWORDS)})")
            return args, {**kwargs, key: self._convert(kwargs[key], device_mesh)}

        module.register_forward_pre_hook(pre, with_kwargs=True)
        return module

    def __repr__(self) -> str:
        return f"PrepareHiddenState({self.input_layout} -> {self.desired_layout})"


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is a ``Conv1D`` of Hugging Face's GPT-2 family (a linear layer, weight ``[in, out]``)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and tuple(weight.shape) == (getattr(module, "nx", None), getattr(module, "nf", None)))


def fused_order(n: int, parts: int, tp: int) -> torch.Tensor:
    """The permutation of ``n`` fused columns (``parts`` equal parts side by side) that makes rank ``r``'s
    contiguous ``1 / tp`` shard hold the ``r``-th ``1 / tp`` of every part (module docstring)."""
    if n % (parts * tp):
        raise ValueError(f"tensor parallelism: {n} fused columns do not split into {parts} parts over tp={tp} ranks")
    return torch.arange(n).view(parts, tp, n // (parts * tp)).transpose(0, 1).reshape(-1)


def model_order(t: torch.Tensor, dim: int, parts: int, tp: int) -> torch.Tensor:
    """A whole tensor permuted by :func:`fused_order` along ``dim``, back in the model's order."""
    inverse = torch.argsort(fused_order(t.shape[dim], parts, tp))
    return t.index_select(dim, inverse.to(t.device))


def _distribute(module: nn.Module, name: str, mesh: Any, placement: Any, src_data_rank: int | None,
                order: torch.Tensor | None = None) -> None:
    """``module.name`` replaced by a parameter distributed as ``placement`` (its ``dim`` permuted by ``order``)."""
    param = getattr(module, name, None)
    if param is None:
        return
    data = param.detach()
    if order is not None:
        data = data.index_select(placement.dim, order.to(data.device))
    module.register_parameter(name, nn.Parameter(distribute_tensor(data, mesh, [placement],
                                                                   src_data_rank=src_data_rank),
                                                 requires_grad=param.requires_grad))


class Conv1DColwise(ColwiseParallel):
    """torch's ``ColwiseParallel`` for a GPT-2 ``Conv1D`` (weight ``Shard(1)``, bias ``Shard(0)``); with
    ``parts`` > 1 a fused projection whose columns are permuted first (module docstring). Anything else is
    left to ``ColwiseParallel``."""

    def __init__(self, *, parts: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parts = parts

    def _partition_conv1d(self, _: str, module: nn.Module, mesh: Any) -> None:
        tp = mesh.size()
        order = fused_order(module.weight.shape[1], self.parts, tp) if self.parts > 1 else None
        _distribute(module, "weight", mesh, Shard(1), self.src_data_rank, order)
        _distribute(module, "bias", mesh, Shard(0), self.src_data_rank, order)

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not is_conv1d(module):
            if self.parts > 1:
                raise ValueError(f"tensor parallelism: a fused {type(module).__name__} is split as a Conv1D only")
            return super()._apply(module, device_mesh)
        return distribute_module(module, device_mesh, self._partition_conv1d,
                                 partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                                 partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", parts={self.parts})"


class Conv1DRowwise(RowwiseParallel):
    """torch's ``RowwiseParallel`` for a GPT-2 ``Conv1D`` (weight ``Shard(0)``, bias ``Replicate``); anything
    else is left to ``RowwiseParallel``."""

    def _partition_conv1d(self, _: str, module: nn.Module, mesh: Any) -> None:
        _distribute(module, "weight", mesh, Shard(0), self.src_data_rank)
        _distribute(module, "bias", mesh, Replicate(), self.src_data_rank)

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(module, device_mesh, self._partition_conv1d,
                                 partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                                 partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class ShardedGradient(torch.autograd.Function):
    """Identity on a ``DTensor`` weight whose backward hands the gradient back in the weight's placements."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor) -> torch.Tensor:
        ctx.layout = (weight.device_mesh, weight.placements) if isinstance(weight, DTensor) else None
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if ctx.layout is None or not isinstance(grad, DTensor) or tuple(grad.placements) == tuple(ctx.layout[1]):
            return grad
        return grad.redistribute(*ctx.layout)


def _sharded_gradient_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The module's own forward with its ``weight`` passed through :class:`ShardedGradient` (an instance
    attribute shadows the parameter for the call: ``nn.Module`` looks its parameters up only when no
    attribute of that name is found)."""
    module.__dict__["weight"] = ShardedGradient.apply(module._parameters["weight"])
    try:
        return type(module).forward(module, *args, **kwargs)
    finally:
        del module.__dict__["weight"]


class VocabParallelEmbedding(RowwiseParallel):
    """torch's ``RowwiseParallel`` for the token embedding (weight ``Shard(0)``), its weight's gradient held as
    the rank's shard (module docstring)."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        module = super()._apply(module, device_mesh)
        module.forward = partial(_sharded_gradient_forward, module)
        return module
