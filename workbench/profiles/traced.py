"""Discovery's traced route: a ``torch.fx`` graph of the model, one layer per block or top-level module.

:func:`traced_layers` is route 3 of :func:`~workbench.profiles.discover.discover_layers`,
for models whose forward does more than hand one tensor from block to block
(a skip across blocks, functional code such as ``x.mean(1)`` between them).

* **Units**: the modules kept whole, each called as it is and never traced into
  (:func:`units`): every block of the model's largest ``nn.ModuleList`` of
  repeated blocks, the other children of the modules that hold it, and the
  model's other children, containers (``nn.Sequential``, ``nn.ModuleList``,
  ``nn.ModuleDict``) opened. Only the code around them is traced, so a block
  may do anything torch.fx cannot trace (control flow on values, a cache).
* **Parts**: a new layer starts at each call of another unit that holds
  parameters; functional code and parameter-free units (activations, pooling)
  join the layer before them, code before the first unit the first layer.
* **Boundaries**: whatever is live across a boundary is sent forward. One tensor
  goes as it is; several floating tensors of one dtype (a skip connection
  beside the hidden state) are **packed** into one flat tensor (:func:`pack`) and
  unpacked into views on the other side (:func:`unpack`), so the chain stays one
  tensor per boundary and a skip that spans stages is a tensor sent like any
  other (its bytes in the layer's ``activation_bytes``). Python values (shapes,
  flags) are constants; the model's other inputs (an attention mask) are
  constant buffers of every layer that reads them. Tensors that cannot be
  packed (several dtypes) merge the two layers, as the model then demands.
* **Output**: the last layer returns the model's output's tensors (packed if
  several); :class:`~workbench.profiles.wrappers.RebuiltLoss` hands the loss the
  model's own output structure (a dict, a tuple, a ``ModelOutput``).

When torch.fx cannot trace the code around the units, the error names the
module whose forward holds the line, the line, and what to wrap.

>>> import torch
>>> from torch import nn
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
...     def forward(self, x):
...         h = self.a(x)
...         return self.c(self.b(h)) + h      # h skips b and c: packed beside b's output
>>> x = torch.zeros(3, 4)
>>> mods, names, _, _ = traced_layers(Net(), (x,), {}, x, None)
>>> names, tuple(mods[1](mods[0](x)).shape)           # b's output and h: 2 x 12 values
(['a', 'b', 'c'], (24,))
"""

from __future__ import annotations

import inspect
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from workbench.profiles.wrappers import DiscoveryError, RebuiltLoss, describe, pack, tensor_leaves, unpack

__all__ = ["traced_layers", "units", "block_list", "pack_output"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
#: Python values that may cross a boundary as constants (shapes, flags, dtypes)
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.Size)


def pack_output(output: Any) -> torch.Tensor:
    """The tensors of the model's output structure: the one tensor, or all of them packed."""
    leaves = tensor_leaves(output)
    return leaves[0] if len(leaves) == 1 else pack(*leaves)


def block_list(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The ``nn.ModuleList`` of >= 2 modules of one class with the most parameters (None if none)."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for path, m in model.named_modules():
        if not path or not isinstance(m, nn.ModuleList) or len(m) < 2:
            continue
        if len({type(c) for c in m}) != 1:
            continue
        size = sum(p.numel() for p in m.parameters())
        if best is None or size > best[0]:
            best = (size, path, m)
    return None if best is None else (best[1], best[2])


def units(model: nn.Module) -> list[str]:
    """The paths of the modules the traced route keeps whole (see the module docstring).

    >>> class M(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.body = nn.Module()
    ...         self.body.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))
    ...         self.body.norm = nn.LayerNorm(2)
    ...         self.head = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> units(M())
    ['body.blocks.0', 'body.blocks.1', 'body.norm', 'head.0', 'head.1']
    """
    found = block_list(model)
    blocks = found[0] if found else None
    opened = {""} if blocks is None else {blocks.rsplit(".", i)[0] for i in range(1, blocks.count(".") + 1)} | {""}
    out: list[str] = []

    def visit(m: nn.Module, path: str) -> None:
        for name, c in m.named_children():
            p = f"{path}.{name}" if path else name
            if p == blocks:
                out.extend(f"{p}.{n}" for n, _ in c.named_children())
            elif p in opened or (isinstance(c, _CONTAINERS) and len(c) > 0):
                visit(c, p)
            else:
                out.append(p)

    visit(model, "")
    return out


class _UnitTracer(fx.Tracer):
    """torch.fx's tracer with the units as leaves: their calls are recorded, their code is not traced."""

    def __init__(self, keep: set[str]) -> None:
        super().__init__()
        self.keep = keep

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.keep or super().is_leaf_module(m, qualname)


def _ours(filename: str) -> bool:
    """A file of torch, of the workbench or of Python itself (not the user's code)."""
    roots = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
             os.path.dirname(os.__file__)]
    return filename.startswith("<") or any(filename.startswith(r + os.sep) for r in roots)


