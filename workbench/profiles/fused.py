"""Fused kernels in a fake profile: a decoder's norms, rotary embedding, MLP activation and loss as one kernel each.

A Hugging Face model in eager mode runs its RMSNorm as six kernels in float32 (cast, square, mean, add-rsqrt,
multiply, cast back, scale) and saves the float32 intermediates for the backward; its rotary embedding as a
dozen elementwise kernels, SwiGLU as three, the cross-entropy as a log-softmax and a gather. Frameworks that
train large models run each of these as one kernel: Transformer Engine's fused RMSNorm/LayerNorm (bf16 in and
out, float32 math in registers, saving the input and ``rstd``), fused RoPE, fused SwiGLU / squared ReLU / GeLU,
Megatron-Core's fused (vocabulary-parallel) cross-entropy; Liger and ``torch.compile`` do the same.

A profile with ``kernels="fused"`` (:func:`fused_kernels`, used by :func:`workbench.profiles.fake.fake_profile`
and the tensor-parallel profiles) runs each such operation as a ``torch.autograd.Function``
(:func:`fused_apply`) whose forward computes the same eager math, without autograd and with the profiler's
recording suspended (:func:`suspended`: the :class:`~workbench.profiles.roofline.WorkCounter` records nothing,
the :class:`~workbench.profiles.memtrace.AllocationTracker` counts nothing), then

* records ONE memory-bound kernel whose bytes are the fused kernel's inputs and outputs (and statistics it
  writes, a norm's ``rstd``);
* counts as allocated only its outputs and those statistics (the tracker adopts them), and saves for the
  backward only what the fused kernel saves (a norm: its input, weight and statistics; SwiGLU: its two inputs;
  rotary: ``cos`` and ``sin``; the cross-entropy: its logits, which Megatron overwrites with the softmax);

and whose backward recomputes the gradient the same way (the eager math again under ``enable_grad``, suspended;
rotary: the rotation by minus the angle) and records ONE kernel of the incoming gradients, the saved tensors and
the gradients it writes. On ``DTensor`` inputs (tensor parallelism) the math runs through ``DTensor``, and bytes
are counted on the local shards, and the sequence-parallel all-gathers and reduce-scatters run as Megatron-Core's
on its sequence-first activations, without torch's reorder copies
(:mod:`workbench.parallel.tensor.sequence_first`). Under ``fused`` the attention kernel is priced at cuDNN's fused
attention rate on an H100 (:mod:`workbench.profiles.kernel_time`, ``attention_fused``).

>>> x = torch.randn(4, 8, requires_grad=True)
>>> y = fused_apply("square", lambda t: t * t, (x,), save=(0,))
>>> y.backward(torch.ones(4, 8)); bool(torch.allclose(x.grad, 2 * x))
True
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from workbench.profiles.recording import dispatch_modes, is_suspended, suspended

__all__ = ["KERNELS", "fused_kernels", "fused_apply", "suspended", "is_suspended", "fused_active",
           "attention_kind", "patched_modules", "check_kernels"]

#: the settings of a fake profile's ``kernels``: Hugging Face's eager kernels, or the fused ones of this module
KERNELS = ("eager", "fused")

_state = {"fused": 0}


def check_kernels(kernels: str) -> str:
    """``kernels`` if it is one of :data:`KERNELS`, else ``ValueError`` naming them.

    >>> check_kernels("fused")
    'fused'
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels {kernels!r}: known: {', '.join(KERNELS)}")
    return kernels


def fused_active() -> bool:
    """Whether a :func:`fused_kernels` context is open (the attention kernel is then the fused one)."""
    return _state["fused"] > 0


def attention_kind() -> str:
    """The kernel kind of an attention operation: ``attention_fused`` inside :func:`fused_kernels`."""
    return "attention_fused" if fused_active() else "attention"


def _local_bytes(t: torch.Tensor) -> float:
    from workbench.profiles.local import local_bytes

    return float(local_bytes(t))


