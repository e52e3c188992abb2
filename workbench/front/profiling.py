"""Handlers of profile sub-commands of ``python -m workbench``.

``profile-info FILE`` summarises a profile: a project CSV, a PipeDream
``graph.txt`` (then also how the graph was linearised), or a known name
such as ``pipedream/vgg16``. ``profile (--model NAME | --module FILE.py:FUNC [--split-at NAME,...])``
profiles a model with :mod:`workbench.profiles.profiler` and writes its CSV; with ``--fake --gpu NAME``
under fake tensors for that GPU (:mod:`workbench.profiles.fake`); ``profile --list-gpus`` lists the GPUs.

>>> import argparse
>>> profile_info_command(argparse.Namespace(file="pipedream/vgg16", no_zero_input=False))  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import ast
import json
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from workbench.model.units import format_bytes

__all__ = ["profile_info_command", "profile_info_text", "profile_command", "gpu_table", "check_device"]


def profile_info_text(spec: str, *, zero_input: bool = True) -> str:
    """The text ``profile-info`` prints for a profile path or name."""
    from workbench.profiles import load_profile, resolve_profile

    path = resolve_profile(spec)
    opts = {} if path.suffix == ".csv" else {"zero_input": zero_input}
    chain = load_profile(path, **opts)
    acts = [l.activation_bytes for l in chain.layers]
    big = int(np.argmax(acts))
    meta = chain.meta
    lines = [
        f"profile: {path}",
        f"network: {meta.get('network', chain.name)}"
        + (f"  batch size: {meta['batch_size']}" if "batch_size" in meta else "")
        + (f"  source: {meta['source']}" if "source" in meta else ""),
        f"layers: {len(chain)}",
        f"forward: {chain.forward.sum() * 1e3:.3f} ms   backward: {chain.backward.sum() * 1e3:.3f} ms   "
        f"total: {chain.total_compute * 1e3:.3f} ms",
        f"parameters: {format_bytes(chain.weights.sum())} ({chain.weights.sum():.0f} bytes)",
        f"largest activation: {format_bytes(acts[big])} ({chain.layers[big].name})",
    ]
    if meta.get("times") == "estimated":
        lines.append(f"times: a fake profile's, for {meta.get('gpu', 'a GPU')}: {meta.get('timing')}")
    if len(chain) > 1:
        cuts = chain.cuts[:-1]
        c = int(np.argmax(cuts))
        lines.append(f"largest cut: {format_bytes(cuts[c])} (after {chain.layers[c].name})")
    if chain.graph is not None:
        lines.append("linearisation:")
        lines.append(meta.get("linearisation") or "")
    return "\n".join(lines)


def profile_info_command(args: argparse.Namespace) -> int:
    """``python -m workbench profile-info FILE [--no-zero-input]``: print a summary; 0 on success."""
    print(profile_info_text(args.file, zero_input=not getattr(args, "no_zero_input", False)))
    return 0


def _parse_value(text: str) -> Any:
    """A ``--set`` value: a Python literal where it reads as one, else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def gpu_table() -> str:
    """What ``profile --list-gpus`` prints: one line per GPU of :mod:`workbench.model.accelerators`.

    >>> gpu_table().splitlines()[1].split()[0]
    'a100-40gb'
    """
    from workbench.model.accelerators import ACCELERATORS

    lines = [f"{'name':<10} {'memory':>7} {'HBM/s':>9} {'fp32':>6} {'tf32':>6} {'bf16':>6} {'fp8':>6} "
             f"{'link/s':>7}  (TFLOP/s dense; link: one way, within a node)"]
    for a in ACCELERATORS.values():
        tf = [f"{a.flops[p] / 1e12:>6.0f}" if a.flops.get(p) else f"{'-':>6}"
              for p in ("float32", "tf32", "bfloat16", "float8")]
        lines.append(f"{a.name:<10} {a.memory / 1e9:>5.0f}GB {a.memory_bandwidth / 1e9:>6.0f}GB/s {' '.join(tf)} "
                     f"{a.link_bandwidth / 1e9:>4.0f}GB/s  {a.label}, {a.link}")
    return "\n".join(lines)


