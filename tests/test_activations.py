"""workbench.model.activations: the policies' effect on a layer, the policy terms, plans that carry policies."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from policy_instances import random_chain
from workbench.model.activations import apply_policies, describe, policy_terms, policy_vector, stage_host_time
from workbench.model.chain import Chain, Layer
from workbench.model.memory import layer_terms, stage_activation, stage_excess, stage_memory
from workbench.model.plan import Plan
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.profiles.memtrace import layer_memory
from workbench.profiles.zoo import TransformerBlock


def test_policy_vector_rejects_bad_input():
    assert policy_vector(None, 3) == ("keep",) * 3
    with pytest.raises(ValueError, match="unknown activation policy 'swap'"):
        policy_vector("swap", 2)
    with pytest.raises(ValueError, match="unknown activation policy 'x'"):
        policy_vector(["keep", "x"], 2)
    with pytest.raises(ValueError, match="3 policies for a chain of 2"):
        policy_vector(["keep"] * 3, 2)


def test_recompute_and_offload_by_hand():
    # in 4, out 8, saved 40 (4 of it the input), fp 48, bp 60
    a = Layer("a", 1.0, 2.0, 10, 8, 40, 10, 10, 4, 0, 48, 60)
    chain = Chain((a, Layer("b", 1.0, 1.0, 0, 8)), input_bytes=4)
    rc = apply_policies(chain, ["recompute", "keep"])[0]
    assert (rc.forward, rc.backward) == (1.0, 3.0)                   # backward + forward
    assert (rc.saved_bytes, rc.saved_input_bytes, rc.saved_output_bytes) == (4.0, 4.0, 0.0)
    assert rc.backward_peak_bytes == max(48 + 8, 40 - 4 + 60)        # 96
    off = apply_policies(chain, ["offload", "keep"])[0]
    assert (off.saved_bytes, off.offload_bytes, off.backward) == (0.0, 40.0, 2.0)
    assert off.forward_peak_bytes == 48 - 40 and off.backward_peak_bytes == 60
    assert apply_policies(chain, "keep") is chain


def test_offloaded_copy_counts_once_and_estimates_stay_noted():
    chain = Chain(tuple(Layer(f"l{i}", 1.0, 1.0, 0, 8, 40) for i in range(3)), input_bytes=8)   # no columns measured
    plat = Target.of(1, optimizer="sgd")
    keep = layer_terms(chain, plat)
    eff = apply_policies(chain, "offload")
    t = layer_terms(eff, plat)
    assert np.allclose(t.act, 0) and np.allclose(t.static - keep.static, 40)
    assert t.estimated == keep.estimated                          # the profile's estimates are still named
    assert "memory estimated" in " ".join(run_planner(chain, plat, "dp", activations="offload").notes)
    assert stage_host_time(eff, Target.of(1, host_bandwidth=20), 0, 2) == 6.0


def test_shared_storage_follows_the_neighbours_policy():
    # layer 0 saves its output, layer 1 saves that same tensor as its input: counted once while 0 keeps
    l0 = Layer("r", 1.0, 1.0, 0, 16, 16, 0, 0, 0, 16, 16, 32)
    l1 = Layer("s", 1.0, 1.0, 0, 8, 20, 0, 0, 16, 0, 24, 40)
    chain = Chain((l0, l1), input_bytes=16)
    plat = Target.of(1, optimizer="sgd")
    both = layer_terms(chain, plat)
    assert both.act.tolist() == [16.0, 4.0]
    first_rc = layer_terms(apply_policies(chain, ["recompute", "keep"]), plat)
    assert first_rc.act.tolist() == [16.0, 20.0]                   # the input (kept by 0's checkpoint), l1 whole


def test_policy_terms_assemble_every_stage_of_every_vector():
    rng = random.Random(7)
    for trial in range(40):
        chain = random_chain(rng, rng.randint(2, 6))
        plat = Target.of(2, optimizer=rng.choice(["sgd", "adam"]), memory_model=rng.choice(["full", "paper"]))
        pt = policy_terms(chain, plat)
        L = len(chain)
        vec = [rng.randrange(3) for _ in range(L)]
        eff = layer_terms(apply_policies(chain, [("keep", "recompute", "offload")[q] for q in vec]), plat)
        for l in range(L):
            p = vec[l - 1] if l else 0
            q = vec[l]
            assert pt.act[p, q, l] == pytest.approx(eff.act[l])
            assert pt.head[p, q, l] == pytest.approx(eff.head[l])
            assert pt.peak[p, q, l] == pytest.approx(eff.peak[l])
            assert pt.tail[q, l] == pytest.approx(eff.tail[l]) and pt.static[q, l] == pytest.approx(eff.static[l])


def test_keep_gives_todays_plans():
    chain = random_chain(random.Random(3), 6)
    plat = Target.of(3, memory=900, optimizer="sgd")
    for method in ("dp", "pipedream", "mcap", "uniform"):
        a = run_planner(chain, plat, method)
        b = run_planner(chain, plat, method, activations="keep")
        assert (a.period, a.assignment, a.memory, a.activations) == (b.period, b.assignment, b.memory, ())
        assert a.to_dict()["activations"] == ["keep"] * len(chain)


def test_plan_json_round_trip_keeps_policies(tmp_path):
    chain = random_chain(random.Random(5), 4)
    p = run_planner(chain, Target.of(2, optimizer="sgd"), "dp", activations=["keep", "recompute", "offload", "keep"])
    assert p.activations == ("keep", "recompute", "offload", "keep")
    assert p.lower_bound == pytest.approx(run_planner(chain, Target.of(2, optimizer="sgd"), "dp").lower_bound)
    back = Plan.from_json(p.to_json(tmp_path / "p.json"))
    assert back.activations == p.activations and "recompute 1" in describe(back.activations)
    with pytest.raises(ValueError, match="activation policy"):
        Plan.from_dict({**p.to_dict(), "activations": ["keep", "swap", "keep", "keep"]})


def test_flushed_schedules_refuse_offload():
    chain = random_chain(random.Random(1), 4)
    with pytest.raises(ValueError, match="keep or recompute"):
        run_planner(chain, Target.of(2), "gpipe", activations="offload", micro_batches=2)
    with pytest.raises(ValueError, match="does not choose"):
        run_planner(chain, Target.of(2), "1f1b", activations="auto", micro_batches=2)
    assert run_planner(chain, Target.of(2), "gpipe", activations="recompute", micro_batches=2).activations


@pytest.mark.parametrize("make", [lambda: (TransformerBlock(32, 2), torch.randn(2, 16, 32)),
                                  lambda: (torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU()),
                                           torch.randn(2, 4, 8, 8)),
                                  lambda: (torch.nn.Linear(16, 32), torch.randn(8, 16))])
def test_recompute_bounds_a_checkpointed_layer(make):
    """The recompute rule against torch.utils.checkpoint under the profiler's tracker (benchmarks/policies.py
    prints the full table): never below, and the backward peak within 30 % (conv+ReLU is the loosest:
    the checkpoint frees each recomputed tensor once used)."""
    from workbench.runtime.policy_layers import Recomputed

    torch.manual_seed(0)
    module, x = make()
    cols = layer_memory(module, x, input_requires_grad=True)
    from workbench.profiles.profiler import saved_tensor_bytes

    saved = float(saved_tensor_bytes(module, x)[0])
    out = float(module(x).numel() * 4)
    layer = Layer("x", 1.0, 1.0, 0, out, saved, cols["grad_bytes"], cols["max_param_bytes"], cols["saved_input_bytes"],
                  cols["saved_output_bytes"], cols["forward_peak_bytes"], cols["backward_peak_bytes"])
    eff = apply_policies(Chain((layer,), input_bytes=float(x.numel() * 4)), "recompute")[0]
    got = layer_memory(Recomputed(module), x, input_requires_grad=True)
    assert got["saved_input_bytes"] == eff.saved_input_bytes and got["saved_output_bytes"] == 0
    assert eff.forward_peak_bytes >= got["forward_peak_bytes"]
    assert got["backward_peak_bytes"] <= eff.backward_peak_bytes <= 1.3 * got["backward_peak_bytes"]


def test_stage_memory_from_policy_terms_matches_memory_module():
    """A stage assembled from policy_terms the way dp_auto does equals stage_memory of the effective chain."""
    rng = random.Random(11)
    for _ in range(30):
        chain = random_chain(rng, 5)
        plat = Target.of(2, optimizer="adam")
        pol = [rng.choice(["keep", "recompute", "offload"]) for _ in range(5)]
        t = layer_terms(apply_policies(chain, pol), plat)
        pt = policy_terms(chain, plat)
        q = [("keep", "recompute", "offload").index(p) for p in pol]
        i, j = 1, 3
        S = sum(pt.act[q[l - 1], q[l], l] for l in range(i, j + 1))
        A = S + pt.head[q[i - 1], q[i], i] + pt.tail[q[j], j]
        assert A == pytest.approx(stage_activation(t, i, j))
        static = sum(pt.static[q[l], l] for l in range(i, j + 1))
        buffers = t.buf_in[i] + t.buf_out[j]          # receive buffers: fixed by the stage's boundaries
        assert stage_memory(t, i, j, 2) == pytest.approx(2 * A + static + buffers + float(np.sum(t.stash[i:j + 1])))
        assert stage_excess(t, i, j) >= 0
