"""workbench.verify.check_policies: the checker's own policy reading agrees with the planners', and rule 8 catches
host-link faults a planner's side cannot see."""

from __future__ import annotations

import random

import pytest

from policy_instances import random_chain
from workbench.model.activations import apply_policies
from workbench.model.chain import Chain, Layer
from workbench.model.plan import make_plan
from workbench.model.target import Target
from workbench.verify.check import check, format_violations
from workbench.verify.check_policies import effective_chain

_FIELDS = ("forward", "backward", "saved_bytes", "saved_input_bytes", "saved_output_bytes", "forward_peak_bytes",
           "backward_peak_bytes", "offload_bytes", "grad_bytes", "max_param_bytes")


def test_effective_chains_agree():
    rng = random.Random(2)
    for _ in range(50):
        chain = random_chain(rng, 5)
        pol = [rng.choice(["keep", "recompute", "offload"]) for _ in range(5)]
        a, b = apply_policies(chain, pol), effective_chain(chain, pol)
        for la, lb, p in zip(a.layers, b.layers, pol):
            for f in _FIELDS:
                va, vb = getattr(la, f), getattr(lb, f)
                assert (va is None and vb is None) if p == "keep" and va is None else va == pytest.approx(vb), (p, f)


def _offload_chain() -> tuple[Chain, Target]:
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 4, 40) for i in range(2)), input_bytes=4)
    return chain, Target.of(1, memory_model="paper", host_bandwidth=40)     # 40 bytes: 1 s each way


def test_rule_8_gap_must_hold_the_round_trip():
    chain, plat = _offload_chain()
    eff = apply_policies(chain, ["offload", "keep"])
    # one stage: F = 2, B = 2; round trip 2 s -> period 6, backward at f + F + 2
    good = make_plan(eff, plat, 6.0, [0, 0], [0.0], [4.0]).with_(activations=("offload", "keep"))
    assert check(good, chain, plat) == []
    short = make_plan(eff, plat, 6.0, [0, 0], [0.0], [3.0]).with_(activations=("offload", "keep"))
    v = check(short, chain, plat)
    assert [x.rule for x in v] == [8] and "short by 1000 ms" in v[0].message
    assert " 8" in format_violations(v, 1).splitlines()[0]
    assert " 8" not in format_violations(check(short.with_(activations=()), chain, plat) or
                                         [x for x in v if x.rule != 8], 1).splitlines()[0]


def test_rule_8_transfers_of_two_stages_on_one_device():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 4, 40) for i in range(3)), input_bytes=4)
    plat = Target.of(2, memory_model="paper", host_bandwidth=40)
    pol = ("offload", "keep", "offload")
    eff = apply_policies(chain, pol)
    # device 0 holds layers 0 and 2; transfers take 1 s each way. Stage 2's transfer out, [8, 9), meets stage
    # 0's transfer back, [18, 19) = [8, 9) modulo 10; every other rule holds
    plan = make_plan(eff, plat, 10.0, [0, 1, 0], [0.0, 1.0, 7.0], [19.0, 12.0, 11.0]).with_(activations=pol)
    v = check(plan, chain, plat)
    assert [x.rule for x in v] == [8] and "overlap modulo the period" in v[0].message
    moved = make_plan(eff, plat, 10.0, [0, 1, 0], [0.0, 1.0, 6.0], [19.0, 12.0, 11.0]).with_(activations=pol)
    assert check(moved, chain, plat) == []          # stage 2's out now [7, 8): apart


def test_policies_for_another_chain_are_structure_faults():
    chain, plat = _offload_chain()
    plan = make_plan(chain, plat, 6.0, [0, 0], [0.0], [2.0]).with_(activations=("offload",))
    assert [v.rule for v in check(plan, chain, plat)] == [0]


def test_recompute_lengthens_the_backward_the_checker_sees():
    chain, plat = _offload_chain()
    plan = make_plan(chain, plat, 4.0, [0, 0], [0.0], [2.0])
    assert check(plan, chain, plat) == []
    v = check(plan.with_(activations=("recompute", "keep")), chain, plat)
    assert v and {x.rule for x in v} <= {5, 7}        # a 3 s backward no longer fits beside the forward in 4 s


def test_command_line_checks_with_the_plans_host_link(tmp_path, capsys):
    """plan --activations auto records its host bandwidth; check uses it unless told otherwise."""
    import json

    from workbench.front.cli import main

    out = tmp_path / "p.json"
    args = ["--profile", "gpt-small", "--devices", "4", "--memory", "680MiB", "--optimizer", "sgd"]
    assert main(["plan", *args, "--activations", "auto", "--host-bandwidth", "2GB/s", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert "offload" in d["activations"] and d["memory_setup"]["host_bandwidth"] == 2e9
    assert main(["check", str(out), *args]) == 0
    assert main(["check", str(out), *args, "--host-bandwidth", "0.05GB/s"]) == 1
    assert "rule 8 (host link)" in capsys.readouterr().out
