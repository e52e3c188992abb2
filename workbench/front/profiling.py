"""Handlers of profile sub-commands of ``python -m workbench``.

``profile-info FILE`` summarises a profile: a project CSV, a PipeDream
``graph.txt`` (then also how the graph was linearised), or a known name
such as ``pipedream/vgg16``. ``profile (--model NAME | --module FILE.py:FUNC)``
profiles a model with :mod:`workbench.profiles.profiler` and writes its CSV.

>>> import argparse
>>> profile_info_command(argparse.Namespace(file="pipedream/vgg16", no_zero_input=False))  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import ast
import json
from typing import Any

import numpy as np

from workbench.model.units import format_bytes

__all__ = ["profile_info_command", "profile_info_text", "profile_command"]


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


def profile_command(args: Any) -> int:
    """``python -m workbench profile (--model NAME [--set key=value ...] | --module FILE.py:FUNC) --out FILE``."""
    from workbench.profiles.csvio import write_profile
    from workbench.profiles.profiler import profile_workload, profile_zoo

    kwargs: dict[str, Any] = {}
    for item in getattr(args, "set", None) or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        kwargs[k.strip()] = _parse_value(v.strip())
    threads = getattr(args, "threads", 1)
    if getattr(args, "module", None):
        from workbench.profiles.workload import Workload

        wl = Workload.module(args.module)
        print(f"finding the layers of {wl.name} ...", flush=True)
        chain, stats = profile_workload(wl, args.device, warmup=args.warmup, repeats=args.repeats, progress=True,
                                        threads=threads, return_stats=True)
    else:
        chain, stats = profile_zoo(args.model, args.batch_size, args.device, warmup=args.warmup, repeats=args.repeats,
                                   progress=True, threads=threads, return_stats=True,
                                   dtype=getattr(args, "dtype", None), **kwargs)
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
    print(f"spread of {args.repeats} repeats, (max-min)/median per layer: forward median "
          f"{float(m['spread_forward']):.1%} (max {float(m['spread_forward_max']):.1%}), backward median "
          f"{float(m['spread_backward']):.1%} (max {float(m['spread_backward_max']):.1%})")
    print(f"profiled in {m['profile_seconds']} s; wrote {args.out}")
    return 0
