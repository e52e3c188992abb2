"""workbench.parallel.run.tensor: sizes tp does not divide are refused naming them, with or without the plan."""

import pytest

from workbench.parallel.run.tensor import check_tensor_parallel, tensor_parallel_plan
from workbench.parallel.run.workloads import hf_workload


def test_sizes_tp_does_not_divide_are_named():
    llama = hf_workload("llama", layers=2, hidden=48, heads=6, kv_heads=2, vocab=100, mlp=96).build()
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's .*key/value heads \(2\)"):
        check_tensor_parallel(llama, 4)
    with pytest.raises(ValueError, match=r"tp=3 does not divide the model's .*key/value heads \(2\)"):
        check_tensor_parallel(llama, 3)
    check_tensor_parallel(llama, 1)


def test_tp_2_needs_the_sharding_plan():
    llama = hf_workload("llama", layers=2, hidden=32, heads=4, kv_heads=2, vocab=64).build()
    if tensor_parallel_plan() is None:
        with pytest.raises(ValueError, match="needs the sharding plan of workbench.parallel.tensor"):
            check_tensor_parallel(llama, 2)
    else:
        check_tensor_parallel(llama, 2)


def test_gpt2_sizes_tp_does_not_divide_are_named():
    gpt2 = hf_workload("gpt2", layers=2, hidden=48, heads=6, vocab=100).build()
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's query heads \(6\), key/value heads "
                                         r"\(6\); sizes: query heads 6, key/value heads 6, hidden 48"):
        check_tensor_parallel(gpt2, 4)
    with pytest.raises(ValueError, match=r"tp=8 does not divide the model's query heads \(6\), key/value heads "
                                         r"\(6\), vocabulary \(100\); .* pad the vocabulary"):
        check_tensor_parallel(gpt2, 8)
    check_tensor_parallel(gpt2, 2)


def test_model_order_puts_the_fused_projection_back():
    import torch

    from workbench.parallel.run.tensor import ModelOrder
    from workbench.parallel.tensor.styles import fused_order

    w = torch.randn(4, 24)
    order = ModelOrder({"attn.c_attn.weight": (1, 3)}, 2)
    assert torch.equal(order("attn.c_attn.weight", w[:, fused_order(24, 3, 2)]), w)
    assert order("attn.c_proj.weight", w) is w
