"""The memory model (workbench.model.memory) against independent computations.

* a hand-computed stage (every term of docs/model.md);
* the contiguous DP against a brute force over partitions that uses the checker's re-derivation
  (workbench.verify.check_memory, which shares no code with it);
* the simulator's memory timeline against the plan's figure;
* torch's MemTracker around plain training steps of models the benchmark does not use.

The views over a whole plan (workbench.model.memory_views) have their tests in test_memory_views.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from instances import compositions
from test_dp import brute_min_period
from workbench.model.chain import Chain, Layer
from workbench.model.memory import (
    device_memory,
    layer_terms,
    stage_activation,
    stage_created,
    stage_excess,
    stage_memory,
    stage_op_excess,
    validate_setup,
)
from workbench.model.target import Target
from workbench.planners import plan as run_planner
from workbench.planners.brute import plan_brute
from workbench.planners.dp.contiguous import plan_dp
from workbench.schedules.simulate import simulate
from workbench.verify.check import check
from workbench.verify.check_memory import memory_by_device


def measured_chain(rng: np.random.Generator, L: int, *, dtype: str = "float32", device: str = "cpu") -> Chain:
    """A chain whose layers carry every memory column, consistent with each other (a layer saves its
    input or not, its output or not, climbs at least to what it keeps; its fresh backward lies between the
    one that adds into its gradients and that plus them)."""
    layers = []
    prev_out = float(rng.integers(1, 60))
    input_bytes = prev_out
    for i in range(L):
        out = float(rng.integers(1, 60))
        W = float(rng.integers(0, 80))
        si = prev_out if rng.random() < 0.6 else 0.0
        so = out if rng.random() < 0.4 else 0.0
        saved = si + so + float(rng.integers(0, 30))
        fp = saved - si + out + float(rng.integers(0, 40))
        bp = out + prev_out + float(rng.integers(0, 60))
        f = float(rng.uniform(0.1, 3.0))
        grad = W if rng.random() < 0.9 else 0.0
        layers.append(Layer(f"l{i}", f, f * float(rng.uniform(1, 3)), W, out, saved, grad_bytes=grad,
                            max_param_bytes=float(rng.integers(0, 1 + int(W))),
                            saved_input_bytes=si, saved_output_bytes=so, forward_peak_bytes=fp, backward_peak_bytes=bp,
                            backward_fresh_peak_bytes=bp + grad / 2))   # between the zeroed climb and it + grads
        prev_out = out
    return Chain(tuple(layers), input_bytes=input_bytes, meta={"dtype": dtype, "device": device})


def test_a_stage_by_hand():
    # l0 saves its input (8 B) and its output (4 B); l1 saves its input (= l0's output: shared) and 2 B more
    l0 = Layer("l0", 1, 1, 10, 4, 12, grad_bytes=10, max_param_bytes=6, saved_input_bytes=8, saved_output_bytes=4,
               forward_peak_bytes=20, backward_peak_bytes=30)
    l1 = Layer("l1", 1, 1, 20, 6, 6, grad_bytes=20, max_param_bytes=20, saved_input_bytes=4, saved_output_bytes=0,
               forward_peak_bytes=9, backward_peak_bytes=11)
    l2 = Layer("l2", 1, 1, 0, 5, 6, grad_bytes=0, max_param_bytes=0, saved_input_bytes=6, saved_output_bytes=0,
               forward_peak_bytes=5, backward_peak_bytes=11)
    chain = Chain((l0, l1, l2), input_bytes=8, meta={"dtype": "float32", "device": "cpu"})
    t = layer_terms(chain, Target.of(2, optimizer="adam", weights="stash", zero_grad="zeros"))
    # activations: l0 12, l1 6 - 4 shared = 2; stage 0..1 holds its output (6 B, not saved by l1)
    assert stage_activation(t, 0, 1) == 12 + 2 + 6
    # stage 1..2 starts at l1: all it saves counts (its input is a copy received, not l0's storage)
    assert stage_activation(t, 1, 2) == 6 + 6
    # static: parameters + gradients + 2 Adam states; a receive buffer for the gradient of its output (6 B);
    # stash: one parameter version per extra mini-batch
    assert stage_memory(t, 0, 1, 3) == 3 * 20 + (30 + 30 + 2 * 30) + 6 + 2 * 30
    # excess: l0's backward (30) less l1's activations (2); l1's: max(9 + 4 - 4 - 2, 11); the step: 2 x 20 - 14 - 6
    assert stage_excess(t, 0, 1) == max(30 - 2, 11, 2 * 20 - 14 - 6)
    assert device_memory(t, [(0, 1, 3)]) == 3 * 20 + 120 + 6 + 60 + 28


def test_the_training_loop_by_hand():
    """zero_grad none (torch's default): no gradient between steps; a stage's backward makes them, the layers
    before it run their backward with the later layers' gradients made, and the step finds them all."""
    l0 = Layer("l0", 1, 1, 10, 4, 12, grad_bytes=10, max_param_bytes=6, saved_input_bytes=8, saved_output_bytes=4,
               forward_peak_bytes=20, backward_peak_bytes=30, backward_fresh_peak_bytes=33)
    l1 = Layer("l1", 1, 1, 20, 6, 6, grad_bytes=20, max_param_bytes=20, saved_input_bytes=4, saved_output_bytes=0,
               forward_peak_bytes=9, backward_peak_bytes=11, backward_fresh_peak_bytes=25)
    chain = Chain((l0, l1), input_bytes=8, meta={"dtype": "float32", "device": "cpu"})
    t = layer_terms(chain, Target.of(1, optimizer="adam", weights="stash", zero_grad="none"))
    # resident: parameters and 2 Adam states, no gradient; k = 3 mini-batches of 12 + 2 activations
    assert stage_memory(t, 0, 1, 3) == 3 * 14 + 3 * 30 + 2 * 30
    # excess: l0's fresh backward (33) with l1's gradients (20) made and its activations (2) freed; l1's
    # fresh backward (25); the step (2 x 20 temporaries) with both layers' gradients (30), 14 B freed
    assert stage_excess(t, 0, 1) == max(33 + 20 - 2, 25, 2 * 20 + 30 - 14)
    zeros = layer_terms(chain, Target.of(1, optimizer="adam", weights="stash", zero_grad="zeros"))
    assert stage_memory(zeros, 0, 1, 3) - stage_memory(t, 0, 1, 3) == 30      # the resident gradients


def _tied_chain() -> Chain:
    """emb (owner of a 40 B parameter, 8 B more of its own) - mid - head (uses the 40 B parameter)."""
    import json

    emb = Layer("emb", 1, 1, 48, 4, 4, grad_bytes=48, max_param_bytes=40, saved_input_bytes=0,
                saved_output_bytes=0, forward_peak_bytes=4, backward_peak_bytes=48, backward_fresh_peak_bytes=48)
    mid = Layer("mid", 1, 1, 6, 4, 4, grad_bytes=6, max_param_bytes=6, saved_input_bytes=4, saved_output_bytes=0,
                forward_peak_bytes=4, backward_peak_bytes=10, backward_fresh_peak_bytes=10)
    head = Layer("head", 1, 1, 0, 2, 4, grad_bytes=0, max_param_bytes=0, saved_input_bytes=4, saved_output_bytes=0,
                 forward_peak_bytes=6, backward_peak_bytes=44, backward_fresh_peak_bytes=44)
    tied = [{"owner": "emb", "layers": ["emb", "head"], "bytes": 40, "parameter": "emb.weight"}]
    return Chain((emb, mid, head), input_bytes=2, meta={"dtype": "float32", "device": "cpu", "tied": json.dumps(tied)})


def test_a_tied_copy_by_hand():
    """docs/model.md, "Tied parameters": a stage holding the head without the embedding holds a copy of the
    tied 40 B: with one weight version (torch's engine) its parameter, gradient and optimizer state, and it
    steps it; with stashing (the PipeDream engine) its parameter and a version per extra mini-batch in
    flight, a fresh gradient sent to the owner, whose stage holds a receive buffer for it per mini-batch in flight."""
    chain = _tied_chain()
    plain = chain.with_meta(tied="[]")
    default = Target.of(2, optimizer="adam", weights="single")      # torch's default loop: no gradient between steps
    assert (stage_memory(layer_terms(chain, default), 2, 2, 1)
            - stage_memory(layer_terms(plain, default), 2, 2, 1)) == 40 + 2 * 40   # the copy and its Adam state
    single = Target.of(2, optimizer="adam", weights="single", zero_grad="zeros")
    t, u = layer_terms(chain, single), layer_terms(plain, single)
    assert stage_memory(t, 2, 2, 1) - stage_memory(u, 2, 2, 1) == 40 + 40 + 2 * 40     # parameter, gradient, Adam
    assert stage_memory(t, 1, 2, 1) - stage_memory(u, 1, 2, 1) == 160
    assert stage_memory(t, 0, 2, 1) == stage_memory(u, 0, 2, 1)                         # the owner's stage: no copy
    assert stage_excess(t, 2, 2) >= 2 * 40 - 4 and stage_excess(u, 2, 2) < 2 * 40 - 4  # Adam steps the copy
    stash = Target.of(2, optimizer="adam", weights="stash", zero_grad="zeros")
    t, u = layer_terms(chain, stash), layer_terms(plain, stash)
    assert stage_memory(t, 2, 2, 3) - stage_memory(u, 2, 2, 3) == 40 + 2 * 40          # copy + 2 stashed versions
    assert stage_memory(t, 0, 1, 3) - stage_memory(u, 0, 1, 3) == 3 * 40     # the owner's receive buffers: one per k
    # the head's backward makes the copy's gradient fresh (no buffer): min(fresh, zeroed + 40) = 44
    assert stage_op_excess(t, 2, 2) == 44 and stage_created(t, 2, 2) == 40
    # one device: the owner and the sharer in one stage, one parameter, nothing added
    one = Target.of(1, optimizer="adam", weights="single", zero_grad="zeros")
    assert device_memory(layer_terms(chain, one), [(0, 2, 1)]) == device_memory(layer_terms(plain, one), [(0, 2, 1)])


def test_ties_and_loops_agree_with_the_checkers_own_derivation():
    """workbench.model.memory (prefix sums, bands) against workbench.verify.check_memory (a loop per stage, written
    from docs/model.md) on random chains with shared parameters and activation policies, every allocation of up
    to 5 layers on up to 3 devices, both loops, both weight policies, loop and foreach steps, bf16-mixed."""
    import itertools
    import json
    import random

    from workbench.model.activations import apply_policies
    from workbench.model.memory_bands import band_terms, suffix_terms
    from workbench.model.plan import stages_of
    from workbench.verify.check_policies import effective_chain

    rng = random.Random(5)
    ties = 0
    for trial in range(150):
        L, P = rng.randint(2, 5), rng.randint(1, 3)
        mixed = rng.random() < 0.3
        chain = measured_chain(np.random.default_rng(trial), L, dtype="bfloat16" if mixed else "float32",
                               device=rng.choice(["cpu", "cuda"]))
        layers = [dataclasses.replace(l, backward_fresh_peak_bytes=rng.choice(
            [None, l.backward_peak_bytes + rng.randint(0, 60)])) for l in chain.layers]
        meta = dict(chain.meta)
        if rng.random() < 0.8:
            users = sorted(rng.sample(range(L), rng.randint(2, min(3, L))))
            meta["tied"] = json.dumps([{"owner": f"l{users[0]}", "layers": [f"l{u}" for u in users],
                                        "bytes": rng.randint(1, 40), "parameter": "w"}])
            ties += 1
        chain = Chain(tuple(layers), chain.input_bytes, meta=meta)
        plat = Target.of(P, optimizer=rng.choice(["sgd", "adam", "momentum"]), weights=rng.choice(["stash", "single"]),
                        zero_grad=rng.choice(["none", "zeros"]), precision="bf16-mixed" if mixed else None)
        policies = [rng.choice(["keep", "keep", "recompute", "offload"]) for _ in range(L)]
        t = layer_terms(apply_policies(chain, policies), plat)
        chain = effective_chain(chain, policies)          # the checker's own effective chain
        for a in itertools.product(range(P), repeat=L):
            runs = stages_of(a)
            ks = [rng.randint(1, 3) for _ in runs]
            per: list[list] = [[] for _ in range(P)]
            for (x, y), k in zip(runs, ks):
                per[a[x]].append((x, y, k))
            want = memory_by_device(chain, plat, [(x, y, a[x], k) for (x, y), k in zip(runs, ks)])
            assert [device_memory(t, st) for st in per] == pytest.approx(want, rel=1e-12), (trial, a, ks)
        I = np.arange(L)[:, None]
        J = np.minimum(I + np.arange(L)[None, :], L - 1)
        band = band_terms(t, I, J).memory(np.full(J.shape, 2.0))
        for i in range(L):
            for j in range(i, L):
                assert band[i, j - i] == pytest.approx(device_memory(t, [(i, j, 2)]), rel=1e-12)
        assert suffix_terms(t).memory(np.ones(L)) == pytest.approx([device_memory(t, [(i, L - 1, 1)])
                                                                    for i in range(L)], rel=1e-12)
    assert ties >= 100


def full_memory(chain, plat, a, b, k):
    """A stage alone on its device, by the checker's re-derivation (not workbench.model.memory)."""
    return memory_by_device(chain, plat.with_(devices=1), [(a, b, 0, k)])[0]


def test_dp_is_exact_under_the_full_model():
    rng = np.random.default_rng(11)
    limited = 0
    for trial in range(80):
        L, P = int(rng.integers(2, 8)), int(rng.integers(2, 4))
        chain = measured_chain(rng, L)
        base = Target.of(P, bandwidth=float(rng.choice([20.0, 80.0])), optimizer=str(rng.choice(["sgd", "adam"])),
                        weights=str(rng.choice(["stash", "single"])))
        least = min(max(full_memory(chain, base, a, b, 1) for a, b in parts) for parts in compositions(L, P))
        plat = base.with_(memory=least * float(rng.uniform(0.9, 2.5)))
        want = min(brute_min_period(chain, plat, parts, full_memory) for parts in compositions(L, P))
        got = plan_dp(chain, plat)
        if math.isinf(want):
            assert got.status == "infeasible", trial
            continue
        limited += 1
        assert got.period == pytest.approx(want, rel=1e-6), trial
        assert check(got, chain, plat) == [], trial
    assert limited >= 40


def test_exact_general_plans_pass_the_checker():
    rng = np.random.default_rng(2)
    done = 0
    for trial in range(25):
        L, P = int(rng.integers(3, 7)), int(rng.integers(2, 4))
        chain = measured_chain(rng, L)
        base = Target.of(P, bandwidth=30.0, optimizer="adam")
        loose = plan_brute(chain, base, allocation="general")
        plat = base.with_(memory=loose.peak_memory * float(rng.uniform(0.6, 1.0)))
        ref = plan_brute(chain, plat, allocation="general")
        if not ref.feasible:
            continue
        done += 1
        assert check(ref, chain, plat) == [], trial
        ilp = run_planner(chain, plat, "ilp", allocation="general", time_limit=30)
        assert check(ilp, chain, plat) == [] and ilp.period >= ref.period * (1 - 1e-6), trial
    assert done >= 10


def test_simulated_peak_is_the_plans_memory_with_one_stage_per_device():
    rng = np.random.default_rng(9)
    for trial in range(20):
        chain = measured_chain(rng, int(rng.integers(3, 8)))
        plat = Target.of(3, bandwidth=40.0, optimizer="adam", weights=str(rng.choice(["stash", "single"])))
        plan = plan_dp(chain, plat)
        trace = simulate(plan, chain, plat, batches=12)
        assert trace.peak_memory() == pytest.approx(np.array(plan.memory), rel=1e-9), trial


@pytest.mark.parametrize("name,config,optimizer", [
    ("mlp", {}, "adam"), ("tiny-gpt", {}, "sgd"), ("tiny-gpt", {"vocab": 2048}, "adamw"),
    ("tiny-resnet", {}, "momentum"), ("vgg16", {"image_size": 32, "channels": [[16], [32, 32]], "hidden": 256}, "adam"),
])
@pytest.mark.parametrize("loop", ["none", "zeros"])
def test_one_device_prediction_against_memtracker(name, config, optimizer, loop):
    """Models and set-ups that benchmarks/memory.py does not use, under torch's default loop (zero_grad sets the
    gradients to None) and with gradients zeroed in place: within 5 % and never 2 % below."""
    from workbench.profiles import zoo
    from workbench.profiles.profiler import profile_zoo
    from workbench.runtime.witness import plain_step_peak

    torch.manual_seed(0)
    chain = profile_zoo(name, 4, repeats=1, warmup=0, **config)
    plan = plan_dp(chain, Target.of(1, weights="single", optimizer=optimizer, zero_grad=loop))
    x, y = zoo.sample_batch(name, 4, **config)
    measured = plain_step_peak(zoo.build_model(name, **config), x, y, zoo.loss_fn(name), optimizer, loop=loop)
    assert -0.02 <= plan.memory[0] / measured - 1 <= 0.05, (plan.memory[0], measured)


def test_a_tied_model_on_one_device_against_memtracker():
    """A layer list sharing its first Linear's weight with its last (as an LM head shares its embedding): the
    profile counts the weight once, and one device's prediction is within 0.5 % of MemTracker, both loops."""
    from torch import nn

    from workbench.profiles.profiler import profile_model
    from workbench.runtime.witness import plain_step_peak

    torch.manual_seed(0)
    shared = nn.Linear(64, 256)
    layers = [shared, nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)]

    class Tied(nn.Module):                        # the head multiplies by the shared weight, transposed
        def __init__(self):
            super().__init__()
            self.weight = shared.weight

        def forward(self, x):
            return x @ self.weight

    model = nn.Sequential(*layers, Tied())
    x = torch.randn(32, 64)
    y = torch.randint(0, 64, (32,))
    loss = nn.functional.cross_entropy
    chain = profile_model(model, x, loss=loss, target=y, repeats=1, warmup=0)
    assert chain.meta.get("tied") and chain.layers[-1].grad_bytes == 0 and chain.weights.sum() == sum(
        p.numel() * 4 for p in model.parameters())
    for loop in ("none", "zeros"):
        plan = plan_dp(chain, Target.of(1, weights="single", optimizer="adam", zero_grad=loop))
        measured = plain_step_peak(model, x, y, loss, "adam", loop=loop)
        assert abs(plan.memory[0] / measured - 1) <= 0.005, (loop, plan.memory[0], measured)


