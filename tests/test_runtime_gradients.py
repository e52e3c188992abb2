"""workbench.runtime.gradients: the gradient check against one process, on a one-layer model."""

from __future__ import annotations

import pytest
import torch

from workbench.profiles.workload import Workload
from workbench.runtime.gradients import grad_error, grad_tolerance, reference_gradients


def test_reference_gradients_are_the_sum_over_the_mini_batches():
    """The reference equals each mini-batch's gradients on a fresh copy of the model, added up here; the
    model's weights do not move."""
    wl = Workload.zoo("mlp", 4, sizes=(3, 2))
    model = wl.build()
    w, b = model[0].weight.detach(), model[0].bias.detach()
    steps = 3
    ref = reference_gradients(wl, steps)
    assert set(ref) == {n for n, _ in model.named_parameters()}
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(steps):
        m = wl.build()
        x, y = wl.batch(i)
        wl.loss(m(x), y).backward()
        for n, p in m.named_parameters():
            total[n] += p.grad
    assert grad_error(ref, total)[1] < 1e-6
    assert torch.equal(model[0].weight.detach(), w) and torch.equal(model[0].bias.detach(), b)


def test_grad_error_names_missing_parameters_and_tolerances_follow_the_dtype():
    with pytest.raises(ValueError, match="gradient names differ"):
        grad_error({"a": torch.ones(1)}, {"b": torch.ones(1)})
    assert grad_tolerance("float32") < grad_tolerance("bfloat16")