def _check_profile_args(args: Any) -> None:
    """What ``profile`` needs before it starts: a model, an output, and --gpu exactly with --fake."""
    if not (getattr(args, "model", None) or getattr(args, "module", None)):
        raise ValueError("profile: give --model NAME or --module FILE.py:FUNC (or --list-gpus)")
    if not getattr(args, "out", None):
        raise ValueError("profile: --out FILE is required (the profile's CSV)")
    if getattr(args, "split_at", None) is not None:
        from workbench.profiles.cuts import parse_split_at

        if not getattr(args, "module", None):
            raise ValueError("--split-at goes with --module (a zoo model's layers are its own)")
        parse_split_at(args.split_at)
    if getattr(args, "clock", "wall") == "cpu" and getattr(args, "threads", 1) != 1:
        raise ValueError(f"--clock cpu times the profiling thread alone: use --threads 1, not {args.threads}")
    if getattr(args, "fake", False):
        from workbench.model.accelerators import ACCELERATORS, accelerator

        if not args.gpu:
            raise ValueError(f"--fake needs --gpu NAME, the GPU whose times it estimates; known: "
                             f"{', '.join(sorted(ACCELERATORS))}")
        accelerator(args.gpu)        # an unknown name lists the known ones
        if args.device != "cpu":
            raise ValueError(f"--device {args.device} does not go with --fake: a fake profile runs nowhere, "
                             "its times are estimated for --gpu")
    elif getattr(args, "gpu", None):
        raise ValueError("--gpu goes with --fake (a real profile measures the device it runs on: --device)")
    if getattr(args, "kernels", "eager") != "eager" and not getattr(args, "fake", False):
        raise ValueError(f"--kernels {args.kernels} goes with --fake (a real profile runs the model's own kernels)")
    else:
        check_device(getattr(args, "device", "cpu") or "cpu")
    _check_tp_args(args)


def _check_tp_args(args: Any) -> None:
    """``--tp``, ``--sequence-parallel`` and ``--loss-parallel`` go with ``--fake --module``."""
    tp_args = getattr(args, "tp", 1) != 1 or getattr(args, "sequence_parallel", False) \
        or getattr(args, "loss_parallel", False)
    if not tp_args:
        return
    if not getattr(args, "module", None):
        raise ValueError("--tp shards a Llama-style model (q_proj ... down_proj): give --module FILE.py:FUNC")
    if not getattr(args, "fake", False):
        raise ValueError(f"--tp {args.tp}: a tensor-parallel profile is made under fake tensors with a fake "
                         "process group: add --fake --gpu NAME")
    if args.tp == 1:
        raise ValueError("--sequence-parallel and --loss-parallel need --tp 2 or more")


def check_device(text: str) -> None:
    """Refuse (ValueError) a ``--device`` this machine cannot profile on: not cpu, cuda or cuda:N, or a GPU
    that is not here.

    >>> check_device("tpu9")
    Traceback (most recent call last):
    ValueError: --device tpu9: not a device to profile on; give cpu, cuda or cuda:N
    """
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {text}: not a device to profile on; give cpu, cuda or cuda:N")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this torch has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"--device {text}: {why}; profile on cpu, or estimate a GPU's times with "
                             "--fake --gpu NAME")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"--device {text}: there are {count} CUDA GPU(s) here, cuda:0..cuda:{count - 1}")


