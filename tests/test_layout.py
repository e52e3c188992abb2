"""The layout value: its rank grid against a brute-force enumeration, parsing, and the checks users meet."""

import itertools

import pytest

from workbench.model.layout import Layout


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (2, 2, 2), (4, 8, 2), (8, 1, 8), (1, 62, 1)])
def test_grid_is_a_bijection_and_groups_partition_the_ranks(tp, pp, dp):
    lay = Layout(tp=tp, pp=pp, dp=dp)
    coords = [lay.coords(r) for r in range(lay.devices)]
    assert sorted(coords) == list(itertools.product(range(pp), range(dp), range(tp)))
    assert all(lay.rank(*c) == r for r, c in enumerate(coords))
    for dim, degree in (("tp", tp), ("pp", pp), ("dp", dp)):
        groups = lay.groups(dim)
        assert len(groups) == lay.devices // degree and all(len(g) == degree for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(lay.devices))
        for g in groups:            # members differ only in their coordinate along dim
            others = {tuple(c for d, c in zip(("pp", "dp", "tp"), lay.coords(r)) if d != dim) for r in g}
            assert len(others) == 1


def test_tp_groups_are_consecutive_and_stay_in_a_node():
    lay = Layout(tp=4, pp=8, dp=2)
    assert all(g == tuple(range(g[0], g[0] + 4)) for g in lay.groups("tp"))
    assert not lay.spans_nodes("tp", 8) and not lay.spans_nodes("dp", 8) and lay.spans_nodes("pp", 8)
    assert Layout(tp=8, dp=8).spans_nodes("dp", 8) and not Layout(tp=8, dp=8).spans_nodes("tp", 8)


def test_parse_round_trips_through_the_json_object():
    lay = Layout.parse("tp=4,pp=8,dp=2,zero=1,mbs=1,mb=16,schedule=interleaved-1f1b,chunks=5")
    assert Layout.from_dict(lay.to_dict()) == lay
    assert lay.global_batch == 32 and lay.devices == 64


@pytest.mark.parametrize("text,words", [
    ("tp=0", "tp must be a whole number >= 1"), ("zero=4", "zero must be one of 0, 1, 2, 3"),
    ("tp=2,tp=4", "tp is given twice"), ("tensor=2", "is not KEY=VALUE"), ("dp=x", "dp must be a whole number"),
    (" ", "is empty: give auto or tp=T,pp=P,dp=D"), ("tp=1,,pp=8", "an empty item"), ("pp=2,", "an empty item"),
])
def test_parse_refuses_bad_text_naming_it(text, words):
    with pytest.raises(ValueError, match=words):
        Layout.parse(text)


def test_check_names_the_values():
    with pytest.raises(ValueError, match="uses 16 GPUs, not the 64"):
        Layout(tp=4, pp=4).check(devices=64)
    with pytest.raises(ValueError, match="tp=16 must divide the 8 GPUs of a node"):
        Layout(tp=16, dp=4).check(devices=64, devices_per_node=8)
    with pytest.raises(ValueError, match="zero=3 shards over the data-parallel group, but dp=1"):
        Layout(tp=8, pp=8, zero=3).check(devices=64)
    with pytest.raises(ValueError, match="unknown key"):
        Layout.from_dict({"tp": 2, "pipeline": 4})
    with pytest.raises(ValueError, match="parallel: schedule 'nope' is not a method; one of .*1f1b"):
        Layout.from_dict({"tp": 2, "schedule": "nope"})
    with pytest.raises(ValueError, match="parallel: schedule 5 is not a method"):
        Layout.from_dict({"tp": 2, "schedule": 5})
    assert Layout(tp=8, pp=2, dp=4, zero=3).check(devices=64, devices_per_node=8).devices == 64


def test_tp_overlap_parses_needs_sequence_parallelism_and_round_trips():
    lay = Layout.parse("tp=4,dp=2,sp=1,tpo=1")
    assert lay.tp_overlap and lay.describe().endswith(", SP, TPO")
    assert Layout.from_dict(lay.to_dict()) == lay and lay.to_dict()["tp_overlap"] is True
    with pytest.raises(ValueError, match="tpo=1 overlaps .* it needs sp=1"):
        Layout.parse("tp=4,tpo=1")
    with pytest.raises(ValueError, match="tpo=1 .* but tp=1"):
        Layout.parse("tp=1,tpo=1")
    with pytest.raises(ValueError, match="tpo must be 0 or 1"):
        Layout.parse("tp=2,sp=1,tpo=maybe")


def test_tp_overlap_off_is_left_out_of_the_json_and_old_plans_load():
    lay = Layout.parse("tp=2,sp=1")
    assert "tp_overlap" not in lay.to_dict() and not lay.tp_overlap
    old = {"tp": 2, "pp": 1, "dp": 1, "zero": 0, "micro_batch_size": 1, "micro_batches": 2, "schedule": "1f1b",
           "chunks": 1, "sequence_parallel": True, "loss_parallel": False}
    assert Layout.from_dict(old) == Layout.parse("tp=2,sp=1,mbs=1,mb=2,schedule=1f1b")


def test_dp_overlap_parses_needs_zero_1_and_round_trips():
    lay = Layout.parse("tp=2,dp=4,zero=1,dpo=1")
    assert lay.dp_overlap and lay.describe().endswith(", ZeRO-1, DPO")
    assert Layout.from_dict(lay.to_dict()) == lay and lay.to_dict()["dp_overlap"] is True
    for zero in (0, 2, 3):
        with pytest.raises(ValueError, match=f"dpo=1 is ZeRO-1 .* it needs zero=1, not zero={zero}"):
            Layout.parse(f"dp=4,zero={zero},dpo=1")
    with pytest.raises(ValueError, match="dpo must be 0 or 1"):
        Layout.parse("dp=2,zero=1,dpo=yes please")
    assert Layout.parse("dp=2,zero=1,dp_overlap=1") == lay.with_(tp=1, dp=2)


def test_dp_overlap_off_is_left_out_of_the_json_and_old_plans_load():
    lay = Layout.parse("dp=2,zero=1")
    assert "dp_overlap" not in lay.to_dict() and not lay.dp_overlap
    old = {"tp": 1, "pp": 1, "dp": 2, "zero": 1, "micro_batch_size": 1, "micro_batches": 2, "schedule": "1f1b",
           "chunks": 1, "sequence_parallel": False, "loss_parallel": False}
    assert Layout.from_dict(old) == Layout.parse("dp=2,zero=1,mbs=1,mb=2,schedule=1f1b")
