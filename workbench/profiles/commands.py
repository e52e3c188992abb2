"""Handlers of profile sub-commands of ``python -m workbench``.

``profile-info FILE`` summarises a profile: a project CSV, a PipeDream
``graph.txt`` (then also how the graph was linearised), or a known name
such as ``pipedream/vgg16``.

>>> import argparse
>>> profile_info_command(argparse.Namespace(file="pipedream/vgg16", no_zero_input=False))  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse

import numpy as np

from ..units import format_bytes

__all__ = ["profile_info_command", "profile_info_text"]


def profile_info_text(spec: str, *, zero_input: bool = True) -> str:
    """The text ``profile-info`` prints for a profile path or name."""
    from . import load_profile, resolve_profile

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