def profile_command(args: Any) -> int:
    """``python -m workbench profile (--model NAME [--set key=value ...] | --module FILE.py:FUNC) [--fake --gpu NAME]
    --out FILE``, or ``profile --list-gpus``."""
    from workbench.profiles.csvio import write_profile
    from workbench.profiles.profiler import profile_workload, profile_zoo

    if getattr(args, "list_gpus", False):
        print(gpu_table())
        return 0
    _check_profile_args(args)
    kwargs: dict[str, Any] = {}
    for item in getattr(args, "set", None) or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        kwargs[k.strip()] = _parse_value(v.strip())
    if getattr(args, "model", None):
        from workbench.profiles.zoo import model_config

        model_config(args.model, **kwargs)       # unknown or out-of-range options: refused before profiling
    threads = getattr(args, "threads", 1)
    clock = getattr(args, "clock", None) or "wall"
    if getattr(args, "fake", False):
        return _fake_profile(args, kwargs)
    if getattr(args, "module", None):
        from workbench.profiles.usermodel import user_code
        from workbench.profiles.workload import Workload

        with user_code(args.module):
            wl = Workload.module(args.module, split_at=getattr(args, "split_at", None))
            for note in wl.notes:
                print(f"note: {note}", flush=True)
            print(f"finding the layers of {wl.name} ...", flush=True)
            chain, stats = profile_workload(wl, args.device, warmup=args.warmup, repeats=args.repeats,
                                            progress=True, threads=threads, return_stats=True, clock=clock)
        chain = _module_from_profile(chain, args.module, args.out)
    else:
        chain, stats = profile_zoo(args.model, args.batch_size, args.device, warmup=args.warmup, repeats=args.repeats,
                                   progress=True, threads=threads, return_stats=True, clock=clock,
                                   dtype=getattr(args, "dtype", None), **kwargs)
    _refuse_unloadable(chain, args.out)
    write_profile(chain, args.out)
    m = chain.meta
    print(chain.summary())
    if m.get("layers_found"):
        print(f"layers found: {m['layers_found']}")
    for t in json.loads(m.get("tied") or "[]"):
        print(f"tied: {t['parameter']} ({t['bytes'] / 2**20:.2f} MiB) shared by {', '.join(t['layers'])}; "
              f"counted once, at {t['owner']}")
    print(f"saved for backward {sum(chain.saved_array) / 2**20:.1f} MiB in all; {m['dtype']}; input "
          f"{m['input_shape']} ({m['input_dtype']}), device {m['device']}, {m['threads']} thread(s)")
    _report_spread(chain, args.repeats)
    print(f"profiled in {m['profile_seconds']} s; wrote {args.out}")
    return 0


def _module_from_profile(chain: Any, spec: str, out: str) -> Any:
    """``chain`` recording its ``--module`` relative to the folder of the profile ``out``."""
    import dataclasses
    from pathlib import Path

    from workbench.profiles.usermodel import spec_relative_to

    return dataclasses.replace(chain, meta={**chain.meta, "module": spec_relative_to(spec, Path(out).parent)})


def _report_spread(chain: Any, repeats: int) -> None:
    m = chain.meta
    print(f"spread of {repeats} repeats, (max-min)/median per layer: forward median "
          f"{float(m['spread_forward']):.1%} (max {float(m['spread_forward_max']):.1%}), backward median "
          f"{float(m['spread_backward']):.1%} (max {float(m['spread_backward_max']):.1%})")


def _refuse_unloadable(chain: Any, out: str) -> None:
    """Refuse (ValueError, before anything is written) a profile its own loader would refuse: a time or a size
    no measurement gives (:func:`~workbench.profiles.csvio.check_values`: a fake profile of a huge batch or
    sequence), naming the value and the layer."""
    from workbench.profiles.csvio import ProfileError, check_values

    try:
        check_values(chain, "the profile")
    except ProfileError as e:
        raise ValueError(f"{e}; nothing written to {out} (its loader would refuse it): profile a smaller batch or "
                         "sequence") from None


