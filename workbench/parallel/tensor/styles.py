"""One parallel style of our own: a sub-block's hidden-state input, wherever the block passes it.

torch's ``PrepareModuleInput`` needs to know whether a module receives its input by position or by
keyword: torchtitan's blocks call ``attention(x, ...)``, Hugging Face's call
``self_attn(hidden_states=..., ...)``. :class:`PrepareHiddenState` converts the first positional tensor,
else the ``hidden_states`` (or ``x``) keyword, from ``input_layout`` to ``desired_layout`` as a ``DTensor``
(torch's ``DTensor.from_local`` and ``redistribute``), and leaves the other arguments alone. One such
tensor then feeds the sub-block's column-wise projections: its gradient is summed over them as a partial
``DTensor`` and all-reduced (reduce-scattered under sequence parallelism) once, in the backward of
``from_local``, where three separately converted inputs would be reduced three times.

>>> PrepareHiddenState.__mro__[1].__name__
'ParallelStyle'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["PrepareHiddenState", "HIDDEN_KEYWORDS"]

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