def _trace_failure(model: nn.Module, e: Exception) -> DiscoveryError:
    """Why torch.fx could not trace ``model``: the line, the module whose forward holds it, what to wrap."""
    frames = [f for f in _walk(e.__traceback__) if not _ours(f.f_code.co_filename)]
    what = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    if not frames:
        return DiscoveryError(f"torch.fx could not trace {type(model).__name__}: {what}")
    frame = frames[-1]
    owner = frame.f_locals.get("self")
    paths = {m: p for p, m in model.named_modules()}
    where = (f"{paths[owner] or type(model).__name__}.{frame.f_code.co_name}" if owner in paths
             else frame.f_code.co_name)
    line = (inspect.getframeinfo(frame).code_context or [""])[0].strip()
    return DiscoveryError(f"torch.fx could not trace {where} at {os.path.basename(frame.f_code.co_filename)}:"
                          f"{frame.f_lineno} ({line!r}): {what}; move that code into an nn.Module of its own "
                          "(the workbench calls modules whole and traces only the code between them)")


def _walk(tb: Any) -> list[Any]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


@dataclass
class _Traced:
    """The model's graph with every node's value on the example batch and the part each node belongs to;
    ``constants``: tensors a later part reads as constant buffers (they depend on neither the chain's input nor
    a parameter: :mod:`workbench.profiles.cuts`)."""

    gm: fx.GraphModule
    values: dict[fx.Node, Any]
    part: dict[fx.Node, int]
    names: list[list[str]]
    chain_input: fx.Node
    output: fx.Node
    constants: set[fx.Node] = field(default_factory=set)


def _trace(model: nn.Module, args: tuple, kwargs: dict, x: torch.Tensor) -> _Traced:
    keep = set(units(model))
    try:
        graph = _UnitTracer(keep).trace(model)
    except Exception as e:  # noqa: BLE001 - tracing fails in many ways; say where
        raise _trace_failure(model, e) from None
    gm = fx.GraphModule(model, graph)
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    feed = [bound.arguments.get(str(n.target).lstrip("*"), None) for n in holders]
    chain = [n for n, v in zip(holders, feed) if v is x]
    if len(chain) != 1:
        raise DiscoveryError("the model's input tensor is not one of its forward's named arguments")
    values = _values(gm, feed)
    part, names = _parts(model, graph)
    output = next(n for n in graph.nodes if n.op == "output")
    return _Traced(gm, values, part, names, chain[0], output)


