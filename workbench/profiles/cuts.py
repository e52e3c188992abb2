"""Layers cut where the user says: ``profile --module FILE.py:FUNC --split-at NAME,NAME,...``.

A model that discovery cannot split by itself (a loss computed inside the
forward from ``labels=``, an encoder-decoder, code after the last module) is
split at module names, as torch's ``pipeline(module, split_spec=...)`` takes
them: a new layer begins where each named module is called (torch's
``SplitPoint.BEGINNING``). :func:`cut_layers` does what torch's pipelining does
(a ``pipe_split()`` marker before each named module's forward, the whole
forward captured by ``torch.export``, the graph cut at the markers) and then
makes the pieces a chain, as the traced route does (:mod:`workbench.profiles.traced`):

* what a later layer reads of an earlier one is **sent**: tensors computed from
  the chain's input or from parameters (the hidden state, an encoder's output a
  decoder attends to, a position bias computed from parameters, a router's
  logits a loss reads at the end), several **packed** into one flat tensor;
* what depends on neither (masks and position ids made from the batch's other
  inputs, rotary tables, ``labels``) is a **constant** of each layer that reads
  it: every mini-batch of a run is the example batch, as on the other routes;
* the last layer returns the tensors of the model's output that the loss
  reads, and only those (the loss a Hugging Face model computes from
  ``labels=``, with a router's auxiliary loss when the config adds it; or the
  logits), found by asking autograd which ones the loss depends on.

Refusals are one line: a name that is no module of the model (with the nearest
names), a module the forward never calls or calls twice, tensors of several
dtypes or an integer tensor computed from the input crossing a cut (move the
cut), a forward ``torch.export`` cannot capture. :func:`suggest_split_at` gives
the ``--split-at`` line discovery tries by itself when its other routes fail:
every block of every list of repeated blocks, and every module with
parameters called after the last block.

>>> import torch
>>> from torch import nn
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
...     def forward(self, x):
...         h = self.a(x)
...         return self.b(torch.relu(h)) + h[:, :2]     # h crosses the cut beside b's input
>>> mods, names, _ = cut_layers(Net(), (torch.zeros(3, 4),), {}, None, ("b",))
>>> names, tuple(mods[0](torch.zeros(3, 4)).shape)          # relu(h) and h: 2 x 24 values, packed
(['a', 'b'], (48,))
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from workbench.profiles.traced import _PartBuilder, _Traced, _values
from workbench.profiles.wrappers import DiscoveryError, RebuiltLoss, describe

__all__ = ["parse_split_at", "cut_layers", "suggest_split_at", "check_split_names"]


def parse_split_at(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"a,b,c"`` (or a list of names) -> the module names, refused when one is empty or repeated.

    >>> parse_split_at("model.layers.1, lm_head")
    ('model.layers.1', 'lm_head')
    >>> parse_split_at("a,,b")
    Traceback (most recent call last):
    ...
    ValueError: --split-at 'a,,b': an empty module name (give NAME,NAME,... as model.named_modules() names them)
    """
    if text is None:
        return ()
    raw = text.split(",") if isinstance(text, str) else list(text)
    names = tuple(str(n).strip() for n in raw)
    shown = text if isinstance(text, str) else ",".join(names)
    if not names or any(not n for n in names):
        raise ValueError(f"--split-at {shown!r}: an empty module name (give NAME,NAME,... as model.named_modules() "
                         "names them)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--split-at {shown!r}: {', '.join(repeated)} named twice")
    return names


def check_split_names(model: nn.Module, names: Sequence[str]) -> None:
    """Every name a submodule of ``model`` (not the model itself); else one line with the nearest names."""
    known = [n for n, _ in model.named_modules() if n]
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3, cutoff=0.5) or known[:3]
            raise ValueError(f"--split-at: {type(model).__name__} has no module {name!r} (nearest: "
                             f"{', '.join(near)}; print(model) or model.named_modules() lists them)")


def _export(model: nn.Module, args: tuple, kwargs: dict, names: Sequence[str]) -> tuple[fx.GraphModule, list[str]]:
    """``model``'s forward captured by ``torch.export`` with a ``pipe_split()`` before each named module; the
    graph and the names in the order the forward calls them."""
    from torch.distributed.pipelining import pipe_split

    called: list[str] = []
    handles = []

    def marker(name: str) -> Callable[..., None]:
        def pre(m: nn.Module, a: tuple, k: dict) -> None:
            called.append(name)
            pipe_split()
        return pre

    for name in names:
        handles.append(model.get_submodule(name).register_forward_pre_hook(marker(name), with_kwargs=True))
    try:
        with torch.random.fork_rng():
            ep = torch.export.export(model, args, kwargs, strict=False)
    except DiscoveryError:
        raise
    except Exception as e:  # noqa: BLE001 - what torch.export refuses, in one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise DiscoveryError(f"torch.export could not capture {type(model).__name__}'s forward "
                             f"({type(e).__name__}: {first}); cut it where the forward is plain torch code") from None
    finally:
        for h in handles:
            h.remove()
    for name in names:
        if called.count(name) != 1:
            raise DiscoveryError(f"--split-at {name}: the forward calls it {called.count(name)} times; cut at a "
                                 "module it calls once")
    return ep.module(check_guards=False), called


