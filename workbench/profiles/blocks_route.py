"""Discovery's route 2, repeated blocks (:mod:`workbench.profiles.discover`, whose docstring states the route):
one forward with hooks records every module call; the chain is the prologue, one layer per block and one per
module after the last block.

>>> from torch import nn
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
...         self.head = nn.Linear(4, 2)
...     def forward(self, x):
...         for b in self.blocks:
...             x = b(x)
...         return self.head(x)
>>> blocks_route(Net(), (torch.zeros(3, 4),), {}, None, None).names
('prologue', 'blocks.0', 'blocks.1', 'head')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import nn

from workbench.profiles.found import Layers, chain_input, finish_layers, is_fake_tensor, same_tensor, with_slot
from workbench.profiles.traced import block_list
from workbench.profiles.wrappers import (
    DiscoveryError,
    Prologue,
    RebuiltLoss,
    RecordedCall,
    Stop,
    describe,
    prune,
    tensor_leaves,
)

__all__ = ["blocks_route", "record_calls", "seeded", "short_name", "output_loss"]


# ---------------------------------------------------------------------------------------------
# route 2: repeated blocks
# ---------------------------------------------------------------------------------------------
@dataclass
class _CallRec:
    """One module call seen by the hooks: its path, arguments, output and when it started and ended."""

    path: str
    args: tuple
    kwargs: dict
    output: Any
    start: int
    end: int


@dataclass
class _Recorded:
    """One forward of the model with hooks: every module call (in the order they ended), the output."""

    calls: list[_CallRec]
    output: Any

    def block_calls(self, block_path: str, n: int) -> list[_CallRec]:
        names = {f"{block_path}.{i}" for i in range(n)}
        return [c for c in self.calls if c.path in names]

    def outermost(self, calls: list[_CallRec]) -> list[_CallRec]:
        """The calls not nested in another of ``calls``, in the order they started."""
        return sorted((c for c in calls if not any(o.start < c.start and c.end < o.end for o in calls)),
                      key=lambda c: c.start)


def record_calls(model: nn.Module, args: tuple, kwargs: dict) -> _Recorded:
    paths = {m: p for p, m in model.named_modules(remove_duplicate=False) if p}
    calls: list[_CallRec] = []
    clock = [0]
    started: list[int] = []
    handles = []

    def pre(m: nn.Module, a: tuple, k: dict) -> None:
        clock[0] += 1
        started.append(clock[0])

    def post(m: nn.Module, a: tuple, k: dict, out: Any) -> None:
        clock[0] += 1
        calls.append(_CallRec(paths[m], a, k, out, started.pop(), clock[0]))

    for m in paths:
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        out = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return _Recorded(calls, out)


def _check_block_args(path: str, a: tuple, k: dict, pos: int | str, other: tuple[tuple, dict]) -> None:
    """A block's arguments other than the hidden state must be constants: tensors without gradient
    that do not change with the input, or plain values."""
    named = [(f"argument {i}", v) for i, v in enumerate(a) if i != pos] + [(repr(n), v) for n,
                                                                           v in k.items() if n != pos]
    named_other = [v for i, v in enumerate(other[0]) if i != pos] + [v for n, v in other[1].items() if n != pos]
    for (what, v), w in zip(named, named_other):
        for leaf, leaf2 in zip(pytree.tree_leaves(v), pytree.tree_leaves(w)):
            if isinstance(leaf, torch.Tensor):
                if leaf.requires_grad:
                    raise DiscoveryError(f"block {path!r}: {what} carries a gradient (it is computed from "
                                         "parameters); such an argument cannot be carried as a constant")
                if not same_tensor(leaf, leaf2):
                    raise DiscoveryError(f"block {path!r}: {what} changes with the input's values; only the "
                                         "hidden state may depend on the batch")
            elif not (leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device))):
                raise DiscoveryError(f"block {path!r}: {what} is {describe(leaf)}, state the blocks share "
                                     "(a key/value cache? build the model with use_cache=False; --module "
                                     "models get it switched off)")


def blocks_route(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None, target: Any) -> Layers:
    found = block_list(model)
    if found is None:
        raise DiscoveryError("no nn.ModuleList of repeated blocks")
    block_path, blocks = found
    x = chain_input(args, kwargs)
    rec = seeded(record_calls, model, args, kwargs)
    calls = rec.block_calls(block_path, len(blocks))
    if len(calls) != len(blocks) or [c.path for c in calls] != [f"{block_path}.{i}" for i in range(len(blocks))]:
        raise DiscoveryError(f"{block_path!r} holds {len(blocks)} blocks but the forward called "
                             f"{[c.path for c in calls]} (each must run once, in order)")
    pos = _hidden_position(calls[0])
    calls2 = calls if is_fake_tensor(x) else _other_values(model, args, kwargs, x, block_path, len(blocks))
    modules: list[nn.Module] = []
    names: list[str] = []
    prev = None
    for c, c2 in zip(calls, calls2):
        _check_block_args(c.path, c.args, c.kwargs, pos, (c2.args, c2.kwargs))
        h = c.kwargs[pos] if isinstance(pos, str) else c.args[pos]
        if prev is not None and not same_tensor(h, prev):
            raise DiscoveryError(f"block {c.path!r} does not receive the previous block's output as its argument "
                                 f"{pos!r}: the model does more between blocks than pass it on")
        outs = tensor_leaves(c.output)
        if not outs:
            raise DiscoveryError(f"block {c.path!r} returned {describe(c.output)}, no tensor")
        modules.append(RecordedCall(blocks[int(c.path.rsplit('.', 1)[1])], *with_slot(c.args, c.kwargs, h), pick=0))
        names.append(c.path)
        prev = outs[0]
    # the prologue: the modules that ran before block 0, in a pruned copy of the model
    before = rec.outermost([c for c in rec.calls if c.end < calls[0].start])
    keep = {c.path for c in before}
    skeleton = prune(model, keep, block_path, Stop(pos))
    prologue = Prologue(skeleton, *with_slot(args, kwargs, x))
    # the epilogue: the outermost modules that ran after the last block, each fed the previous output
    tail_names: list[str] = []
    by_path = dict(model.named_modules())
    for c in rec.outermost([c for c in rec.calls if c.start > calls[-1].end]):
        inputs = tensor_leaves((c.args, c.kwargs))
        if len(inputs) != 1 or not same_tensor(inputs[0], prev):
            raise DiscoveryError(f"module {c.path!r} after the last block is not fed the previous module's output "
                                 f"alone (it received {', '.join(describe(v) for v in inputs) or 'no tensor'}): "
                                 "the model computes between its final modules")
        outs = tensor_leaves(c.output)
        if len(outs) != 1:
            raise DiscoveryError(f"module {c.path!r} returned {describe(c.output)}; a layer must return one tensor")
        modules.append(RecordedCall(by_path[c.path], *with_slot(c.args, c.kwargs, inputs[0]), pick=0))
        tail_names.append(c.path)
        prev = outs[0]
    pro_name = short_name("+".join(c.path for c in before) or "prologue")
    all_names = [pro_name] + names + tail_names
    return finish_layers(model, [prologue] + modules, all_names, x, f"blocks at {block_path}",
                   output_loss(rec.output, prev, loss, all_names[-1]))


def _other_values(model: nn.Module, args: tuple, kwargs: dict, x: torch.Tensor, block_path: str,
                  n: int) -> list[_CallRec]:
    """The block calls of the same forward on a batch with other values (the blocks' other arguments must not
    change with them; fake tensors have no values to change, so a fake profile skips this check)."""
    x2 = x + torch.randn_like(x) if x.is_floating_point() else (x + 1) % (int(x.max()) + 1)  # ids stay in range
    leaves, spec = pytree.tree_flatten((args, kwargs))
    args2, kwargs2 = pytree.tree_unflatten([x2 if l is x else l for l in leaves], spec)
    return seeded(record_calls, model, args2, kwargs2).block_calls(block_path, n)


def seeded(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with the random generators seeded (dropout draws the same masks) and then restored."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return fn(*args)


def _hidden_position(call: _CallRec) -> int | str:
    """Where block 0 takes its hidden state: the first tensor argument shaped like its output."""
    outs = tensor_leaves(call.output)
    if not outs:
        raise DiscoveryError(f"block {call.path!r} returned {describe(call.output)}, no tensor")
    cands: list[int | str] = [i for i, v in enumerate(call.args)
                              if isinstance(v, torch.Tensor) and v.shape == outs[0].shape]
    cands += [n for n, v in call.kwargs.items() if isinstance(v, torch.Tensor) and v.shape == outs[0].shape]
    if not cands:
        raise DiscoveryError(f"block {call.path!r} received no tensor shaped like its output {tuple(outs[0].shape)}")
    return cands[0]


def short_name(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def output_loss(output: Any, last: torch.Tensor, loss: Callable | None, last_name: str) -> Callable | None:
    """The loss of the last layer's tensor: ``loss`` of the model's output rebuilt around it."""
    if loss is None:
        return None
    if isinstance(output, torch.Tensor):
        if not same_tensor(output, last):
            raise DiscoveryError(f"the model returns {describe(output)}, not the output of its last module "
                                 f"{last_name!r}")
        return loss
    leaves = pytree.tree_leaves(output)
    hits = [i for i, l in enumerate(leaves) if isinstance(l, torch.Tensor) and same_tensor(l, last)]
    if not hits:
        raise DiscoveryError(f"none of the model's outputs ({describe(output)}) is the output of its last "
                             f"module {last_name!r}")
    return RebuiltLoss.around(loss, output, hits[:1])