def _kernel(name: str, tensors: Sequence[torch.Tensor | None], created: Sequence[torch.Tensor]) -> None:
    """Tell the active dispatch modes about one fused kernel: ``tensors`` it reads and writes (each once),
    ``created`` the new storages it leaves allocated."""
    distinct = list({id(t): t for t in tensors if isinstance(t, torch.Tensor)}.values())
    nbytes = sum(_local_bytes(t) for t in distinct)
    dtype = next((t.dtype for t in distinct if t.is_floating_point()), torch.float32)
    for mode in dispatch_modes():
        if hasattr(mode, "record_fused"):
            mode.record_fused(name, nbytes, dtype)
        if hasattr(mode, "adopt"):
            mode.adopt([t for t in created if isinstance(t, torch.Tensor)])


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class _Fused(torch.autograd.Function):
    """The autograd function of :func:`fused_apply` (its docstring)."""

    @staticmethod
    def forward(ctx: Any, spec: dict, *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        with suspended(), torch.no_grad():
            if spec["stats"] is True:                  # the math returns (outputs, statistics)
                outs, stats = spec["math"](*inputs)
                stats = tuple(stats)
            else:
                outs = spec["math"](*inputs)
                stats = tuple(spec["stats"](*inputs)) if spec["stats"] else ()
        out_t = _as_tuple(outs)
        _kernel(spec["name"], (*inputs, *out_t, *stats), (*out_t, *stats))
        ctx.spec, ctx.n_stats = spec, len(stats)
        ctx.input_grads = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
        keep = [inputs[i] for i in spec["save"]]
        ctx.save_for_backward(*keep, *stats)
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:  # type: ignore[override]
        spec = ctx.spec
        saved = ctx.saved_tensors
        kept, stats = saved[:len(saved) - ctx.n_stats], saved[len(saved) - ctx.n_stats:]
        with suspended():
            if spec["backward"] is not None:
                with torch.no_grad():
                    got = tuple(spec["backward"](kept, stats, grads))
            else:
                got = _recomputed(spec["math"], kept, spec["save"], ctx.input_grads, grads)
        _kernel(spec["name"] + "_backward", (*grads, *saved, *got), got)
        return (None, *got)


def _recomputed(math: Callable, kept: Sequence[torch.Tensor], save: Sequence[int], needs: Sequence[bool],
                grads: Sequence[torch.Tensor]) -> tuple:
    """Gradients of ``math`` at the saved inputs (every input is saved: ``save`` names them all)."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(needs[i]) if t.is_floating_point() else t.detach()
                  for i, t in zip(save, kept)]
        outs = _as_tuple(math(*leaves))
        wanted = [leaf for i, leaf in zip(save, leaves) if needs[i]]
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
    return tuple(next(found) if needs[i] else None for i in save)


def fused_apply(name: str, math: Callable, inputs: Sequence[Any], *, save: Sequence[int],
                stats: Callable | None = None, backward: Callable | None = None) -> Any:
    """``math(*inputs)`` as one fused kernel (module docstring). ``save``: the indices of the inputs the fused
    kernel keeps for its backward (all of them, in order, when ``backward`` is None: the gradient is recomputed);
    ``stats(*inputs)``: the new tensors it also writes and keeps (a norm's ``rstd``), or True when ``math`` returns
    (outputs, those tensors); ``backward(kept, stats, grads)``: the gradients of every input from the kept inputs
    and the statistics, when not recomputed."""
    if backward is None and list(save) != list(range(len(inputs))):
        raise ValueError(f"fused {name}: a recomputed backward needs every input saved")
    spec = {"name": name, "math": math, "save": tuple(save), "stats": stats, "backward": backward}
    return _Fused.apply(spec, *inputs)


# ----------------------------------------------------------------------------------------------------- the model


def _norm_forward(mod: nn.Module, original: Callable) -> Callable:
    """A norm module's forward as one fused kernel: input and parameters in, output out; saves the input, the
    parameters and one float32 statistic per row (RMSNorm's ``rstd``) or two (LayerNorm's mean and ``rstd``)."""
    names = [n for n, p in mod.named_parameters(recurse=False) if p is not None]
    rows = 1 if "rms" in type(mod).__name__.lower() else 2

    def math(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        before = {n: mod._parameters[n] for n in names}
        try:
            mod._parameters.update(zip(names, params))
            return original(x)
        finally:
            mod._parameters.update(before)

    def stats(x: torch.Tensor, *params: torch.Tensor) -> tuple:
        return tuple(x[..., :1].to(torch.float32, copy=True) for _ in range(rows))

    def forward(x: torch.Tensor) -> torch.Tensor:
        params = [mod._parameters[n] for n in names]
        return fused_apply(type(mod).__name__, math, (x, *params), save=range(1 + len(params)), stats=stats)

    return forward


def _gated_mlp_forward(mod: nn.Module) -> Callable:
    """``down(act(gate(x)) * up(x))`` with ``act(gate) * up`` one fused kernel (TE's SwiGLU: saves its input)."""
    act = mod.act_fn

    def glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return act(gate) * up

    def forward(x: torch.Tensor) -> torch.Tensor:
        return mod.down_proj(fused_apply("glu", glu, (mod.gate_proj(x), mod.up_proj(x)), save=(0, 1)))

    return forward


def _activation_forward(original: Callable) -> Callable:
    """An activation module's forward as one fused kernel (saves its input)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        return fused_apply("activation", original, (x,), save=(0,))

    return forward


def _rotary(original: Callable) -> Callable:
    """Hugging Face's ``apply_rotary_pos_emb(q, k, cos, sin, ...)`` as one fused kernel (TE's fused RoPE): saves
    ``cos`` and ``sin``; its backward is the rotation by minus the angle (the transpose of a rotation)."""

    def fused(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *args: Any, **kwargs: Any
              ) -> Any:
        if cos.requires_grad or sin.requires_grad:
            return original(q, k, cos, sin, *args, **kwargs)

        def math(q_: torch.Tensor, k_: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> Any:
            return tuple(original(q_, k_, c, s, *args, **kwargs))

        def backward(kept: Sequence[torch.Tensor], stats: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]
                     ) -> tuple:
            c, s = kept
            gq, gk = original(grads[0], grads[1], c, -s, *args, **kwargs)
            return gq, gk, None, None

        return fused_apply("rotary", math, (q, k, cos, sin), save=(2, 3), backward=backward)

    return fused


#: ``reduction`` as aten's loss operations take it
_REDUCTION = {"none": 0, "mean": 1, "sum": 2}


def _cross_entropy(original: Callable) -> Callable:
    """``torch.nn.functional.cross_entropy`` of 2-d logits and class targets as one fused kernel (Megatron-Core's
    fused cross-entropy, which saves the softmax, logits-sized, in float32): saves the log-softmax and the targets;
    the backward runs aten's ``nll_loss_backward`` and ``_log_softmax_backward_data`` on them (under torch's
    ``loss_parallel``, the vocabulary-parallel backward, without collectives). Other uses: the original."""

    def fused(input: torch.Tensor, target: torch.Tensor, weight: Any = None, size_average: Any = None,
              ignore_index: int = -100, reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0
              ) -> torch.Tensor:
        plain = (weight is None and size_average is None and reduce is None and label_smoothing == 0.0
                 and input.dim() == 2 and not target.is_floating_point())
        if not plain:
            return original(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)

        aten, code = torch.ops.aten, _REDUCTION[reduction]

        def math(logits: torch.Tensor, tgt: torch.Tensor) -> tuple:
            lsm = aten._log_softmax(logits, 1, False)
            loss, total = aten.nll_loss_forward(lsm, tgt, None, code, ignore_index)
            return loss, (lsm, total)

        def backward(kept: Sequence[torch.Tensor], stats: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]
                     ) -> tuple:
            (tgt,), (lsm, total) = kept, stats
            g = aten.nll_loss_backward(grads[0], lsm, tgt, None, code, ignore_index, total)
            return aten._log_softmax_backward_data(g, lsm, 1, lsm.dtype), None

        return fused_apply("cross_entropy", math, (input, target), save=(1,), stats=True, backward=backward)

    return fused


def patched_modules(model: nn.Module) -> list[tuple[Any, str, Any]]:
    """(object, attribute, replacement) of every patch :func:`fused_kernels` makes in ``model``: its norms
    (a class named ``*RMSNorm``, ``*LayerNorm*``, or ``nn.LayerNorm``), its gated MLPs (``gate_proj``,
    ``up_proj``, ``down_proj``, ``act_fn``), the activation of its other MLPs (``act_fn`` or ``act``), and the
    ``apply_rotary_pos_emb`` of the modules that define its classes."""
    patches: list[tuple[Any, str, Any]] = []
    rotary_modules: dict[str, types.ModuleType] = {}
    for mod in model.modules():
        name = type(mod).__name__.lower()
        if isinstance(mod, nn.LayerNorm) or name.endswith("rmsnorm") or "layernorm" in name:
            if len(list(mod.children())) == 0:
                patches.append((mod, "forward", _norm_forward(mod, type(mod).forward.__get__(mod))))
        elif all(hasattr(mod, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            patches.append((mod, "forward", _gated_mlp_forward(mod)))
        else:
            for attr in ("act_fn", "act"):
                act = getattr(mod, attr, None)
                if isinstance(act, nn.Module) and len(list(act.children())) == 0 and not list(act.parameters()):
                    patches.append((act, "forward", _activation_forward(type(act).forward.__get__(act))))
        home = sys.modules.get(type(mod).__module__)
        if home is not None and callable(getattr(home, "apply_rotary_pos_emb", None)):
            rotary_modules[home.__name__] = home
    for home in rotary_modules.values():
        patches.append((home, "apply_rotary_pos_emb", _rotary(home.apply_rotary_pos_emb)))
    return patches


@contextlib.contextmanager
def fused_kernels(model: nn.Module | None, kernels: str = "fused") -> Iterator[None]:
    """Inside, ``model`` runs its norms, gated MLP or activation, rotary embedding and cross-entropy as fused
    kernels, attention is the fused kernel and the sequence-parallel collectives reorder nothing (module
    docstring); ``kernels="eager"``: nothing changes.

    >>> lin = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    >>> with fused_kernels(lin):
    ...     type(lin[1].forward).__name__, fused_active()
    ('function', True)
    >>> type(lin[1].forward).__name__, fused_active()
    ('method', False)
    """
    if check_kernels(kernels) == "eager":
        yield
        return
    patches = patched_modules(model) if model is not None else []
    f = torch.nn.functional
    patches.append((f, "cross_entropy", _cross_entropy(f.cross_entropy)))
    undo = []
    for obj, attr, new in patches:
        undo.append((obj, attr, obj.__dict__.get(attr, _MISSING) if hasattr(obj, "__dict__") else _MISSING))
        setattr(obj, attr, new)
    _state["fused"] += 1
    try:
        with _sequence_first():
            yield
    finally:
        _state["fused"] -= 1
        for obj, attr, old in reversed(undo):
            if old is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)


_MISSING = object()


def _sequence_first() -> contextlib.AbstractContextManager:
    """Megatron-Core's sequence-parallel collectives (:mod:`workbench.parallel.tensor.sequence_first`), where
    torch.distributed is built."""
    if not torch.distributed.is_available():
        return contextlib.nullcontext()
    from workbench.parallel.tensor.sequence_first import sequence_first_collectives

    return sequence_first_collectives()