def _is_marker(n: fx.Node) -> bool:
    return n.op == "call_function" and n.target is torch.ops.pippy._pipe_split.default


def _flat_inputs(gm: fx.GraphModule, args: tuple, kwargs: dict) -> list[Any]:
    """The model's inputs in the order of the graph's placeholders."""
    from torch.export._tree_utils import reorder_kwargs

    spec = gm.graph._codegen.pytree_info.in_spec  # type: ignore[attr-defined]
    return pytree.tree_flatten((args, reorder_kwargs(kwargs, spec)))[0]


def _variable(t: _Traced, chain_input: fx.Node) -> set[fx.Node]:
    """The nodes whose value follows the chain's input or a parameter (what a later layer must be sent)."""
    out: set[fx.Node] = set()
    for n in t.gm.graph.nodes:
        if n is chain_input:
            out.add(n)
        elif n.op == "get_attr":
            v = t.values.get(n)
            if isinstance(v, torch.Tensor) and v.requires_grad:
                out.add(n)
        elif any(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def _crossing(t: _Traced, k: int, read_at_end: set[fx.Node]) -> list[fx.Node]:
    """The values computed at or before part ``k`` that a later part reads (or the last part returns)."""
    def later(u: fx.Node) -> bool:
        return t.part.get(u, -1) > k

    return [n for n in t.gm.graph.nodes if (n is t.chain_input or t.part.get(n, k + 1) <= k)
            and (any(later(u) for u in n.users) or n in read_at_end)]


def _sent(t: _Traced, k: int, variable: set[fx.Node], read_at_end: set[fx.Node], cut: str) -> list[fx.Node]:
    """The tensors cut ``k`` (before module ``cut``) sends; constants join ``t.constants``; refused when what
    must be sent cannot go as one tensor."""
    sent = []
    for n in _crossing(t, k, read_at_end):
        value = t.values[n]
        if n not in variable:
            if isinstance(value, torch.Tensor):
                t.constants.add(n)
            continue
        if not isinstance(value, torch.Tensor):
            raise DiscoveryError(f"--split-at {cut}: {describe(value)} computed from the input before {cut!r} is "
                                 "read after it; move the cut")
        if not value.is_floating_point():
            raise DiscoveryError(f"--split-at {cut}: {describe(value)} computed from the input before {cut!r} is "
                                 "read after it; only floating tensors are sent: move the cut")
        sent.append(n)
    if len({t.values[n].dtype for n in sent}) > 1:
        raise DiscoveryError(f"--split-at {cut}: tensors of several dtypes cross it ("
                             f"{', '.join(describe(t.values[n]) for n in sent)}); they are sent packed in one "
                             "tensor: move the cut")
    if not sent:
        raise DiscoveryError(f"--split-at {cut}: nothing computed from the input crosses it")
    return sent


def _loss_leaves(loss: Callable | None, output: Any, target: Any) -> list[int]:
    """The indices of the output's tensors the loss depends on (all the floating ones without a loss)."""
    leaves, spec = pytree.tree_flatten(output)
    floating = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if loss is None or not floating:
        return floating
    probes = {i: leaves[i].detach().requires_grad_() for i in floating}
    with torch.enable_grad():
        value = loss(pytree.tree_unflatten([probes.get(i, v) for i, v in enumerate(leaves)], spec), target)
        if not isinstance(value, torch.Tensor) or not value.requires_grad:
            return floating
        grads = torch.autograd.grad(value.sum(), [probes[i] for i in floating], allow_unused=True)
    used = [i for i, g in zip(floating, grads) if g is not None]
    return used or floating


def _part_names(model: nn.Module, t: _Traced, called: list[str]) -> list[str]:
    """Each part named by the module it begins with; the first by the outermost modules whose code reads a
    parameter in it (the module stack torch.export records: the same names for a real and a fake model), a
    block of a ``nn.ModuleList`` standing for the modules in it."""
    items = {f"{path}.{i}" for path, m in model.named_modules() if isinstance(m, nn.ModuleList) for i in range(len(m))}
    owners: list[str] = []
    for n in t.gm.graph.nodes:
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        reads = any(a.op == "get_attr" and getattr(t.values.get(a), "requires_grad", False)
                    for a in n.all_input_nodes)
        if t.part.get(n) != 0 or not reads or not stack or not stack[-1][0]:
            continue
        parts = str(stack[-1][0]).split(".")
        owner = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in items),
                     ".".join(parts))
        if owner not in owners:
            owners.append(owner)
    owners = [o for o in owners if not any(o.startswith(p + ".") for p in owners)]
    first = "+".join(owners) or "input"
    return [first if len(first) <= 60 else first[:57] + "...", *called]


