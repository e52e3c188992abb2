"""The analyses' checks compare like with like and fail on results made from different inputs."""

from __future__ import annotations

import pandas as pd

from workbench.experiments.analyses import bound_violations, consistency_violations, sweep_table
from workbench.experiments.units import Unit


def group(net="gpt-medium", P=4, levels=(1.0, 2.0), general_bound=4.16, general_sha="aaaa"):
    """A (network, P) group like data/results had: dp and the ILPs at each level; the general ILP's unit may
    come from another profile version (its own lower bound and profile digest)."""
    rows = []
    for lvl, M in enumerate(levels):
        for mk, per, bound, sha in (("dp", [16.6, 12.6][lvl], 4.16, "aaaa"),
                                    ("ilp-contiguous", [16.6, 12.6][lvl], 4.16, "aaaa"),
                                    ("ilp-general", [7.7, 5.3][lvl], general_bound, general_sha)):
            rows.append({"network": net, "devices": P, "method_key": mk, "level": lvl, "memory_limit": M,
                         "least_memory": levels[0], "period": per, "fits": True, "throughput": 1 / per,
                         "lower_bound": bound, "status": "optimal" if mk != "ilp-general" else "timeout",
                         "n_layers": 26, "profile_sha256": sha, "code_version": "c0de"})
    return pd.DataFrame(rows)


def test_a_consistent_group_passes():
    assert consistency_violations(group()) == [] and bound_violations(group()) == []


def test_two_profile_versions_in_one_group_fail_the_checks():
    # gpt-medium P=4 in data/results: the general ILP ran on the re-profiled file, the others on the old one
    mixed = group(general_bound=1.918, general_sha="bbbb")
    v = bound_violations(mixed)
    assert any("gpt-medium P=4: the units disagree on profile_sha256 (aaaa in dp, ilp-contiguous; bbbb in ilp-general)"
               in x for x in v)
    assert any("disagree on lower_bound (1.918 in ilp-general; 4.16 in dp, ilp-contiguous)" in x for x in v)


def test_one_profile_digest_differing_is_enough():
    v = consistency_violations(group(general_sha="bbbb"))
    assert len(v) == 1 and "profile_sha256" in v[0]


def test_methods_are_not_compared_across_inputs_but_the_mix_is_reported():
    mixed = group(general_bound=1.0, general_sha="bbbb")
    mixed.loc[mixed.method_key == "ilp-general", "status"] = "optimal"
    mixed.loc[mixed.method_key == "ilp-general", "period"] = 20.0  # worse than dp, but on other inputs
    v = bound_violations(mixed)
    assert v and all("disagree" in x for x in v)
    same = group()
    same.loc[same.method_key == "ilp-general", "status"] = "optimal"
    same.loc[same.method_key == "ilp-general", "period"] = 20.0
    assert any("worse than dp" in x for x in bound_violations(same))


def test_memory_levels_must_agree():
    g = group()
    g.loc[(g.method_key == "dp") & (g.level == 1), "memory_limit"] = 2.5
    assert consistency_violations(g) == ["gpt-medium P=4 level 1: the units disagree on the memory limit"]


def test_other_groups_are_checked_separately_and_legacy_units_without_keys_by_their_numbers():
    both = pd.concat([group(), group(net="vgg16", general_bound=0.93)], ignore_index=True)
    both["profile_sha256"] = ""  # units from before the keys: only the numbers can tell
    v = consistency_violations(both)
    assert len(v) == 1 and v[0].startswith("vgg16 P=4: the units disagree on lower_bound")


def test_sweep_table_adds_the_key_columns():
    u = Unit("sweep__n__P2__dp", "sweep", {"profile": {"file": "f.csv", "sha256": "abc"}, "code_version": "v1"})
    t = sweep_table([(u, pd.DataFrame({"method_key": ["dp"], "period": [1.0]}))])
    assert t.loc[0, ["profile_sha256", "code_version", "label"]].tolist() == ["abc", "v1", "memory-aware DP"]
    assert sweep_table([]).empty