@contextmanager
def _cast_hint() -> Iterator[None]:
    """Inside, ``model.to(dtype)`` failing under fake tensors ("Couldn't swap ...") ends with the fix the README
    gives: build the model with torch's default dtype set."""
    from workbench.profiles.usermodel import UserCodeError

    try:
        yield
    except UserCodeError as e:
        if "Couldn't swap" not in str(e):
            raise
        raise UserCodeError(f"{e}: under --fake, build the model in its dtype with torch.set_default_dtype (as "
                            "examples/ do: workbench.profiles.fake.default_dtype) instead of model.to(dtype), which "
                            "fake tensors cannot do") from None


@contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """Inside, torch's fake-tensor logger keeps its own traceback of a failed operation to itself: the
    failure reaches the user once, as the one ``error:`` line of :func:`~workbench.profiles.usermodel.user_code`."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _fake_profile(args: Any, kwargs: dict[str, Any]) -> int:
    """``profile --fake --gpu NAME``: the model under fake tensors (:mod:`workbench.profiles.fake`)."""
    from workbench.profiles.csvio import write_profile
    from workbench.profiles.fake import fake_module, fake_zoo

    if args.module and getattr(args, "tp", 1) > 1:
        return _tensor_parallel_profile(args)
    if args.module:
        print(f"building {args.module} under fake tensors (nothing is allocated) ...", flush=True)
        from workbench.profiles.cuts import parse_split_at
        from workbench.profiles.usermodel import user_code

        with _cast_hint(), user_code(args.module), _quiet_fake_tensor_log():
            chain = fake_module(args.module, args.gpu, progress=True,
                                split_at=parse_split_at(getattr(args, "split_at", None)),
                                kernels=getattr(args, "kernels", "eager"))
        chain = _module_from_profile(chain, args.module, args.out)
    else:
        chain = fake_zoo(args.model, args.batch_size, args.gpu, dtype=args.dtype, progress=True,
                         kernels=getattr(args, "kernels", "eager"), **kwargs)
    _refuse_unloadable(chain, args.out)
    write_profile(chain, args.out)
    m = chain.meta
    print(chain.summary())
    print(f"layers found: {m.get('layers_found')}")
    for t in json.loads(m.get("tied") or "[]"):
        print(f"tied: {t['parameter']} ({t['bytes'] / 2**20:.2f} MiB) shared by {', '.join(t['layers'])}; "
              f"counted once, at {t['owner']}")
    print(f"saved for backward {sum(chain.saved_array) / 2**30:.2f} GiB in all; {m['dtype']}; input "
          f"{m['input_shape']} ({m['input_dtype']})")
    print(f"times: {m['timing']}")
    print(f"profiled in {m['profile_seconds']} s; wrote {args.out}")
    return 0


def _tensor_parallel_profile(args: Any) -> int:
    """``profile --module FILE.py:FUNC --fake --gpu NAME --tp T``: one rank's profile under tensor parallelism
    (:mod:`workbench.parallel.tensor.profile`)."""
    from workbench.parallel.tensor.profile import describe_meta, tensor_parallel_profile
    from workbench.profiles.csvio import write_profile
    from workbench.profiles.usermodel import user_code

    print(f"building {args.module} under fake tensors, sharded over a fake group of {args.tp} ranks ...", flush=True)
    with user_code(args.module), _quiet_fake_tensor_log():
        chain = tensor_parallel_profile(args.module, args.gpu, args.tp, sequence_parallel=args.sequence_parallel,
                                        loss_parallel=args.loss_parallel, cache=False, progress=True,
                                        kernels=getattr(args, "kernels", "eager"))
    chain = _module_from_profile(chain, args.module, args.out)
    write_profile(chain, args.out)
    m = chain.meta
    print(chain.summary())
    print(f"layers found: {m.get('layers_found')}")
    print(describe_meta(chain))
    print(f"saved for backward {sum(chain.saved_array) / 2**30:.2f} GiB in all on each rank; {m['dtype']}; input "
          f"{m['input_shape']} ({m['input_dtype']})")
    print(f"times: {m['timing']}")
    print(f"profiled in {m['profile_seconds']} s; wrote {args.out}")
    return 0
