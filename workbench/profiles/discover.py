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
   head); where several tensors cross a boundary they are packed into one;
4. otherwise the model **cut at module names** (:mod:`workbench.profiles.cuts`: ``torch.export``
   and torch's ``pipe_split`` markers): before every repeated block and every module with
   parameters after them (a loss computed in the forward from ``labels=``, an encoder-decoder,
   code after the head). ``split_at`` (``--split-at``) names the modules instead: that route alone.

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

from typing import Any, Callable, Sequence

import torch
from torch import nn

from workbench.profiles.blocks_route import blocks_route, record_calls, seeded
from workbench.profiles.cuts import check_split_names, cut_layers, suggest_split_at
from workbench.profiles.found import Layers, Tie, chain_input, find_ties, finish_layers, is_fake_tensor, split_inputs
from workbench.profiles.traced import traced_layers
from workbench.profiles.wrappers import (
    DiscoveryError,
    ModelFailure,
    RebuiltLoss,
    check_scalar_loss,
    describe,
    tensor_leaves,
)

__all__ = ["Tie", "Layers", "DiscoveryError", "ModelFailure", "discover_layers", "find_ties"]


# ---------------------------------------------------------------------------------------------
# route 3: a traced graph, one layer per block or top-level module (workbench.profiles.traced)
# ---------------------------------------------------------------------------------------------
def _traced_route(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None) -> Layers:
    x = chain_input(args, kwargs)
    modules, names, chain_loss, note = traced_layers(model, args, kwargs, x, loss)
    return finish_layers(model, modules, names, x, "traced graph" + note, chain_loss)


# ---------------------------------------------------------------------------------------------
# route 4: the model cut at module names (workbench.profiles.cuts): --split-at, or every block
# ---------------------------------------------------------------------------------------------
def _cut_route(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None, target: Any,
               names: Sequence[str]) -> Layers:
    x = chain_input(args, kwargs)
    modules, layer_names, chain_loss = cut_layers(model, args, kwargs, loss, names, target)
    shown = ", ".join(names) if len(names) <= 4 else f"{names[0]}, {names[1]}, ..., {names[-1]}"
    return finish_layers(model, modules, layer_names, x, f"exported graph cut before {len(names)} modules ({shown})",
                   chain_loss)


def _suggested_cuts(model: nn.Module, args: tuple, kwargs: dict) -> tuple[str, ...]:
    rec = seeded(record_calls, model, args, kwargs)
    return suggest_split_at(model, [(c.path, c.start, c.end) for c in rec.calls])


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def discover_layers(model: nn.Module | Sequence[nn.Module], example_inputs: Any, loss: Callable | None = None,
                    target: Any = None, *, verify: bool = True, split_at: Sequence[str] | None = None) -> Layers:
    """The chain of ``model`` on ``example_inputs`` (see the module docstring for the routes).

    ``loss(model_output, target)`` is the training loss; :attr:`Layers.loss` is the same loss of
    the last layer's tensor. With ``verify`` the chain is run on the example batch and must give
    the model's loss (or output) to rounding. ``split_at``: module names to cut the model before
    (:mod:`workbench.profiles.cuts`), the only route then tried.
    """
    if isinstance(model, (list, tuple)):
        mods = list(model)
        for i, m in enumerate(mods):
            if not isinstance(m, nn.Module):
                raise TypeError(f"layer {i} is a {type(m).__name__}, not a torch.nn.Module")
        x = example_inputs
        return finish_layers(None, mods, [f"layer{i}" for i in range(len(mods))], x, "list", loss)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if split_at:
        check_split_names(model, split_at)
    elif isinstance(model, nn.Sequential):
        named = list(model.named_children())
        return finish_layers(model, [m for _, m in named], [n for n, _ in named], example_inputs, "sequential", loss)
    args, kwargs = split_inputs(example_inputs)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}  # discovery must not move BatchNorm stats
    try:
        return _first_route(model, args, kwargs, loss, target, verify, split_at)
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])


_ROUTES = {"blocks": "repeated blocks", "traced": "traced graph", "cuts": "cut at the blocks"}


def _first_route(model: nn.Module, args: tuple, kwargs: dict, loss: Callable | None, target: Any, verify: bool,
                 split_at: Sequence[str] | None) -> Layers:
    """The chain of the first route that finds one (only the cuts at ``split_at`` when given)."""
    errors = []
    for route in ("cuts",) if split_at else ("blocks", "traced", "cuts"):
        what = _ROUTES[route]
        try:
            if route == "blocks":
                found = blocks_route(model, args, kwargs, loss, target)
            elif route == "traced":
                found = _traced_route(model, args, kwargs, loss)
            else:
                names = tuple(split_at or ()) or _suggested_cuts(model, args, kwargs)
                if not names:
                    raise DiscoveryError("no list of repeated blocks to cut at")
                what = f"{what} (--split-at {','.join(names)})" if not split_at else what
                found = _cut_route(model, args, kwargs, loss, target, names)
            if verify:      # a chain that misses what the loss needs falls to the next route
                _verify(model, found, args, kwargs, loss, target)
            return found
        except DiscoveryError as e:
            if split_at:    # the cuts named: their reason alone, saying which option it is about
                said = str(e) if str(e).startswith("--split-at") else f"--split-at {','.join(split_at)}: {e}"
                raise DiscoveryError(said) from None
            errors.append(f"{what}: {e}")
        except ModelFailure:
            raise
        except Exception:
            with torch.random.fork_rng():   # the model itself fails on its example: say so (the user's code)
                _own_loss(model, args, kwargs, loss, target)
            raise
    raise DiscoveryError(f"cannot split {type(model).__name__} into layers; " + "; ".join(errors)
                         + "; name the modules to cut before: --split-at NAME,NAME,... (model.named_modules() "
                         "names them)")


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
        value = loss(out, target)
    except Exception as e:  # noqa: BLE001 - the user's loss on the model's own output
        raise ModelFailure(f"the loss on the model's own output ({describe(out)})") from e
    check_scalar_loss(value, f"on the model's own output ({describe(out)})")
    return value


def _chain_loss(found: Layers, h: torch.Tensor, target: Any) -> torch.Tensor:
    """The loss of the chain's last tensor; when the loss fails on the rebuilt output, one line saying what it
    got and how to adapt it (the loss already worked on the model's own output)."""
    assert found.loss is not None
    try:
        value = found.loss(h, target)
    except Exception as e:  # noqa: BLE001 - the user's loss may fail in any way; say what it was given
        if not isinstance(found.loss, RebuiltLoss):
            raise
        raise DiscoveryError(f"the loss got {found.loss.given()} and failed ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0]}): compute the loss from "
                             f"{found.loss.carried()} alone (only the last layer's output reaches the loss)") from None
    if not isinstance(value, torch.Tensor) and isinstance(found.loss, RebuiltLoss):
        raise DiscoveryError(f"the loss got {found.loss.given()} and returned {describe(value)}: compute the loss "
                             f"from {found.loss.carried()} alone (only the last layer's output reaches the loss)")
    return value


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
    close = is_fake_tensor(got) or torch.allclose(got.detach().float(), want.detach().float(), rtol=1e-4, atol=1e-5)
    if want.shape != got.shape or not close:
        raise DiscoveryError(f"the {len(found)} layers found ({found.how}) run one after the other do not give the "
                             f"model's {'loss' if loss is not None else 'output'}: the model's forward does "
                             "something the layers leave out")
