"""The tensor-parallel transform of a layout's rank: one call into the sharding plan of ``workbench.parallel.tensor``.

The sharding itself (torch's ``parallelize_module``: column-wise for the query/key/value and gate/up
projections, row-wise for the output and down projections, vocabulary-parallel embedding and head, optional
sequence parallelism) is the plan :mod:`workbench.parallel.tensor` builds for profiles
(``plan_model``, ``shard_model``); the runtime applies the same plan to the whole model on the ``tp``
sub-mesh before the pipeline takes its stages (:func:`apply_tensor_parallel`), and runs the chain's layers
as that package's ``local_chain`` wraps them (each passes its rank's local tensor on, as a pipeline sends
it), so what is profiled is what runs. Where that package is absent, a layout with ``tp`` > 1 is refused before any rank
starts (:func:`check_tensor_parallel`), naming what is missing.

With the vocabulary-parallel loss (``lp=1``) the head's output stays ``Shard(-1)`` (``use_local_output=False``,
the plan's) and the last stage computes the loss on the rank's vocabulary shard of the logits under torch's
``loss_parallel()`` (:func:`loss_context`, around every step's forward and backward, as torchtitan's train
context), with the model's own loss where it is a plain cross-entropy of the head's logits: views and casts,
then ``F.cross_entropy`` (to aten ``log_softmax`` and ``nll_loss``), which ``loss_parallel`` computes without
gathering the vocabulary. Any other use of the logits is refused before a rank starts, naming the loss and what
it does (:func:`cross_entropy_refusal`).

GPT-2's fused query/key/value projection is sharded with its columns permuted (each rank holds its own
heads' query, key and value): gathered whole, its weight and gradient are in the permuted order.
:func:`apply_tensor_parallel` also returns the function that puts a whole tensor back in the model's order
by its parameter name (:class:`ModelOrder`), which the rank applies to the gradients and the tied copies
it reports, so that they compare with one process's by name and position.

:func:`check_tensor_parallel` also refuses a model whose sizes ``tp`` does not divide (attention heads,
key/value heads, hidden and MLP sizes, vocabulary: what the plan splits), naming the sizes, before any rank
starts.

>>> ModelOrder({}, 2)("w", torch.ones(2)).tolist()        # nothing permuted: as it is
[1.0, 1.0]
>>> check_tensor_parallel(None, 1)
>>> tensor_sizes(type("Config", (), {"num_attention_heads": 12, "hidden_size": 768})())
{'attention heads': 12, 'hidden size': 768}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

__all__ = ["tensor_parallel_plan", "tensor_sizes", "check_tensor_parallel", "apply_tensor_parallel", "ModelOrder",
           "loss_context", "cross_entropy_refusal"]

#: the sizes a tensor-parallel plan splits, by their names in Hugging Face configs (Llama's, then GPT-2's)
_SIZES = (("num_attention_heads", "attention heads"), ("n_head", "attention heads"),
          ("num_key_value_heads", "key/value heads"), ("hidden_size", "hidden size"), ("n_embd", "hidden size"),
          ("intermediate_size", "MLP size"), ("n_inner", "MLP size"), ("vocab_size", "vocabulary"))


def tensor_parallel_plan() -> Any:
    """The sharding plan's three functions (``plan_model``, ``shard_model``, ``local_chain`` of
    :mod:`workbench.parallel.tensor`) as one namespace, or None where this build lacks them."""
    from types import SimpleNamespace

    try:
        from workbench.parallel.tensor.boundaries import local_chain
        from workbench.parallel.tensor.plan import plan_model
        from workbench.parallel.tensor.shard import shard_model
    except ImportError:
        return None
    return SimpleNamespace(plan_model=plan_model, shard_model=shard_model, local_chain=local_chain)


@dataclass(frozen=True)
class ModelOrder:
    """A whole tensor of parameter ``name`` (its weight, its gradient) in the model's own order: the
    parameters the plan permuted (``{name: (dim, parts)}``, ``TensorPlan.permuted()``) un-permuted, the
    others as they are."""

    permuted: Mapping[str, tuple[int, int]]
    tp: int

    def __call__(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        if name not in self.permuted:
            return whole
        from workbench.parallel.tensor.styles import model_order

        dim, parts = self.permuted[name]
        return model_order(whole, dim, parts, self.tp)


def tensor_sizes(config: Any) -> dict[str, int]:
    """The sizes of a model's config that a tensor-parallel plan splits (by their plain names)."""
    sizes: dict[str, int] = {}
    for attr, name in _SIZES:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and name not in sizes:
            sizes[name] = value
    return sizes


