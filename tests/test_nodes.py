"""Platforms of several nodes: a stage boundary between two nodes pays the node link, in dp, the checker, the
simulator and brute force, against the exhaustive oracle (tests/oracles.py) placed as dp places stages."""

from __future__ import annotations

import math
import random

import pytest

from oracles import optimal_plan
from policy_instances import random_chain
from workbench.model.chain import Chain, Layer
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.planners.partition import SuffixLinks, place
from workbench.schedules.simulate import simulate
from workbench.verify.check import check
from workbench.verify.check_memory import memory_by_device


def test_the_pairs_link_prices_a_transfer():
    p = Target.of(8, bandwidth="400GB/s", devices_per_node=4, node_bandwidth="50GB/s", latency=1e-6)
    assert p.comm_time(4e9, 0, 3) == pytest.approx(1e-6 + 4e9 / 400e9)
    assert p.comm_time(4e9, 3, 4) == pytest.approx(1e-6 + 4e9 / 50e9)
    assert p.comm_time(4e9) == p.comm_time(4e9, 0, 1)            # no pair given: the link within a node
    assert p.multi_node and not Target.of(8, devices_per_node=8).multi_node and not Target.of(8).multi_node
    # the slower of the two links, whichever it is
    assert Target.of(2, bandwidth=10.0, devices_per_node=1, node_bandwidth=100.0).comm_time(10.0, 0, 1) == 1.0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_devices_per_node_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="devices per node"):
        Target.of(4, devices_per_node=bad)


def test_dp_places_stages_on_the_last_devices_and_knows_each_boundarys_link():
    plat = Target.of(6, bandwidth=100.0, devices_per_node=2, node_bandwidth=1.0)
    assert place([(0, 0), (1, 2), (3, 3)], plat) == (3, 4, 4, 5)
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 10) for i in range(4)))
    links = SuffixLinks(chain, plat)
    # q stages to go: the stage is on device 6 - q; 6 - q -> 7 - q crosses nodes for q = 3 and 5
    assert [links.after(q)[0] for q in (2, 3, 4, 5, 6)] == [0.1, 10.0, 0.1, 10.0, 0.1]


def _instance(seed: int) -> tuple[Chain, Target]:
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(3, 5))
    n = rng.choice([1, 2])
    plat = Target.of(4, optimizer=rng.choice(["sgd", "adam"]), weights=rng.choice(["stash", "single"]),
                    bandwidth=rng.uniform(50, 200), devices_per_node=n, node_bandwidth=rng.uniform(2, 20))
    roomy = max(memory_by_device(chain, plat.with_(devices=1), [(0, len(chain) - 1, 0, 2)]))
    return chain, plat.with_(memory=roomy * rng.uniform(0.3, 1.2))


def test_dp_is_optimal_over_its_placement_on_several_nodes():
    """dp against the oracle over every contiguous allocation on the last devices (the oracle prices
    each boundary with the pair's link, through Platform.comm_time)."""
    compared = 0
    for seed in range(24):
        chain, plat = _instance(7000 + seed)
        want = optimal_plan(chain, plat, "contiguous", last=True)
        got = run_planner(chain, plat, "dp")
        if want is None:
            assert not got.feasible, seed
            continue
        assert got.feasible and not check(got, chain, plat), seed
        assert got.period == pytest.approx(want.period, rel=1e-6), (seed, got.assignment, want.assignment)
        compared += 1
    assert compared >= 12


def test_a_boundary_between_nodes_pays_the_node_link_in_check_and_simulate():
    chain = Chain(tuple(Layer(f"l{i}", 2.0, 2.0, 0, 100) for i in range(2)), input_bytes=1)
    one = Target.of(2, bandwidth=100.0, memory_model="paper")             # c = 1 s
    two = one.with_(devices_per_node=1, node_bandwidth=20.0)              # c = 5 s between the nodes
    p1, p2 = run_planner(chain, one, "dp"), run_planner(chain, two, "dp")
    assert p1.assignment == p2.assignment == (0, 1)
    assert p1.period == pytest.approx(4.0) and p2.period == pytest.approx(5.0)     # rule 6: the link's load
    # the plan made for one node breaks rule 6 (or the chain rules) on two: its link cannot carry it in time
    assert not check(p1, chain, one) and check(p1, chain, two)
    trace = simulate(p2, chain, two, batches=12)
    assert trace.steady_period() == pytest.approx(p2.period, rel=1e-6)


def test_auto_activations_on_several_nodes_make_valid_plans():
    for seed in range(6):
        chain, plat = _instance(7100 + seed)
        keep = run_planner(chain, plat, "dp")
        auto = run_planner(chain, plat, "dp", activations="auto")
        if auto.feasible:
            assert not check(auto, chain, plat), seed
        if keep.feasible:
            assert auto.feasible and auto.period <= keep.period * (1 + 1e-9), seed


def test_brute_prices_the_pairs_link():
    chain, plat = _instance(7200)
    plat = plat.with_(memory=math.inf)
    got = run_planner(chain, plat, "brute", allocation="general")
    want = optimal_plan(chain, plat, "general")
    assert got.period == pytest.approx(want.period, rel=1e-6)


def test_the_ilp_refuses_several_nodes_in_one_line():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 10) for i in range(4)))
    with pytest.raises(ValueError, match="ilp does not model a platform of several nodes"):
        run_planner(chain, Target.of(4, devices_per_node=2), "ilp")


def test_cli_gpu_and_nodes(tmp_path, capsys):
    from workbench.front.cli import main
    from workbench.model.plan import Plan
    from workbench.profiles import write_profile

    chain = Chain(tuple(Layer(f"l{i}", 1e-3, 2e-3, 1e6, 4e6) for i in range(8)), input_bytes=1e6)
    prof, out = tmp_path / "c.csv", tmp_path / "p.json"
    write_profile(chain, prof)
    assert main(["plan", "--profile", str(prof), "--devices", "4", "--gpu", "a100-40gb", "--json", str(out)]) == 0
    plan = Plan.from_json(out)
    assert plan.memory_limit == 40e9 and plan.setup["gpu"] == "a100-40gb" and plan.setup["bandwidth"] == 300e9
    argv = ["plan", "--profile", str(prof), "--devices", "4", "--devices-per-node", "2", "--node-bandwidth",
            "10GB/s", "--json", str(out)]
    assert main(argv) == 0
    plan = Plan.from_json(out)
    assert plan.setup["devices_per_node"] == 2 and plan.setup["node_bandwidth"] == 10e9
    capsys.readouterr()
    assert main(["check", str(out), "--profile", str(prof)]) == 0              # the plan's nodes, by default
    assert main(["check", str(out), "--profile", str(prof), "--node-bandwidth", "100MB/s"]) == 1
    capsys.readouterr()
    for argv, pattern in [(["--gpu", "v100"], "unknown GPU 'v100'; known: a100-40gb"),
                          (["--devices-per-node", "2", "--method", "ilp"], "ilp does not model a platform of several")]:
        assert main(["plan", "--profile", str(prof), "--devices", "4"] + argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and pattern in err and len(err.strip().splitlines()) == 1