def test_estimates_are_named_and_setups_checked():
    chain = Chain((Layer("a", 1, 1, 10, 4),), meta={"dtype": "float32"})
    plan = plan_dp(chain, Target.of(1))
    assert any("memory estimated" in n and "backward_peak_bytes" in n for n in plan.notes)
    assert plan.setup["estimated"] and plan.setup["optimizer"] == "adam"
    with pytest.raises(ValueError, match="unknown optimizer 'adagrad'"):
        Target.of(1, optimizer="adagrad")
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        Target.of(1, precision="fp8")
    with pytest.raises(ValueError, match="needs a bfloat16 profile"):
        validate_setup(Target.of(1, precision="bf16-mixed"), chain)
    with pytest.raises(ValueError, match="paper's memory model"):
        Target.of(1, weight_factor=4)


def test_cli_one_device_plan_writes_the_peak(tmp_path, capsys):
    from workbench.front.cli import main
    from workbench.model.plan import Plan
    from workbench.profiles import write_profile

    chain = measured_chain(np.random.default_rng(1), 4).with_meta(network="toy")
    prof = tmp_path / "toy.csv"
    write_profile(chain, prof)
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(prof), "--devices", "1", "--weights", "single", "--optimizer", "momentum",
                 "--json", str(out)]) == 0
    plan = Plan.from_json(out)
    want = memory_by_device(chain, Target.of(1, weights="single", optimizer="momentum"), [(0, 3, 0, 1)])[0]
    assert plan.memory[0] == pytest.approx(want) and plan.setup["optimizer"] == "momentum"
    # check and simulate take the plan's set-up
    assert main(["check", str(out), "--profile", str(prof)]) == 0
    assert main(["plan", "--profile", str(prof), "--devices", "1", "--optimizer", "lion"]) != 0
    assert "unknown optimizer 'lion'" in capsys.readouterr().err
