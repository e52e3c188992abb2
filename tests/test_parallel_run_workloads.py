"""workbench.parallel.run.workloads: small HF decoders with a fresh batch per mini-batch, the model's own loss."""

import pytest
import torch

from workbench.parallel.run.workloads import hf_workload


def test_batches_differ_by_index_and_repeat_by_index():
    wl = hf_workload("llama", batch_size=2, sequence=8, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64)
    x0, y0 = wl.batch(0)
    assert torch.equal(x0, wl.batch(0)[0]) and not torch.equal(x0, wl.batch(1)[0])
    assert torch.equal(x0[:, 1:], y0[:, :-1])              # next-token targets
    loss = wl.loss(wl.build()(x0), y0)
    assert loss.ndim == 0 and 3.0 < float(loss.detach()) < 5.0       # about log(64) for random weights
    assert wl.layers().tied == ()                           # Llama's head is its own


def test_gpt2s_head_is_tied_and_unknown_kinds_refused():
    model = hf_workload("gpt2", layers=2, hidden=32, heads=4, vocab=64).build()
    assert model.lm_head.weight is model.transformer.wte.weight
    with pytest.raises(ValueError, match="unknown decoder 'bert'"):
        hf_workload("bert")