def cut_layers(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None, names: Sequence[str],
               target: Any = None) -> tuple[list[nn.Module], list[str], Callable | None]:
    """``model`` cut before each of ``names`` (see the module docstring): (the layers, their names, the loss of
    the last layer's tensor). The chain's input is the first tensor of ``args`` and ``kwargs``."""
    check_split_names(model, names)
    gm, called = _export(model, args, kwargs, names)
    holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    feed = _flat_inputs(gm, args, kwargs)
    if len(feed) != len(holders):
        raise DiscoveryError(f"torch.export took {len(holders)} inputs of the {len(feed)} given")
    first = next((i for i, v in enumerate(feed) if isinstance(v, torch.Tensor)), None)
    if first is None:
        raise DiscoveryError("the example inputs hold no tensor")
    part: dict[fx.Node, int] = {}
    k = 0
    for n in list(gm.graph.nodes):
        if _is_marker(n):
            k += 1
            gm.graph.erase_node(n)
        elif n.op in ("call_function", "call_method", "call_module"):
            part[n] = k
    gm.recompile()
    output = next(n for n in gm.graph.nodes if n.op == "output")
    t = _Traced(gm, _values(gm, feed), part, [[]], holders[first], output)
    out_spec = gm.graph._codegen.pytree_info.out_spec  # type: ignore[attr-defined]
    flat_out = list(output.args[0])
    structured = pytree.tree_unflatten([t.values[n] if isinstance(n, fx.Node) else n for n in flat_out], out_spec)
    slots = _loss_leaves(loss, structured, target)
    if not slots:
        raise DiscoveryError(f"the model returns {describe(structured)} without a floating tensor")
    returned = [flat_out[i] for i in slots]
    variable = _variable(t, holders[first])
    layers: list[nn.Module] = []
    inputs = [t.chain_input]
    for k in range(len(called) + 1):
        outputs = returned if k == len(called) else _sent(t, k, variable, set(returned), called[k])
        layers.append(_PartBuilder(t, k, inputs, outputs).module())
        inputs = outputs
    chain_loss = None if loss is None else RebuiltLoss.around(loss, structured, slots, packed=len(slots) > 1)
    return layers, _part_names(model, t, called), chain_loss


def _block_lists(model: nn.Module) -> list[str]:
    """Paths of the ``nn.ModuleList``s of >= 2 modules of one class, none inside another."""
    found: list[str] = []
    for path, m in model.named_modules():
        if path and isinstance(m, nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            if not any(path.startswith(f + ".") for f in found):
                found.append(path)
    return found


def suggest_split_at(model: nn.Module, calls: Sequence[tuple[str, int, int]]) -> tuple[str, ...]:
    """The cuts discovery tries when its other routes fail: before every block of every list of repeated blocks
    the forward calls once each, in order, and before every outermost module with parameters called after the
    last block. ``calls``: (path, start, end) of each module call of one forward, as the hooks saw them.

    >>> m = nn.Module()
    >>> m.blocks, m.head = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]), nn.Linear(2, 2)
    >>> suggest_split_at(m, [("blocks.0", 1, 2), ("blocks.1", 3, 4), ("head", 5, 6)])
    ('blocks.0', 'blocks.1', 'head')
    """
    order = sorted(calls, key=lambda c: c[1])
    paths = [c[0] for c in order]
    cuts: list[str] = []
    for lst in _block_lists(model):
        blocks = [f"{lst}.{i}" for i in range(len(model.get_submodule(lst)))]
        if all(paths.count(b) == 1 for b in blocks) and [p for p in paths if p in blocks] == blocks:
            cuts += blocks
    if not cuts:
        return ()
    end = max(c[2] for c in order if c[0] in cuts)
    after = [c for c in order if c[1] > end]
    outer = [c for c in after if not any(o[1] < c[1] and c[2] < o[2] for o in after)]
    cuts += [c[0] for c in outer if any(True for _ in model.get_submodule(c[0]).parameters())]
    first = {p: i for i, p in reversed(list(enumerate(paths)))}
    return tuple(sorted(dict.fromkeys(cuts), key=lambda p: first[p]))