def _values(gm: fx.GraphModule, feed: list[Any]) -> dict[fx.Node, Any]:
    """Every node's value on the example (without autograd; dropout seeded as in the other checks)."""
    values: dict[fx.Node, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            values[n] = super().run_node(n)
            return values[n]

    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        Recorder(gm).run(*feed)
    return values


def _parts(model: nn.Module, graph: fx.Graph) -> tuple[dict[fx.Node, int], list[list[str]]]:
    """The part of every computing node (see the module docstring) and the units of each part."""
    part: dict[fx.Node, int] = {}
    names: list[list[str]] = [[]]
    current = None
    for n in graph.nodes:
        if n.op == "call_module":
            holds = any(True for _ in model.get_submodule(str(n.target)).parameters())
            if holds and current is not None and n.target != current:
                names.append([])
            if holds:
                current = n.target
                if n.target not in names[-1]:
                    names[-1].append(str(n.target))
        if n.op in ("call_module", "call_function", "call_method"):
            part[n] = len(names) - 1
    return part, names


def _crossing(t: _Traced, k: int) -> list[fx.Node]:
    """The values computed at or before part ``k`` that a later part (or the output) reads."""
    def later(u: fx.Node) -> bool:
        return u.op == "output" or t.part.get(u, -1) > k

    return [n for n in t.gm.graph.nodes if (n is t.chain_input or t.part.get(n, k + 1) <= k)
            and any(later(u) for u in n.users)]


def _plain(v: Any) -> bool:
    return all(isinstance(l, _PLAIN) for l in pytree.tree_leaves(v))


def _constant(t: _Traced, n: fx.Node) -> bool:
    """A Python value that crosses as a constant: plain, and not read out of a tensor's values."""
    return _plain(t.values[n]) and not (n.op == "call_method" and n.target in ("item", "tolist"))


def _sent(t: _Traced, k: int) -> list[fx.Node] | None:
    """The tensors boundary ``k`` sends (None: they cannot go as one tensor)."""
    live = [n for n in _crossing(t, k) if not _constant(t, n)]
    if any(not isinstance(t.values[n], torch.Tensor) for n in live):
        return None
    if len(live) > 1 and (len({t.values[n].dtype for n in live}) != 1
                          or not t.values[live[0]].is_floating_point()):
        return None
    return live


def _merge(t: _Traced, k: int) -> None:
    for n in t.part:
        if t.part[n] > k:
            t.part[n] -= 1
    t.names[k] += t.names.pop(k + 1)


class _PartBuilder:
    """Copies one part's nodes into a graph of its own: the packed input, the part's nodes, the packed output."""

    def __init__(self, t: _Traced, k: int, inputs: list[fx.Node], outputs: list[fx.Node] | None) -> None:
        self.t, self.k = t, k
        self.graph = fx.Graph()
        self.env: dict[fx.Node, Any] = {}
        self.root: dict[str, Any] = {}
        x = self.graph.placeholder("x")
        if len(inputs) == 1:
            self.env[inputs[0]] = x
        else:
            shapes = tuple(tuple(t.values[n].shape) for n in inputs)
            views = self.graph.call_function(unpack, (x, shapes))
            for i, n in enumerate(inputs):
                self.env[n] = self.graph.call_function(operator.getitem, (views, i))
        for n in t.gm.graph.nodes:
            if t.part.get(n) == k:
                self.env[n] = self.graph.node_copy(n, self.lookup)
        if outputs is None:
            result = pytree.tree_map(lambda a: self.lookup(a) if isinstance(a, fx.Node) else a, t.output.args[0])
            self.graph.output(self.graph.call_function(pack_output, (result,)))
        elif len(outputs) == 1:
            self.graph.output(self.lookup(outputs[0]))
        else:
            self.graph.output(self.graph.call_function(pack, tuple(self.lookup(n) for n in outputs)))

    def lookup(self, n: fx.Node) -> Any:
        """The node's value in this part: copied, received, an attribute, a constant or a plain value."""
        if n in self.env:
            return self.env[n]
        value = self.t.values[n]
        if n.op == "get_attr":                    # a parameter or buffer the code between units reads
            self.root[str(n.target)] = _attr(self.t.gm, str(n.target))
            self.env[n] = self.graph.get_attr(str(n.target))
        elif n.op == "placeholder" and isinstance(value, torch.Tensor):   # another input: a constant buffer
            name = f"_input_{n.name}"
            self.root[name] = value.detach()
            self.env[n] = self.graph.get_attr(name)
        elif n in self.t.constants:               # computed before from constants alone: a constant buffer
            name = f"_constant_{n.name}"
            self.root[name] = value.detach()
            self.env[n] = self.graph.get_attr(name)
        elif _constant(self.t, n):                # shapes, flags: the same for every batch of this shape
            return value
        else:
            raise DiscoveryError(f"the value {n.name!r} ({describe(value)}) crosses a layer boundary")
        return self.env[n]

    def module(self) -> fx.GraphModule:
        for n in self.graph.nodes:          # call_module targets copied by node_copy
            if n.op == "call_module":
                self.root[str(n.target)] = self.t.gm.get_submodule(str(n.target))
        return fx.GraphModule(self.root, self.graph)


def _attr(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def traced_layers(model: nn.Module, args: tuple, kwargs: dict, x: torch.Tensor, loss: Callable | None
                  ) -> tuple[list[nn.Module], list[str], Callable | None, str]:
    """The model's layers by the traced route: (modules, names, the loss of the last layer's tensor, a note
    on what was merged). ``x`` is the chain's input, one of ``args``/``kwargs``."""
    t = _trace(model, args, kwargs, x)
    merged: list[str] = []
    k = 0
    while k < len(t.names) - 1:
        if _sent(t, k) is None:
            merged.append(f"{'+'.join(t.names[k])} | {'+'.join(t.names[k + 1])}")
            _merge(t, k)
        else:
            k += 1
    modules: list[nn.Module] = []
    inputs = [t.chain_input]
    for k in range(len(t.names)):
        last = k == len(t.names) - 1
        outputs = None if last else _sent(t, k)
        modules.append(_PartBuilder(t, k, inputs, outputs).module())
        inputs = outputs or []
    names = _names(t.names)
    note = (f"; {len(merged)} boundaries merged, where tensors of several dtypes cross (first: {merged[0]})"
            if merged else "")
    return modules, names, _loss_of_output(t, loss), note


def _names(parts: list[list[str]]) -> list[str]:
    out: list[str] = []
    for i, units_ in enumerate(parts):
        name = "+".join(units_) or f"part{i}"
        name = name if len(name) <= 60 else name[:57] + "..."
        out.append(name if name not in out else f"{name}#{out.count(name) + 1}")
    return out


def _loss_of_output(t: _Traced, loss: Callable | None) -> Callable | None:
    """The user's loss of the last layer's tensor, the model's output rebuilt around it."""
    if loss is None:
        return None
    output = t.values[t.output]
    if isinstance(output, torch.Tensor):
        return loss
    leaves = pytree.tree_leaves(output)
    slots = [i for i, l in enumerate(leaves) if isinstance(l, torch.Tensor)]
    if not slots:
        raise DiscoveryError(f"the model returns {describe(output)} without a tensor")
    if len({leaves[i].dtype for i in slots}) != 1 or (len(slots) > 1 and not leaves[slots[0]].is_floating_point()):
        raise DiscoveryError(f"the model returns tensors of several dtypes ({describe(output)}); the last layer "
                             "must hand the loss one tensor or several of one floating dtype")
    return RebuiltLoss.around(loss, output, slots, packed=len(slots) > 1)

