"""Find the layers of any ``torch.nn.Module``: a chain of one-tensor-in, one-tensor-out modules.

The profiler and the runtime work on a *chain*: layers that each take one
tensor and return one tensor (docs/model.md, "Instance"). :func:`discover_layers`
turns a model and an example batch into such a chain, the user writing no
splitting code. It tries, in order:

1. ``nn.Sequential`` (or a list of modules): the children, as they are;
2. **repeated blocks**: the largest ``nn.ModuleList`` of modules of one class
   that the forward calls one after the other (Hugging Face GPT-2's
   ``transformer.h``, Llama's ``model.layers``, BERT's ``encoder.layer``).
   One forward with hooks records what each block receives. The layers are
   then: the *prologue* (the model's own forward, run until the first block:
   embeddings, position ids, masks), one layer per block, and one per module
   the forward calls after the last block (final norm, head), each of which
   must take the previous one's output. A block's arguments other than the
   hidden state (attention masks, position ids, rotary position embeddings)
   are recorded once and carried by the block's wrapper as constant buffers;
   they are refused if they change with the input's values, carry a gradient
   or hold state (a key/value cache: ``use_cache=False``, which ``--module``
   sets, :func:`~workbench.profiles.usermodel.for_training`). Every mini-batch of
   a run is the example batch, so these constants are the batch's own (a
   padded batch's attention mask reaches every block that reads it);
3. otherwise a **traced graph** (``torch.fx``, :mod:`workbench.profiles.traced`):
   one layer per block (the same ``nn.ModuleList``) or top-level module, the
   code around them traced (a skip across blocks, ``x.mean(1)`` before the
   head); where several tensors cross a boundary they are packed into one.

The loss receives the model's own output structure (a ``ModelOutput``, a
dict, a tuple) with the last layer's tensor(s) in place
(:class:`~workbench.profiles.wrappers.RebuiltLoss`); a tensor the chain does not
carry is ``None``, and a loss that needs one is refused saying what it got.

Whatever the route, the chain is checked against the model: run one after the
other on the example batch it must give the model's loss (or output) to
rounding, else the next route is tried (and, after the last, discovery fails saying
why each route did). When the model's own forward or its loss raises on the example,
that is a :class:`ModelFailure` (the user's code failed). Under ``FakeTensorMode`` (a fake
profile) tensors have shapes but no values: the checks then compare shapes and
dtypes, and the check that a block's other arguments do not change with the
input's values is skipped.

Shared (tied) parameters, such as GPT-2's token embedding and LM head, are
found by identity: :attr:`Layers.tied` lists, per shared parameter, the
layer that owns it (the first to use it), every layer that uses it and its
bytes (the profile's ``tied`` metadata, docs/model.md "Tied parameters").

>>> import torch
>>> from torch import nn
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
...     def forward(self, x):
...         return self.b(torch.relu(self.a(x)))
>>> found = discover_layers(Net(), torch.zeros(3, 4))
>>> found.how, found.names
('traced graph', ('a', 'b'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn

from workbench.profiles.local import local_bytes
from workbench.profiles.traced import block_list, traced_layers
from workbench.profiles.wrappers import (
    DiscoveryError,
    ModelFailure,
    Prologue,
    RebuiltLoss,
    RecordedCall,
    Slot,
    Stop,
    describe,
    prune,
    tensor_leaves,
)

__all__ = ["Tie", "Layers", "DiscoveryError", "ModelFailure", "discover_layers", "find_ties"]


@dataclass(frozen=True)
class Tie:
    """A parameter used by several layers: ``owner`` (the first of ``layers``) counts its ``bytes``."""

    owner: str
    layers: tuple[str, ...]
    bytes: int
    parameter: str

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "layers": list(self.layers), "bytes": self.bytes, "parameter": self.parameter}


@dataclass(frozen=True)
class Layers:
    """A model as a chain: ``modules[i]`` (named ``names[i]``) maps one tensor to one tensor.

    ``input`` is the first layer's input (from the example batch), ``loss(output, target)`` the
    loss of the last layer's output (None without one), ``parameter_names[i]`` maps each of
    layer ``i``'s own parameter names to the model's name for it (``model.named_parameters()``),
    ``tied`` the shared parameters, ``how`` the route that found the layers.
    """

    modules: tuple[nn.Module, ...]
    names: tuple[str, ...]
    input: torch.Tensor
    how: str
    parameter_names: tuple[dict[str, str], ...]
    tied: tuple[Tie, ...] = ()
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.modules)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _fake(t: Any) -> bool:
    """A tensor of ``FakeTensorMode`` (a fake profile, :mod:`workbench.profiles.fake`): a shape, no values."""
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(t, torch.Tensor) and is_fake(t)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor, or equal ones; fake tensors have no values: equal shape and dtype stand for equal."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return _fake(a) or _fake(b) or bool(torch.equal(a.detach(), b.detach()))


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise DiscoveryError(f"example inputs must be a tensor, a tuple or a dict of them, got {describe(example_inputs)}")


def _with_slot(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    """(args, kwargs) with the leaf that *is* ``x`` replaced by a slot."""
    slot = Slot()
    leaves, spec = pytree.tree_flatten((args, kwargs))
    hits = [i for i, l in enumerate(leaves) if l is x]
    if len(hits) != 1:
        raise DiscoveryError(f"the chain's input appears {len(hits)} times in a recorded call (expected once)")
    leaves[hits[0]] = slot
    return pytree.tree_unflatten(leaves, spec)


def _chain_input(args: tuple, kwargs: dict) -> torch.Tensor:
    leaves = tensor_leaves((args, kwargs))
    if not leaves:
        raise DiscoveryError("the example inputs hold no tensor")
    return leaves[0]


def find_ties(modules: Sequence[nn.Module], names: Sequence[str], model: nn.Module | None = None) -> tuple[Tie, ...]:
    """Parameters used by more than one layer (by identity), in order of their owner.

    >>> lin = nn.Linear(2, 2, bias=False)
    >>> [t.to_dict() for t in find_ties([lin, nn.Sequential(lin)], ["a", "b"])]
    [{'owner': 'a', 'layers': ['a', 'b'], 'bytes': 16, 'parameter': 'a.weight'}]
    """
    canonical = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    users: dict[int, list[int]] = {}
    first: dict[int, tuple[str, torch.Tensor]] = {}
    for i, m in enumerate(modules):
        for n, p in m.named_parameters():
            users.setdefault(id(p), [])
            if i not in users[id(p)]:
                users[id(p)].append(i)
            first.setdefault(id(p), (canonical.get(id(p), f"{names[i]}.{n}"), p))
    ties: list[Tie] = []
    for key, idx in users.items():
        if len(idx) < 2:
            continue
        name, p = first[key]
        ties.append(Tie(names[idx[0]], tuple(names[i] for i in idx), local_bytes(p), name))
    return tuple(ties)


def _parameter_names(modules: Sequence[nn.Module], names: Sequence[str], model: nn.Module | None) -> tuple[dict, ...]:
    canonical = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    return tuple({n: canonical.get(id(p), f"{names[i]}.{n}") for n, p in m.named_parameters()}
                 for i, m in enumerate(modules))


def _finish(model: nn.Module | None, modules: list[nn.Module], names: list[str], x: torch.Tensor, how: str,
            loss: Callable | None) -> Layers:
    if len(set(names)) != len(names):
        raise DiscoveryError(f"layer names are not unique: {names}")
    return Layers(tuple(modules), tuple(names), x, how, _parameter_names(modules, names, model),
                  find_ties(modules, names, model), loss)


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


def _record(model: nn.Module, args: tuple, kwargs: dict) -> _Recorded:
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
                if not _same(leaf, leaf2):
                    raise DiscoveryError(f"block {path!r}: {what} changes with the input's values; only the "
                                         "hidden state may depend on the batch")
            elif not (leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device))):
                raise DiscoveryError(f"block {path!r}: {what} is {describe(leaf)}, state the blocks share "
                                     "(a key/value cache? build the model with use_cache=False; --module "
                                     "models get it switched off)")


def _blocks_route(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None, target: Any) -> Layers:
    found = block_list(model)
    if found is None:
        raise DiscoveryError("no nn.ModuleList of repeated blocks")
    block_path, blocks = found
    x = _chain_input(args, kwargs)
    rec = _seeded(_record, model, args, kwargs)
    calls = rec.block_calls(block_path, len(blocks))
    if len(calls) != len(blocks) or [c.path for c in calls] != [f"{block_path}.{i}" for i in range(len(blocks))]:
        raise DiscoveryError(f"{block_path!r} holds {len(blocks)} blocks but the forward called "
                             f"{[c.path for c in calls]} (each must run once, in order)")
    pos = _hidden_position(calls[0])
    calls2 = calls if _fake(x) else _other_values(model, args, kwargs, x, block_path, len(blocks))
    modules: list[nn.Module] = []
    names: list[str] = []
    prev = None
    for c, c2 in zip(calls, calls2):
        _check_block_args(c.path, c.args, c.kwargs, pos, (c2.args, c2.kwargs))
        h = c.kwargs[pos] if isinstance(pos, str) else c.args[pos]
        if prev is not None and not _same(h, prev):
            raise DiscoveryError(f"block {c.path!r} does not receive the previous block's output as its argument "
                                 f"{pos!r}: the model does more between blocks than pass it on")
        outs = tensor_leaves(c.output)
        if not outs:
            raise DiscoveryError(f"block {c.path!r} returned {describe(c.output)}, no tensor")
        modules.append(RecordedCall(blocks[int(c.path.rsplit('.', 1)[1])], *_with_slot(c.args, c.kwargs, h), pick=0))
        names.append(c.path)
        prev = outs[0]
    # the prologue: the modules that ran before block 0, in a pruned copy of the model
    before = rec.outermost([c for c in rec.calls if c.end < calls[0].start])
    keep = {c.path for c in before}
    skeleton = prune(model, keep, block_path, Stop(pos))
    prologue = Prologue(skeleton, *_with_slot(args, kwargs, x))
    # the epilogue: the outermost modules that ran after the last block, each fed the previous output
    tail_names: list[str] = []
    by_path = dict(model.named_modules())
    for c in rec.outermost([c for c in rec.calls if c.start > calls[-1].end]):
        inputs = tensor_leaves((c.args, c.kwargs))
        if len(inputs) != 1 or not _same(inputs[0], prev):
            raise DiscoveryError(f"module {c.path!r} after the last block is not fed the previous module's output "
                                 f"alone (it received {', '.join(describe(v) for v in inputs) or 'no tensor'}): "
                                 "the model computes between its final modules")
        outs = tensor_leaves(c.output)
        if len(outs) != 1:
            raise DiscoveryError(f"module {c.path!r} returned {describe(c.output)}; a layer must return one tensor")
        modules.append(RecordedCall(by_path[c.path], *_with_slot(c.args, c.kwargs, inputs[0]), pick=0))
        tail_names.append(c.path)
        prev = outs[0]
    pro_name = _short("+".join(c.path for c in before) or "prologue")
    all_names = [pro_name] + names + tail_names
    return _finish(model, [prologue] + modules, all_names, x, f"blocks at {block_path}",
                   _output_loss(rec.output, prev, loss, all_names[-1]))


def _other_values(model: nn.Module, args: tuple, kwargs: dict, x: torch.Tensor, block_path: str,
                  n: int) -> list[_CallRec]:
    """The block calls of the same forward on a batch with other values (the blocks' other arguments must not
    change with them; fake tensors have no values to change, so a fake profile skips this check)."""
    x2 = x + torch.randn_like(x) if x.is_floating_point() else (x + 1) % (int(x.max()) + 1)  # ids stay in range
    leaves, spec = pytree.tree_flatten((args, kwargs))
    args2, kwargs2 = pytree.tree_unflatten([x2 if l is x else l for l in leaves], spec)
    return _seeded(_record, model, args2, kwargs2).block_calls(block_path, n)


def _seeded(fn: Callable, *args: Any) -> Any:
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


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _output_loss(output: Any, last: torch.Tensor, loss: Callable | None, last_name: str) -> Callable | None:
    """The loss of the last layer's tensor: ``loss`` of the model's output rebuilt around it."""
    if loss is None:
        return None
    if isinstance(output, torch.Tensor):
        if not _same(output, last):
            raise DiscoveryError(f"the model returns {describe(output)}, not the output of its last module "
                                 f"{last_name!r}")
        return loss
    leaves = pytree.tree_leaves(output)
    hits = [i for i, l in enumerate(leaves) if isinstance(l, torch.Tensor) and _same(l, last)]
    if not hits:
        raise DiscoveryError(f"none of the model's outputs ({describe(output)}) is the output of its last "
                             f"module {last_name!r}")
    return RebuiltLoss.around(loss, output, hits[:1])


# ---------------------------------------------------------------------------------------------
# route 3: a traced graph, one layer per block or top-level module (workbench.profiles.traced)
# ---------------------------------------------------------------------------------------------
def _traced_route(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None) -> Layers:
    x = _chain_input(args, kwargs)
    modules, names, chain_loss, note = traced_layers(model, args, kwargs, x, loss)
    return _finish(model, modules, names, x, "traced graph" + note, chain_loss)


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def discover_layers(model: nn.Module | Sequence[nn.Module], example_inputs: Any, loss: Callable | None = None,
                    target: Any = None, *, verify: bool = True) -> Layers:
    """The chain of ``model`` on ``example_inputs`` (see the module docstring for the routes).

    ``loss(model_output, target)`` is the training loss; :attr:`Layers.loss` is the same loss of
    the last layer's tensor. With ``verify`` the chain is run on the example batch and must give
    the model's loss (or output) to rounding.
    """
    if isinstance(model, (list, tuple)):
        mods = list(model)
        for i, m in enumerate(mods):
            if not isinstance(m, nn.Module):
                raise TypeError(f"layer {i} is a {type(m).__name__}, not a torch.nn.Module")
        x = example_inputs
        return _finish(None, mods, [f"layer{i}" for i in range(len(mods))], x, "list", loss)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Sequential):
        named = list(model.named_children())
        return _finish(model, [m for _, m in named], [n for n, _ in named], example_inputs, "sequential", loss)
    args, kwargs = _split_inputs(example_inputs)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}  # discovery must not move BatchNorm stats
    try:
        errors = []
        for route in ("blocks", "traced"):
            try:
                found = (_blocks_route(model, args, kwargs, loss, target) if route == "blocks"
                         else _traced_route(model, args, kwargs, loss))
                if verify:      # a chain that misses what the loss needs falls to the next route
                    _verify(model, found, args, kwargs, loss, target)
                return found
            except DiscoveryError as e:
                errors.append(f"{'repeated blocks' if route == 'blocks' else 'traced graph'}: {e}")
            except ModelFailure:
                raise
            except Exception:
                with torch.random.fork_rng():   # the model itself fails on its example: say so (the user's code)
                    _own_loss(model, args, kwargs, loss, target)
                raise
        raise DiscoveryError(f"cannot split {type(model).__name__} into layers; " + "; ".join(errors))
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])


def _own_loss(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None, target: Any) -> torch.Tensor:
    """The model's own loss (or first output tensor) on the example; a :class:`ModelFailure` when its forward
    or the loss raises (the user's code failed, not discovery)."""
    try:
        out = model(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - whatever the user's forward raises is theirs
        raise ModelFailure("the model's forward on the example inputs") from e
    if loss is None:
        return tensor_leaves(out)[0]
    try:
        return loss(out, target)
    except Exception as e:  # noqa: BLE001 - the user's loss on the model's own output
        raise ModelFailure(f"the loss on the model's own output ({describe(out)})") from e


def _chain_loss(found: Layers, h: torch.Tensor, target: Any) -> torch.Tensor:
    """The loss of the chain's last tensor; when the loss fails on the rebuilt output, one line saying what it
    got and how to adapt it (the loss already worked on the model's own output)."""
    assert found.loss is not None
    try:
        return found.loss(h, target)
    except Exception as e:  # noqa: BLE001 - the user's loss may fail in any way; say what it was given
        if not isinstance(found.loss, RebuiltLoss):
            raise
        raise DiscoveryError(f"the loss got {found.loss.given()} and failed ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0]}): compute the loss from "
                             f"{found.loss.carried()} alone (only the last layer's output reaches the loss)") from None


def _verify(model: nn.Module, found: Layers, args: tuple, kwargs: dict, loss: Callable | None, target: Any) -> None:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        want = _own_loss(model, args, kwargs, loss, target)
        torch.manual_seed(0)
        h = found.input
        for name, m in zip(found.names, found.modules):
            h = m(h)
            if not isinstance(h, torch.Tensor):
                raise DiscoveryError(f"layer {name!r} returned {describe(h)}, not one tensor")
        got = _chain_loss(found, h, target) if found.loss is not None else h
    close = _fake(got) or torch.allclose(got.detach().float(), want.detach().float(), rtol=1e-4, atol=1e-5)
    if want.shape != got.shape or not close:
        raise DiscoveryError(f"the {len(found)} layers found ({found.how}) run one after the other do not give the "
                             f"model's {'loss' if loss is not None else 'output'}: the model's forward does "
                             "something the layers leave out")
