"""workbench.parallel.run.grid: the groups that keep tied parameters tied, against a brute-force enumeration."""

import itertools

import pytest

from workbench.model.layout import Layout
from workbench.parallel.run.grid import all_tie_ranks, tie_ranks


@pytest.mark.parametrize("tp,pp,dp,holders", [(1, 2, 1, (0, 1)), (2, 2, 2, (0, 1)), (2, 4, 2, (0, 3)),
                                               (4, 3, 1, (2, 0)), (1, 4, 3, (0, 2, 3))])
def test_tie_groups_join_the_holders_of_one_dp_tp_coordinate(tp, pp, dp, holders):
    lay = Layout(tp=tp, pp=pp, dp=dp)
    groups = all_tie_ranks(lay, holders)
    holding = [r for r in range(lay.devices) if lay.coords(r)[0] in holders]
    assert sorted(r for g in groups for r in g) == sorted(holding)       # every holder in exactly one group
    for r in range(lay.devices):
        mine = tie_ranks(lay, holders, r)
        if r not in holding:
            assert mine == ()
            continue
        _, d, t = lay.coords(r)
        expected = sorted(q for q in holding if lay.coords(q)[1:] == (d, t))
        assert sorted(mine) == expected and mine in groups
    assert len(groups) == dp * tp and all(len(g) == len(set(holders)) for g in groups)


def test_every_rank_creates_the_groups_in_one_order():
    lay = Layout(tp=2, pp=2, dp=2)
    orders = {tuple(all_tie_ranks(lay, (0, 1))) for _ in range(3)}
    assert len(orders) == 1
    assert list(itertools.chain(*orders)) == [(0, 4), (1, 5), (2, 6), (3, 7)]
