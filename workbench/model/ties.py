"""Tied parameters as the memory model sees them (docs/model.md, "Tied parameters").

A profile lists every parameter several layers use in its ``tied`` metadata
(``[{"owner", "layers", "bytes", "parameter"}]``, layer names). Its bytes count
in the owner's ``weight_bytes``, ``grad_bytes`` and ``max_param_bytes`` only;
:func:`chain_ties` turns the list into layer indices of a chain (:class:`Tie`),
and :func:`tie_flags` says, for stages ``i..j`` given as arrays, which of them
hold a **copy** (a sharing layer but not the owner: the copy's parameter, and as
each engine does it its gradient and optimizer state) and which hold the
owner while a sharer sits in another stage (the PipeDream engine's receive
buffer for the sharer's gradient). The memory model (:mod:`workbench.model.memory`)
prices both.

>>> import json
>>> from workbench.model.chain import Chain, Layer
>>> tied = [{"owner": "emb", "layers": ["emb", "head"], "bytes": 40, "parameter": "wte.weight"}]
>>> ch = Chain((Layer("emb", 1, 1, 40), Layer("mid", 1, 1), Layer("head", 1, 1)), meta={"tied": json.dumps(tied)})
>>> chain_ties(ch)
(Tie(owner=0, sharers=(2,), nbytes=40.0),)
>>> copy, away = tie_flags(chain_ties(ch)[0], np.array([[0], [1]]), np.array([[2], [2]]))
>>> copy.ravel().tolist(), away.ravel().tolist()    # 0..2 holds both; 1..2 holds the head only: a copy
([False, True], [False, False])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # ties is below chain (memory imports it, chain imports memory)
    from workbench.model.chain import Chain

__all__ = ["Tie", "chain_ties", "tie_flags", "remap_ties"]


@dataclass(frozen=True)
class Tie:
    """One shared parameter of a chain: the ``owner`` layer (whose columns count it), the other layers that
    use it (``sharers``, sorted) and its bytes in the profile's dtype."""

    owner: int
    sharers: tuple[int, ...]
    nbytes: float


def chain_ties(chain: Chain) -> tuple[Tie, ...]:
    """The chain's ties (its ``tied`` metadata) by layer index; layers the chain does not have are left out,
    and a tie with no sharer left is no tie. Cached on the chain.

    >>> from workbench.model.chain import Chain, Layer
    >>> chain_ties(Chain((Layer("a", 1, 1),)))
    ()
    """
    cached = chain.__dict__.get("_ties")
    if cached is not None:
        return cached
    text = chain.meta.get("tied") if chain.meta else None
    out: list[Tie] = []
    if text:
        entries = json.loads(text) if isinstance(text, str) else list(text)
        index = {l.name: i for i, l in enumerate(chain.layers)}
        for e in entries:
            owner = index.get(str(e.get("owner")))
            users = sorted({index[n] for n in e.get("layers", []) if n in index} - {owner})
            if owner is None or not users or float(e.get("bytes", 0) or 0) <= 0:
                continue
            out.append(Tie(owner, tuple(users), float(e["bytes"])))
    ties = tuple(out)
    chain.__dict__["_ties"] = ties
    return ties


def tie_flags(tie: Tie, I: np.ndarray, J: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For stages ``I..J`` (broadcasting arrays): ``copy`` (a sharer in the stage, the owner not) and
    ``away`` (the owner in the stage, some sharer not)."""
    has_owner = (I <= tie.owner) & (tie.owner <= J)
    sharers = np.asarray(tie.sharers)
    # the first sharer at or after I: the stage holds a sharer when it is at most J
    pos = np.searchsorted(sharers, I, side="left")
    nxt = np.where(pos < len(sharers), sharers[np.minimum(pos, len(sharers) - 1)], np.iinfo(np.int64).max)
    has_sharer = nxt <= J
    all_in = (sharers[0] >= I) & (sharers[-1] <= J)
    return has_sharer & ~has_owner, has_owner & ~all_in


def remap_ties(chain: Chain, groups: list[tuple[int, int]], names: list[str]) -> str | None:
    """The ``tied`` metadata of ``chain`` coarsened into ``groups`` (layer ranges) named ``names``: each
    tie's layers become the groups holding them; a tie inside one group is no tie any more (None: none left).

    >>> import json
    >>> from workbench.model.chain import Chain, Layer
    >>> t = [{"owner": "a", "layers": ["a", "c"], "bytes": 8, "parameter": "w"}]
    >>> ch = Chain(tuple(Layer(n, 1, 1) for n in "abc"), meta={"tied": json.dumps(t)})
    >>> json.loads(remap_ties(ch, [(0, 1), (2, 2)], ["a..b", "c"]))[0]["layers"]
    ['a..b', 'c']
    >>> remap_ties(ch, [(0, 2)], ["a..c"]) is None
    True
    """
    group_of = {l: g for g, (a, b) in enumerate(groups) for l in range(a, b + 1)}
    out = []
    for t in chain_ties(chain):
        owner = group_of[t.owner]
        users = sorted({group_of[s] for s in t.sharers} - {owner})
        if users:
            out.append({"owner": names[owner], "layers": [names[owner]] + [names[u] for u in users],
                        "bytes": t.nbytes})
    return json.dumps(out, separators=(",", ":")) if out else None
