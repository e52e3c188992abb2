"""The tensor-parallel transform of a layout's rank: one call into the sharding plan of ``workbench.parallel.tensor``.

The sharding itself (torch's ``parallelize_module``: column-wise for the query/key/value and gate/up
projections, row-wise for the output and down projections, vocabulary-parallel embedding and head, optional
sequence parallelism) is the plan :mod:`workbench.parallel.tensor` builds for profiles; the runtime applies
the same plan to a pipeline stage's layers on the ``tp`` sub-mesh (:func:`apply_tensor_parallel`), so what is
profiled is what runs. Where that package is absent, a layout with ``tp`` > 1 is refused before any rank
starts (:func:`check_tensor_parallel`), naming what is missing.

:func:`check_tensor_parallel` also refuses a model whose sizes ``tp`` does not divide (attention heads,
key/value heads, hidden and MLP sizes, vocabulary: what the plan splits), naming the sizes, before any rank
starts.

>>> check_tensor_parallel(None, 1)
>>> tensor_sizes(type("Config", (), {"num_attention_heads": 12, "hidden_size": 768})())
{'attention heads': 12, 'hidden size': 768}
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

__all__ = ["tensor_parallel_plan", "tensor_sizes", "check_tensor_parallel", "apply_tensor_parallel"]

#: the sizes a tensor-parallel plan splits, by their names in Hugging Face configs (Llama's, then GPT-2's)
_SIZES = (("num_attention_heads", "attention heads"), ("n_head", "attention heads"),
          ("num_key_value_heads", "key/value heads"), ("hidden_size", "hidden size"), ("n_embd", "hidden size"),
          ("intermediate_size", "MLP size"), ("n_inner", "MLP size"), ("vocab_size", "vocabulary"))


def tensor_parallel_plan() -> Any:
    """The module :mod:`workbench.parallel.tensor` (its sharding plan), or None where this build lacks it."""
    try:
        from workbench.parallel import tensor
    except ImportError:
        return None
    return tensor


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
    if plan is not None and hasattr(plan, "check_tensor_parallel"):
        plan.check_tensor_parallel(model, tp)
        return
    sizes = tensor_sizes(getattr(model, "config", None))
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        raise ValueError(f"tp={tp} does not divide the model's " + ", ".join(f"{k} ({v})" for k, v in bad.items())
                         + ": tensor parallelism splits each of them over the tp ranks")
    if plan is None:
        raise ValueError(f"tp={tp}: tensor parallelism needs the sharding plan of workbench.parallel.tensor, which "
                         "this build of the workbench lacks; run tp=1 layouts (pipeline and data parallelism)")


def apply_tensor_parallel(stage: nn.Sequential, layer_names: Sequence[str], tp_mesh: Any, layout: Any) -> nn.Sequential:
    """``stage`` (one pipeline stage's layers, whose chain names are ``layer_names``) sharded over ``tp_mesh``
    by the plan of :mod:`workbench.parallel.tensor`; ``stage`` itself for ``tp`` = 1."""
    if layout.tp == 1:
        return stage
    plan = tensor_parallel_plan()
    if plan is None or not hasattr(plan, "parallelize_layers"):
        raise ValueError(f"tp={layout.tp}: workbench.parallel.tensor has no parallelize_layers in this build")
    return plan.parallelize_layers(stage, layer_names, tp_mesh, sequence_parallel=layout.sequence_parallel)
