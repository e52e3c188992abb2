"""workbench.parallel.tensor.real: the fake profile against the same model measured on real gloo ranks.

Issue 37: a small Llama-style decoder (2 blocks, hidden 64, 4 heads, 2 key/value heads) and a small GPT-2 of
the same sizes (its fused query/key/value split by heads, its head tied) profiled under fake tensors with a
fake group of tp=2 give every rank's memory columns as measured on 2 gloo processes with real CPU tensors,
by the same allocator-level tracker (within 1 %; they agree to the byte here), with and without sequence
parallelism.
"""

from __future__ import annotations

import pytest

from workbench.model.chain import COMM_FIELDS, MEMORY_COLUMNS
from workbench.parallel.tensor.profile import tensor_parallel_profile
from workbench.parallel.tensor.real import gloo_tensor_parallel
from workbench.parallel.tensor.tiny import tiny_gpt2, tiny_llama

COLUMNS = ("weight_bytes", "activation_bytes", "saved_bytes") + MEMORY_COLUMNS + COMM_FIELDS


@pytest.mark.parametrize("build, sequence_parallel", [(tiny_llama, False), (tiny_gpt2, False),
                                                      pytest.param(tiny_llama, True, marks=pytest.mark.slow),
                                                      pytest.param(tiny_gpt2, True, marks=pytest.mark.slow)],
                         ids=["llama", "gpt2", "llama-sp", "gpt2-sp"])
def test_fake_profile_matches_every_gloo_rank(build, sequence_parallel):
    ranks = gloo_tensor_parallel(build, "h100-sxm", 2, sequence_parallel=sequence_parallel)
    fake = tensor_parallel_profile(build, "h100-sxm", 2, sequence_parallel=sequence_parallel, cache=False)
    assert len(ranks) == 2
    for rank, real in enumerate(ranks):
        assert real.meta["tp_rank"] == str(rank) and [l.name for l in real.layers] == [l.name for l in fake.layers]
        for f, r in zip(fake.layers, real.layers):
            for column in COLUMNS:
                want, got = getattr(f, column), getattr(r, column)
                assert got == pytest.approx(want, rel=0.01, abs=0), (rank, f.name, column)
    assert sum(l.forward_peak_bytes for l in ranks[0].layers) > 0


def test_a_model_tp_does_not_divide_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's key/value heads \(2\)"):
        gloo_tensor_parallel(tiny_llama, "h100-sxm", 4)
