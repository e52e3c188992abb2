"""Data parallelism in the memory model (workbench.model.memory_zero) against independent computations:

* torch's own trackers around real DDP / ZeroRedundancyOptimizer / FSDP2 steps of the same model on a fake
  process group (workbench.parallel.data.witness: FSDPMemTracker, MemTracker), which share no code with the
  profile the prediction comes from;
* the checker's own re-derivation (workbench.verify.check_memory) on random chains, every ZeRO level, with
  and without a pipeline;
* the order of the levels: each holds no more than the one below it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from test_memory import measured_chain
from workbench.model.memory import layer_terms
from workbench.model.memory_zero import DataParallel, forward_gathers, optimizer_bytes, shard_layer_terms
from workbench.model.target import Target
from workbench.parallel.data.witness import rank_peak
from workbench.planners import plan
from workbench.profiles.fake import default_dtype, fake_profile


def small_llama(dtype: torch.dtype, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    def build():
        cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=False, use_cache=False)
        with default_dtype(dtype):
            model = LlamaForCausalLM(cfg)
        ids = torch.randint(0, 512, (2, 128))
        return model, ids, ids.roll(-1, 1), lambda out, y: F.cross_entropy(out.logits.flatten(0, 1).float(),
                                                                           y.flatten())

    return build


@pytest.fixture(scope="module")
def profiles():
    return {dt: fake_profile(small_llama(dt), "h100-sxm") for dt in (torch.float32, torch.bfloat16)}


def predicted(chain, dp: int, zero: int, precision: str, micro_batches: int = 1) -> float:
    result = plan(chain, Target.of(1, optimizer="adamw", precision=precision, weights="single", dp=dp, zero=zero),
                  "1f1b", micro_batches=micro_batches)
    assert not result.extra.get("violations"), result.extra.get("violations")
    return float(result.memory[0])


@pytest.mark.parametrize("zero,dp,mb,precision", [(2, 4, 1, "fp32"), (3, 4, 2, "fp32"), (3, 8, 1, "bf16"),
                                                  (2, 2, 1, "bf16-mixed"), (3, 4, 1, "bf16-mixed")])
def test_fsdp_rank_within_target_of_fsdp_mem_tracker(profiles, zero, dp, mb, precision):
    """FSDP2 on a fake world under fake tensors: the model's rank peak within -2 % .. +5 % of FSDPMemTracker's."""
    chain = profiles[torch.float32 if precision == "fp32" else torch.bfloat16]
    build = small_llama(torch.float32 if precision != "bf16" else torch.bfloat16)
    measured = rank_peak(build, dp=dp, zero=zero, micro_batches=mb, fake=True, mixed=precision == "bf16-mixed")
    error = predicted(chain, dp, zero, precision, mb) / measured - 1
    assert -0.02 <= error <= 0.05, f"zero {zero}, dp {dp}: {error:+.2%}"


@pytest.mark.parametrize("zero,mb", [(0, 1), (0, 2), (1, 1)])
def test_ddp_rank_within_target_of_mem_tracker(profiles, zero, mb):
    """DDP (its buckets) and ZeroRedundancyOptimizer on real tensors: within -2 % .. +5 % of MemTracker."""
    measured = rank_peak(small_llama(torch.float32), dp=4, zero=zero, micro_batches=mb)
    error = predicted(profiles[torch.float32], 4, zero, "fp32", mb) / measured - 1
    assert -0.02 <= error <= 0.05, f"zero {zero}: {error:+.2%}"


def test_ddp_buckets_are_a_second_copy_of_the_gradients(profiles):
    """What DDP adds to a one-device step is one copy of the gradients (its buckets), in the model and in torch's
    tracker alike."""
    chain = profiles[torch.float32]
    grads = float(sum(layer.grad_bytes for layer in chain.layers))
    model_added = predicted(chain, 2, 0, "fp32") - float(plan(chain, Target.of(1, optimizer="adamw", weights="single"),
                                                              "1f1b", micro_batches=1).memory[0])
    assert model_added == pytest.approx(grads)


@pytest.mark.parametrize("seed", range(6))
def test_checker_rederives_every_zero_level(seed):
    """The checker (its own reading of docs/model.md) finds no fault with plans made under every ZeRO level, on
    one device and in pipelines, periodic and flushed, both training loops and precisions."""
    rng = np.random.default_rng(seed)
    chain = measured_chain(rng, 7, dtype="bfloat16", device="cuda")
    for zero in (0, 1, 2, 3):
        for devices, method in ((1, "1f1b"), (3, "1f1b"), (3, "gpipe"), (2, "interleaved-1f1b"), (3, "dp")):
            if method == "dp" and zero >= 2:
                continue
            loop = "zeros" if seed % 2 else "none"
            precision = "bf16-mixed" if seed % 3 else "bf16"
            platform = Target.of(devices, optimizer="adam", precision=precision, zero_grad=loop, dp=4, zero=zero,
                                weights="single" if method != "dp" else "stash")
            result = plan(chain, platform, method, **({} if method == "dp" else {"micro_batches": 4}))
            assert result.feasible
            assert not result.extra.get("violations"), (zero, method, result.extra.get("violations"))


@pytest.mark.parametrize("pipelined", [False, True])
def test_each_level_holds_no_more_than_the_one_below(pipelined):
    """Resident state falls from DDP to ZeRO-1 to FSDP (zero 2, 3); zero 3 never holds more than zero 2."""
    rng = np.random.default_rng(3)
    chain = measured_chain(rng, 6, dtype="bfloat16", device="cuda")
    devices = 2 if pipelined else 1
    static = [float(layer_terms(chain, Target.of(devices, optimizer="adamw", precision="bf16-mixed", dp=8,
                                                zero=z)).static.sum()) for z in (0, 1, 2, 3)]
    assert static[0] > static[1] > static[2] >= static[3]
    peaks = [predicted_peak(chain, devices, z) for z in (0, 1, 2, 3)]
    assert peaks[0] > peaks[1] > peaks[2] >= peaks[3]


def predicted_peak(chain, devices: int, zero: int) -> float:
    platform = Target.of(devices, optimizer="adamw", precision="bf16-mixed", weights="single", dp=8, zero=zero)
    return max(plan(chain, platform, "1f1b", micro_batches=4).memory)


def test_terms_by_hand():
    """A hand-computed case of every term: two layers of 8 and 4 bytes, Adam, fp32, four ranks."""
    W = np.array([8.0, 4.0])
    z3 = DataParallel(4, 3)
    assert forward_gathers(W, z3).tolist() == [12.0, 4.0]              # own + the next layer's prefetch
    t = shard_layer_terms(W, W, np.zeros(2), np.array([1.0, 2.0]), states=2, wide=1.0, mixed=False, zeros=False,
                          foreach=True, dp=z3)
    assert t["parameters"].tolist() == [2.0, 1.0] and t["optimizer"].tolist() == [4.0, 2.0]
    assert t["bwd"].tolist() == [2 * 8 + 2 + 1, 2 * 4 + 1 + 2 + 8]    # reduce-scatter: 2G + G/D + in (+ prefetch)
    assert optimizer_bytes(W, 2, 2.0, DataParallel(4, 1)).tolist() == [8.0, 4.0]
    piped = shard_layer_terms(W, W, np.zeros(2), np.zeros(2), states=2, wide=2.0, mixed=True, zeros=True,
                              foreach=True, dp=DataParallel(4, 2, pipelined=True))
    assert piped["parameters"].tolist() == [8 + 4.0, 4 + 2.0]         # unsharded + the fp32 shard (the master)
    assert piped["gradients"].tolist() == [8 + 4.0, 4 + 2.0]