def check_tensor_parallel(model: nn.Module | None, tp: int) -> None:
    """Refuse (ValueError) ``tp`` > 1 where the sharding plan is missing, or a ``model`` whose sizes ``tp``
    does not divide, naming them; nothing for ``tp`` = 1."""
    if tp == 1:
        return
    plan = tensor_parallel_plan()
    if plan is not None and model is not None:
        plan.plan_model(model, tp)           # refuses what it cannot split, naming the sizes
        return
    sizes = tensor_sizes(getattr(model, "config", None))
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        raise ValueError(f"tp={tp} does not divide the model's " + ", ".join(f"{k} ({v})" for k, v in bad.items())
                         + ": tensor parallelism splits each of them over the tp ranks")
    if plan is None:
        raise ValueError(f"tp={tp}: tensor parallelism needs the sharding plan of workbench.parallel.tensor, which "
                         "this build of the workbench lacks; run tp=1 layouts (pipeline and data parallelism)")


def apply_tensor_parallel(model: nn.Module, layers: Any, x0: torch.Tensor, tp_mesh: Any, layout: Any
                          ) -> tuple[list[nn.Module], Any, list[tuple[tuple[int, ...], torch.dtype]], ModelOrder]:
    """``model`` sharded in place over ``tp_mesh`` by the plan of :mod:`workbench.parallel.tensor`, and its
    discovered chain ``layers`` (which hold the same modules) as a rank runs them: (the layers, each passing
    the rank's local tensor on, the loss, every layer's local output (shape, dtype) on ``x0``, the
    :class:`ModelOrder` of the whole parameters). Every rank of the ``tp`` group calls it (the sharding and
    the example forward are collective)."""
    tensor = tensor_parallel_plan()
    if tensor is None:
        raise ValueError(f"tp={layout.tp}: this build lacks the sharding plan of workbench.parallel.tensor")
    plan = tensor.plan_model(model, layout.tp, sequence_parallel=layout.sequence_parallel,
                             loss_parallel=layout.loss_parallel, sequence=int(x0.shape[1]) if x0.dim() > 1 else None)
    tensor.shard_model(model, tp_mesh, plan)
    modules, loss = tensor.local_chain(list(layers.modules), x0, tp_mesh, layers.loss)
    shapes = []
    with torch.no_grad():
        h = x0
        for m in modules:
            h = m(h)
            shapes.append((tuple(h.shape), h.dtype))
    return modules, loss, shapes, ModelOrder(plan.permuted(), layout.tp)


def loss_context(layout: Any) -> Any:
    """torch's ``loss_parallel()`` for a layout with the vocabulary-parallel loss, else a context doing nothing."""
    from contextlib import nullcontext

    if not getattr(layout, "loss_parallel", False) or layout.tp == 1:
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


#: what a loss may do to the head's logits before its cross-entropy under ``loss_parallel`` (aten's views and casts,
#: by their names without a leading underscore)
_SHAPING = frozenset({"view", "unsafe_view", "reshape", "clone", "contiguous", "to_copy", "slice", "alias", "detach",
                      "squeeze", "unsqueeze", "log_softmax"})
#: the losses ``loss_parallel`` computes on vocabulary-sharded logits (``F.cross_entropy`` is ``log_softmax`` and
#: ``nll_loss`` to aten)
_CROSS_ENTROPY = frozenset({"nll_loss_forward", "nll_loss2d_forward"})


def cross_entropy_refusal(loss: Any, logits: torch.Tensor, target: Any) -> str | None:
    """Why ``loss(logits, target)`` is not a plain cross-entropy of ``logits`` (None when it is): it runs once
    under a ``TorchDispatchMode`` that follows every tensor made from ``logits`` through aten's operators (so a
    loss rebuilt from an exported graph, a model's own ``labels=`` loss, is read as well as ``F.cross_entropy``);
    views and casts of them (:data:`_SHAPING`) are followed on, ``nll_loss`` of them ends the check, any other
    operator that makes a tensor of them is named.

    >>> import torch.nn.functional as F
    >>> y, t = torch.randn(2, 3, 8), torch.randint(0, 8, (2, 3))
    >>> cross_entropy_refusal(lambda o, t: F.cross_entropy(o.flatten(0, 1).float(), t.flatten()), y, t) is None
    True
    >>> cross_entropy_refusal(lambda o, t: -(o.softmax(-1) + 1e-9).log().mean(), y, t)
    'it applies softmax to the logits'
    """
    import torch.utils._pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    derived, kept, losses, other = {id(logits)}, [logits], [], []

    class Follow(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            leaves = pytree.tree_leaves((args, kwargs or {}))
            if any(isinstance(t, torch.Tensor) and id(t) in derived for t in leaves):
                name = func.overloadpacket.__name__.lstrip("_")
                made = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
                if name in _CROSS_ENTROPY:
                    losses.append(name)
                elif made and name in _SHAPING:
                    derived.update(id(t) for t in made)
                    kept.extend(made)              # held, so that no other tensor takes their ids
                elif made:
                    other.append(name)
            return out

    with torch.no_grad(), Follow():
        loss(logits, target)
    if other:
        return f"it applies {other[0]} to the logits"
    if not losses:
        return "it computes no cross-entropy of the logits (F.cross_entropy)"
    return None
