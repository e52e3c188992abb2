"""A shared parameter counted once in a profile: at the first layer that uses it (its owner).

A model whose head reuses its embedding's weight (GPT-2, BERT: ``tie_word_embeddings``) has one
parameter in two layers. The profiler measures each layer alone, so both layers' columns would hold
the tensor; :func:`count_ties_once` keeps its bytes in the owner's ``weight_bytes``, ``grad_bytes``
and ``max_param_bytes`` only and records the tie in the profile's ``tied`` metadata, from which the
memory model prices the copy a device holds when a sharer sits away from the owner (docs/model.md,
"Tied parameters"; ``workbench.model.ties``).
"""

from __future__ import annotations

import dataclasses
import json

from workbench.model.chain import Chain
from workbench.profiles.discover import Layers
from workbench.profiles.local import local_bytes

__all__ = ["count_ties_once"]


def count_ties_once(chain: Chain, found: Layers) -> Chain:
    """``chain`` with every shared parameter's bytes in its owner's ``weight_bytes``, ``grad_bytes`` and
    ``max_param_bytes`` only and the ties in the metadata (``tied``: JSON list of {"owner", "layers",
    "bytes", "parameter"}, the bytes in the profile's dtype; docs/model.md "Tied parameters").

    >>> import torch
    >>> from workbench.profiles.profiler import profile_model
    >>> lin = torch.nn.Linear(2, 2, bias=False)
    >>> c = profile_model([lin, lin], torch.zeros(1, 2), repeats=1, warmup=0)
    >>> [l.weight_bytes for l in c.layers], [l.grad_bytes for l in c.layers], json.loads(c.meta["tied"])[0]["layers"]
    ([16.0, 0.0], [16.0, 0.0], ['layer0', 'layer1'])
    """
    if not found.tied:
        return chain
    owned = [{id(p): p for p in m.parameters()} for m in found.modules]
    users: dict[int, list[int]] = {}
    for i, params in enumerate(owned):
        for key in params:
            users.setdefault(key, []).append(i)
    size = {key: float(local_bytes(p)) for params in owned for key, p in params.items()}
    layers = []
    for i, l in enumerate(chain.layers):
        shared = [k for k in owned[i] if users[k][0] != i]          # a sharer's copy: counted at its owner
        if not shared:
            layers.append(l)
            continue
        own = [p for k, p in owned[i].items() if k not in shared and p.requires_grad]
        grad_shared = sum(size[k] for k in shared if owned[i][k].requires_grad)
        layers.append(dataclasses.replace(
            l, weight_bytes=max(l.weight_bytes - sum(size[k] for k in shared), 0.0),
            grad_bytes=None if l.grad_bytes is None else max(l.grad_bytes - grad_shared, 0.0),
            max_param_bytes=None if l.max_param_bytes is None else
            float(max((local_bytes(p) for p in own), default=0))))
    renamed = dict(zip(found.names, (l.name for l in chain.layers)))
    shared_keys = [k for k, us in users.items() if len(us) > 1]     # first-use order, as find_ties lists them
    ties = []
    for t, key in zip(found.tied, shared_keys):
        ties.append({**t.to_dict(), "owner": renamed[t.owner], "layers": [renamed[n] for n in t.layers],
                     "bytes": int(size[key])})
    meta = {**chain.meta, "tied": json.dumps(ties, separators=(",", ":"))}
    return dataclasses.replace(chain, layers=tuple(layers), meta=meta)
