"""The profiler: per-layer times and memory of a chain of ``torch.nn`` modules.

:func:`profile_model` runs the layers one after another on a sample input
and measures, for each layer ``l``:

* ``forward``: the layer's forward (autograd recording, as in training);
* ``backward``: the layer's backward alone. The layer's forward is run on a
  detached copy of its input (a leaf with ``requires_grad``, except for the
  first layer, whose input is data and needs no gradient), then
  ``torch.autograd.backward(out, grad)`` is timed with a fixed random
  ``grad`` of ``out``'s shape. Parameter gradients are reset to ``None``
  before each repeat, so every backward allocates them afresh. With a
  ``loss`` (``profile_zoo`` passes the model's), the last layer is measured
  with it: its forward ends in the scalar loss, its backward starts there,
  and what the loss saves (on a language model's head, the log-softmax of
  the logits, as large as the logits) is in its ``saved_bytes``; without
  one, the loss is in no layer.
* times: ``warmup`` untimed runs, then the median of ``repeats`` timed runs
  (on CPU with ``torch.set_num_threads(threads)``, ``time.perf_counter`` or, with
  ``clock="cpu"``, the thread's CPU time ``time.thread_time``: the layer on a core of
  its own, whatever else shares the machine; CUDA events and synchronisation on a GPU);
* ``weight_bytes``: bytes of the layer's parameters;
* ``activation_bytes``: bytes of its output tensor (what is sent to the next
  layer, and the size of the gradient sent back);
* the memory model's columns (``forward_peak_bytes``, ``backward_peak_bytes``,
  ``saved_input_bytes``, ``saved_output_bytes``, ``grad_bytes``,
  ``max_param_bytes``), measured at the allocator level by
  :func:`workbench.profiles.memtrace.layer_memory` on one extra forward and
  backward;
* the backward's split (``backward_weight``, ``weight_pending_bytes``: docs/model.md, "Backward split"),
  measured by :func:`workbench.profiles.split.layer_split` with torch's own ``stage_backward_input`` and
  ``stage_backward_weight`` (when the times are measured; a fake profile estimates it);
* ``saved_bytes``: bytes autograd keeps from the forward until the backward,
  counted with ``torch.autograd.graph.saved_tensors_hooks``: every saved
  tensor's *storage* counted once (deduplicated by device and
  the storage's identity, ``untyped_storage()._cdata``: fake tensors have
  storages but no data pointers; each storage's full ``nbytes()``).
  Storages that belong to the layer's parameters or buffers are excluded:
  they are model state, already in ``weight_bytes`` (e.g. ``Linear`` saves
  its weight for the input gradient). The layer's input counts when the
  layer saves it; so a layer that saves its own output (``ReLU``) counts it
  too. Each layer is measured alone, so when layer ``l+1`` saves its input,
  which is layer ``l``'s output that layer ``l`` also saved, a stage
  holding both would keep one copy where the sum of ``saved_bytes``
  counts two: the sum is an upper bound.

In torch 2.13, for ``Linear(i, o)`` then ``ReLU`` on a batch of ``b``
float32 rows, autograd saves the Linear's input (``4*b*i`` bytes) and its
weight (excluded), and the ReLU's output (``4*b*o`` bytes).

Precision: ``dtype`` (e.g. ``torch.bfloat16`` or ``"bfloat16"``) profiles
the chain in *pure* low precision: every layer's parameters and buffers and a
floating sample input are cast to it (integer inputs, such as token ids,
stay as they are); the metadata's ``dtype`` is the parameters' dtype. All
bytes above are then the bytes of that dtype (a bfloat16 activation is half
a float32 one).

The spread of the repeats is kept: per layer ``(max - min) / median`` of
the timed repeats; the metadata records the median and the maximum over
layers (``spread_forward``, ``spread_backward``, ...), and
``return_stats=True`` also returns every raw time.

>>> import torch
>>> chain = profile_model(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()),
...                       torch.zeros(2, 8), repeats=2, warmup=0)
>>> [(l.name, l.weight_bytes, l.activation_bytes, l.saved_bytes) for l in chain.layers]
[('0', 144.0, 32.0, 64.0), ('1', 0.0, 32.0, 32.0)]
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from workbench.model.chain import Chain, Layer
from workbench.profiles.discover import Layers, discover_layers
from workbench.profiles.local import local_parts, parameter_bytes, storage_keys, tensor_bytes
from workbench.profiles.memtrace import layer_memory
from workbench.profiles.split import layer_split
from workbench.profiles.tied_counts import count_ties_once
from workbench.profiles.timing import CLOCKS, Timer, cpu_threads, leaf, say_how_long, time_layer
from workbench.profiles.wrappers import check_scalar_loss, model_call
from workbench.profiles.zoo import as_dtype

__all__ = [
    "LayerTiming",
    "profile_model",
    "profile_zoo",
    "saved_tensor_bytes",
    "tensor_bytes",
    "parameter_bytes",
    "spread_summary",
    "profile_workload",
]


@dataclass(frozen=True)
class LayerTiming:
    """The raw timed repeats of one layer, in seconds."""

    name: str
    forward: tuple[float, ...]
    backward: tuple[float, ...]

    @staticmethod
    def _spread(xs: Sequence[float]) -> float:
        med = statistics.median(xs)
        return (max(xs) - min(xs)) / med if med > 0 else 0.0

    @property
    def forward_spread(self) -> float:
        """``(max - min) / median`` of the forward repeats."""
        return self._spread(self.forward)

    @property
    def backward_spread(self) -> float:
        """``(max - min) / median`` of the backward repeats."""
        return self._spread(self.backward)


def saved_tensor_bytes(module: nn.Module, x: torch.Tensor, *, input_requires_grad: bool = True,
                       then: Callable[[torch.Tensor], torch.Tensor] | None = None,
                       where: str | None = None) -> tuple[int, torch.Tensor]:
    """Run ``module(x)`` once and return (bytes autograd saved for backward, output).

    Saved tensors are deduplicated by storage; storages of the module's
    parameters and buffers are excluded (see the module docstring). With
    ``then`` (a loss of the output), what ``then(output)`` saves counts too.
    ``where`` (a layer's name): what the module or ``then`` raises becomes a
    :class:`~workbench.profiles.wrappers.ModelFailure` naming it (:func:`~workbench.profiles.wrappers.model_call`).

    >>> n, out = saved_tensor_bytes(torch.nn.ReLU(), torch.ones(2, 3))
    >>> n   # ReLU saves its output: 6 float32
    24
    """
    excluded = {k for t in list(module.parameters()) + list(module.buffers()) for k in storage_keys(t)}
    storages: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for part in local_parts(t):
            try:
                st = part.untyped_storage()
            except (RuntimeError, NotImplementedError):  # e.g. tensors without a storage
                continue
            key = (str(part.device), st._cdata)
            if key not in excluded:
                storages[key] = st.nbytes()
        return t

    inp = leaf(x, input_requires_grad)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model_call(module, inp, where and f"{where}'s forward on the previous layer's output")
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"a chain layer must return one tensor, got {type(out).__name__}")
        if then is not None:
            check_scalar_loss(model_call(then, out, where and f"the loss on {where}'s output"),
                              f"on {where or 'the last layer'}'s output")
    return sum(storages.values()), out


def spread_summary(stats: Sequence[LayerTiming]) -> dict[str, float]:
    """Median and maximum over layers of the per-layer relative spread ``(max - min) / median``.

    >>> round(spread_summary([LayerTiming("a", (1.0, 1.1, 1.2), (2.0, 2.0, 2.0))])["spread_forward"], 4)
    0.1818
    """
    f = [s.forward_spread for s in stats]
    b = [s.backward_spread for s in stats]
    return {
        "spread_forward": statistics.median(f),
        "spread_backward": statistics.median(b),
        "spread_forward_max": max(f),
        "spread_backward_max": max(b),
    }


def _find_layers(model: nn.Module | Sequence[nn.Module], example_inputs: Any, loss: Callable | None, target: Any,
                 names: Sequence[str] | None, split_at: Sequence[str] | None = None) -> Layers:
    """The chain of ``model`` (:func:`~workbench.profiles.discover.discover_layers`), renamed by ``names``."""
    if isinstance(model, (nn.Sequential, list, tuple)) and not isinstance(example_inputs, torch.Tensor):
        raise TypeError(f"sample_input must be a tensor, got {type(example_inputs).__name__}")
    if isinstance(model, (list, tuple, nn.Sequential)) and len(model) == 0:
        raise ValueError("nothing to profile: the layer list is empty")
    found = discover_layers(model, example_inputs, loss, target, split_at=split_at)
    if names is not None:
        names = [str(n) for n in names]
        if len(names) != len(found):
            raise ValueError(f"{len(names)} names for {len(found)} layers")
        renamed = dict(zip(found.names, names))        # the shared parameters' layers renamed too
        ties = tuple(dataclasses.replace(t, owner=renamed[t.owner], layers=tuple(renamed[n] for n in t.layers))
                     for t in found.tied)
        found = dataclasses.replace(found, names=tuple(names), tied=ties)
    return found


def profile_model(
    model: nn.Module | Sequence[nn.Module],
    example_inputs: Any,
    device: str | torch.device = "cpu",
    *,
    warmup: int = 2,
    repeats: int = 5,
    names: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
    threads: int | None = 1,
    return_stats: bool = False,
    grad_seed: int = 0,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    times: Callable[..., tuple[list[float], list[float]]] = time_layer,
    clock: str = "wall",
    split_at: Sequence[str] | None = None,
) -> Chain | tuple[Chain, list[LayerTiming]]:
    """Profile any model (see the module docstring for what is measured).

    ``model`` is an ``nn.Sequential`` or a list of modules (the chain's layers), or any
    ``nn.Module``, whose layers :func:`~workbench.profiles.discover.discover_layers` finds on
    ``example_inputs`` (a tensor, a tuple or a dict; the first tensor enters the chain, the
    others are constants); ``loss(model_output, target)`` is then the model's loss. Shared
    parameters count once, at their first layer (:func:`count_ties_once`). The layers run in
    training mode and are moved to ``device``; each takes one tensor and returns one tensor.
    ``threads`` sets the CPU thread count while profiling (``None``: leave it). ``meta`` is merged over the
    metadata the profiler records (device, dtype, batch size, input shape, torch version, threads, repeats,
    spreads, date, source). With ``return_stats`` the raw timings come back too. ``loss(output, target)``
    makes the loss part of the last layer (its time and what it saves).
    ``dtype`` casts the layers and a floating ``sample_input`` first (None:
    leave them as they are). ``times`` gives each layer's forward and backward seconds, with
    :func:`~workbench.profiles.timing.time_layer`'s arguments: measured by default, estimated in a fake
    profile (:class:`workbench.profiles.roofline.RooflineTimes`, :mod:`workbench.profiles.fake`).
    ``clock`` is the CPU's clock (:data:`~workbench.profiles.timing.CLOCKS`): ``"wall"`` or ``"cpu"``, the
    thread's CPU time, which needs one thread (the others' work would not count). ``split_at``: the modules
    to cut before (``--split-at``, :mod:`workbench.profiles.cuts`).

    >>> c, stats = profile_model([torch.nn.Linear(4, 4)], torch.zeros(1, 4), repeats=3, warmup=0, return_stats=True)
    >>> len(stats[0].forward), c.layers[0].name
    (3, 'layer0')
    """
    _check_counts(repeats, warmup, loss, target)
    _check_clock(clock, device, threads)
    found = _find_layers(model, example_inputs, loss, target, names, split_at)
    mods, names, loss = list(found.modules), list(found.names), found.loss
    how, sample_input, tgt = _set_up(found.input, device, dtype, target, grad_seed, warmup, repeats, times, clock)
    started = time.perf_counter()
    out_layers: list[Layer] = []
    stats: list[LayerTiming] = []
    x = sample_input.to(how.dev)
    with cpu_threads(how.dev, threads):
        if progress and times is time_layer:
            say_how_long([_moved(m, how.dev, how.cast) for m in mods], x, how.warmup, how.repeats)
        for i in _layers_progress(len(mods), (meta or {}).get("network", "profile"), progress):
            with_loss = loss is not None and i == len(mods) - 1
            then = (lambda o: loss(o, tgt)) if with_loss else None  # type: ignore[misc]
            layer, timing, x = _profile_layer(how, mods[i], names[i], x, i > 0, then)
            out_layers.append(layer)
            stats.append(timing)
        nthreads = torch.get_num_threads()
    info = _profile_meta(how.dev, sample_input, mods, nthreads, warmup, repeats, loss is not None, stats,
                         time.perf_counter() - started, clock)
    if how.times is not time_layer:      # estimated times: the split is estimated too (workbench.model.split)
        info.pop("backward_split")
    info.update(meta or {})
    if split_at:
        info["split_at"] = ",".join(split_at)
    chain = Chain(tuple(out_layers), input_bytes=float(tensor_bytes(sample_input)),
                  meta={k: str(v) for k, v in info.items()})
    chain = count_ties_once(dataclasses.replace(chain, meta={"layers_found": found.how, **chain.meta}), found)
    return (chain, stats) if return_stats else chain


def _set_up(sample_input: torch.Tensor, device: str | torch.device, dtype: str | torch.dtype | None,
            target: torch.Tensor | None, grad_seed: int, warmup: int, repeats: int,
            times: Callable[..., tuple[list[float], list[float]]] = time_layer, clock: str = "wall"
            ) -> tuple[_LayerProfiling, torch.Tensor, torch.Tensor | None]:
    """How every layer is profiled, the sample input cast to ``dtype`` (when floating) and the target on the
    device; a CUDA device without CUDA is refused."""
    cast = None if dtype is None else as_dtype(dtype)
    if cast is not None and sample_input.is_floating_point():
        sample_input = sample_input.to(cast)
    dev = torch.device(device)
    tgt = target.to(dev) if target is not None else None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    how = _LayerProfiling(dev, cast, Timer(dev, clock), torch.Generator(device="cpu").manual_seed(grad_seed), warmup,
                          repeats, grad_seed, times)
    return how, sample_input, tgt


@dataclass(frozen=True)
class _LayerProfiling:
    """How :func:`profile_model` profiles every layer: the device, the dtype to cast to (or None), the
    timer, the generator of the output gradients, the warm-up and timed repeats, the memory probe's seed, what
    gives the times (measured: time_layer; estimated in a fake profile)."""

    dev: torch.device
    cast: torch.dtype | None
    timer: Timer
    gen: torch.Generator
    warmup: int
    repeats: int
    grad_seed: int
    times: Callable[..., tuple[list[float], list[float]]] = time_layer


def _profile_layer(how: _LayerProfiling, mod: nn.Module, name: str, x: torch.Tensor, needs_input_grad: bool,
                   then: Callable[[torch.Tensor], torch.Tensor] | None) -> tuple[Layer, LayerTiming, torch.Tensor]:
    """One layer on input ``x``: its :class:`~workbench.model.chain.Layer` row, its raw timings and its output
    (detached: the next layer's input). ``then`` (the loss) ends the last layer's forward; the others'
    backwards start from a random gradient drawn from ``how.gen``."""
    mod = _moved(mod, how.dev, how.cast).train()
    saved, out = saved_tensor_bytes(mod, x, input_requires_grad=needs_input_grad, then=then,
                                    where=f"layer {name} ({type(mod).__name__})")
    if not out.is_floating_point():
        raise TypeError(f"layer {name!r} returns a {out.dtype} tensor; its backward cannot be timed")
    grad = None if then is not None else torch.randn(out.shape, generator=how.gen, dtype=out.dtype).to(how.dev)
    fwd, bwd = how.times(mod, x, how.timer, needs_input_grad, then, grad, how.warmup, how.repeats)
    columns = layer_memory(mod, x, input_requires_grad=needs_input_grad, then=then, grad_seed=how.grad_seed)
    backward = statistics.median(bwd)
    if how.times is time_layer:      # measured times: the backward's split as torch's zero-bubble schedules run it
        split = layer_split(mod, x, how.timer, needs_input_grad=needs_input_grad, then=then, grad=grad,
                            warmup=min(how.warmup, 1), repeats=how.repeats)
        if split:
            columns.update(backward_weight=split["backward_weight"] * backward,
                           weight_pending_bytes=split["weight_pending_bytes"])
    layer = Layer(name, statistics.median(fwd), backward, float(parameter_bytes(mod)),
                  float(tensor_bytes(out)), float(saved), **columns)
    for p in mod.parameters():
        p.grad = None
    return layer, LayerTiming(name, tuple(fwd), tuple(bwd)), out.detach()


def _moved(mod: nn.Module, dev: torch.device, cast: torch.dtype | None) -> nn.Module:
    """``mod`` on ``dev`` (cast to ``cast``), moved only if it is not there yet (a fake model cannot be moved)."""
    tensors = list(mod.parameters()) + list(mod.buffers())
    if all(t.device.type == dev.type and (cast is None or not t.is_floating_point() or t.dtype == cast)
           for t in tensors) and dev.index is None:
        return mod
    return mod.to(dev) if cast is None else mod.to(device=dev, dtype=cast)


def _check_clock(clock: str, device: str | torch.device, threads: int | None) -> None:
    """Refuse an unknown clock, and the CPU clock with other than one thread on a CPU (the thread's CPU time
    would miss the other threads' work).

    >>> _check_clock("cpu", "cpu", 2)
    Traceback (most recent call last):
    ...
    ValueError: clock 'cpu' times the profiling thread alone: profile with threads=1, got 2
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and torch.device(device).type == "cpu" and threads != 1:
        raise ValueError(f"clock 'cpu' times the profiling thread alone: profile with threads=1, got {threads}")


def _check_counts(repeats: int, warmup: int, loss: Callable | None, target: Any) -> None:
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if (loss is None) != (target is None):
        raise ValueError("loss and target go together: pass both or neither")


def _layers_progress(n: int, name: Any, show: bool) -> Any:
    """``range(n)``, with a progress bar named ``name`` when ``show``."""
    if not show:
        return range(n)
    from tqdm import tqdm

    return tqdm(range(n), desc=str(name), unit="layer")


def _profile_meta(dev: torch.device, sample_input: torch.Tensor, mods: Sequence[nn.Module], nthreads: int,
                  warmup: int, repeats: int, with_loss: bool, stats: list[LayerTiming],
                  elapsed: float, clock: str = "wall") -> dict[str, Any]:
    """The metadata a profile records: where and how it was measured."""
    return {
        "network": "model",
        "device": _device_name(dev),
        "batch_size": int(sample_input.shape[0]) if sample_input.dim() else 1,
        "dtype": str(next((p.dtype for m in mods for p in m.parameters()), sample_input.dtype)).replace("torch.", ""),
        "input_bytes": tensor_bytes(sample_input),
        "input_shape": "x".join(str(s) for s in sample_input.shape),
        "input_dtype": str(sample_input.dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "threads": nthreads if dev.type == "cpu" else "n/a",
        "warmup": warmup,
        "repeats": repeats,
        "timing": "median of repeats; " + ("CUDA events" if dev.type == "cuda" else
                                            "time.thread_time (CPU time)" if clock == "cpu" else "time.perf_counter"),
        "saved_bytes": "autograd saved tensors per layer alone, storages deduplicated, parameters/buffers excluded",
        "memory_columns": ("allocator-level: " + ("torch.cuda memory statistics" if dev.type == "cuda" else
                           "workbench.profiles.memtrace.AllocationTracker (new storages, dispatch level)")),
        "loss": "in the last layer (time and saved bytes)" if with_loss else "not included",
        "backward_split": "measured: torch's stage_backward_input and stage_backward_weight per layer "
                          "(workbench.profiles.split)",
        **{k: f"{v:.4f}" for k, v in spread_summary(stats).items()},
        "profile_seconds": f"{elapsed:.1f}",
        "source": "workbench profiler",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(dev)})"
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def profile_zoo(
    name: str,
    batch_size: int,
    device: str = "cpu",
    *,
    dtype: str | torch.dtype | None = None,
    seed: int = 0,
    warmup: int = 2,
    repeats: int = 5,
    progress: bool = False,
    threads: int | None = 1,
    meta: Mapping[str, Any] | None = None,
    return_stats: bool = False,
    include_loss: bool = True,
    clock: str = "wall",
    **model_kwargs: Any,
) -> Chain | tuple[Chain, list[LayerTiming]]:
    """Build zoo model ``name`` (with ``model_kwargs``) and profile it on a sample batch.

    The model's full configuration goes to the metadata (``model_config``, JSON).
    The model's loss is part of the last layer unless ``include_loss=False``.
    ``dtype`` (default float32) is the precision of the model and its floating
    inputs (:func:`workbench.profiles.zoo.build_model`): ``"bfloat16"`` profiles pure bf16.
    ``clock``: as in :func:`profile_model`.

    >>> profile_zoo("mlp", 4, repeats=1, warmup=0).name
    'mlp'
    >>> profile_zoo("mlp", 4, repeats=1, warmup=0, dtype="bfloat16").meta["dtype"]
    'bfloat16'
    """
    from workbench.profiles import zoo

    cfg = zoo.model_config(name, **model_kwargs)
    model = zoo.build_model(name, seed=seed, dtype=dtype, **model_kwargs)
    x, y = zoo.sample_batch(name, batch_size, seed=seed, dtype=dtype, **model_kwargs)
    info = {"network": name, "model": name, "model_config": json.dumps(cfg, separators=(",", ":")), **(meta or {})}
    return profile_model(model, x, device, warmup=warmup, repeats=repeats, meta=info, progress=progress,
                         threads=threads, return_stats=return_stats, clock=clock,
                         loss=zoo.loss_fn(name) if include_loss else None, target=y if include_loss else None)



def profile_workload(workload: Any, device: str = "cpu", *, warmup: int = 2, repeats: int = 5, progress: bool = False,
                     threads: int | None = 1, return_stats: bool = False,
                     clock: str = "wall") -> Chain | tuple[Chain, list[LayerTiming]]:
    """Profile a :class:`~workbench.profiles.workload.Workload`: a zoo model through :func:`profile_zoo`,
    a ``--module FILE.py:FUNC`` model through :func:`profile_model` on its example batch (the metadata
    records ``module``, so ``run --profile`` finds the model again). ``clock``: as in :func:`profile_model`.

    >>> from workbench.profiles.workload import Workload
    >>> profile_workload(Workload.zoo("mlp", 4), repeats=1, warmup=0).meta["model"]
    'mlp'
    """
    kw = dict(warmup=warmup, repeats=repeats, progress=progress, threads=threads, return_stats=return_stats,
              clock=clock)
    if workload.source is None:
        return profile_zoo(workload.name, workload.batch_size, device, dtype=workload.dtype, **kw, **workload.config)
    inputs, target = workload.batch(0)
    info = {"network": workload.name, "module": workload.source}
    return profile_model(workload.build(), inputs, device, meta=info, loss=workload.loss, target=target,
                         split_at=workload.split_at or None, **kw)
