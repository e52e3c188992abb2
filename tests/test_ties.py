"""workbench.model.ties: a chain's ties by index, which stages hold a copy, coarsened ties."""

import json

import numpy as np
import pytest

from workbench.model.chain import Chain, Layer
from workbench.model.ties import Tie, chain_ties, remap_ties, tie_flags


def _chain(n: int, tied: list[dict]) -> Chain:
    return Chain(tuple(Layer(f"l{i}", 1, 1, 8) for i in range(n)), meta={"tied": json.dumps(tied)})


def test_chain_ties_by_index_and_what_is_dropped():
    tied = [{"owner": "l0", "layers": ["l0", "l5", "l3"], "bytes": 8},
            {"owner": "l1", "layers": ["l1"], "bytes": 8},               # no sharer: no tie
            {"owner": "l2", "layers": ["l2", "l4"], "bytes": 0},         # no bytes: no tie
            {"owner": "gone", "layers": ["gone", "l4"], "bytes": 8}]     # owner not in the chain
    assert chain_ties(_chain(6, tied)) == (Tie(0, (3, 5), 8.0),)


@pytest.mark.parametrize("owner,sharers", [(0, (5,)), (0, (2, 5)), (4, (0, 2)), (3, (1, 5))])
def test_tie_flags_against_every_stage(owner, sharers):
    """Every stage i..j of a 6-layer chain, flags derived by plain set arithmetic (no searchsorted)."""
    tie = Tie(owner, sharers, 8.0)
    I, J = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    copy, away = tie_flags(tie, I, J)
    for i in range(6):
        for j in range(i, 6):
            held = set(range(i, j + 1))
            holds_owner, holds_sharer = owner in held, bool(held & set(sharers))
            assert copy[i, j] == (holds_sharer and not holds_owner), (i, j)
            assert away[i, j] == (holds_owner and not set(sharers) <= held), (i, j)


def test_remap_ties_keeps_ties_across_groups_only():
    ch = _chain(4, [{"owner": "l0", "layers": ["l0", "l3"], "bytes": 8}])
    out = json.loads(remap_ties(ch, [(0, 1), (2, 3)], ["a", "b"]))
    assert out == [{"owner": "a", "layers": ["a", "b"], "bytes": 8.0}]
    assert remap_ties(ch, [(0, 3)], ["all"]) is None
