"""Tests of workbench.profiles.wrappers' model_call (the wrappers themselves are tested through discovery,
tests/test_discover.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.profiles.wrappers import ModelFailure, model_call


def test_what_the_model_raises_is_a_model_failure_with_its_cause():
    with pytest.raises(ModelFailure, match="^layer 3 \\(Linear\\)'s forward$") as e:
        model_call(nn.Linear(2, 3), torch.zeros(1, 4), "layer 3 (Linear)'s forward")
    assert isinstance(e.value.__cause__, RuntimeError) and "shapes cannot be multiplied" in str(e.value.__cause__)


def test_without_a_failure_text_nothing_is_wrapped_and_a_good_call_returns_its_value():
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        model_call(nn.Linear(2, 3), torch.zeros(1, 4), None)
    assert model_call(nn.Linear(2, 3), torch.zeros(5, 2), "never said").shape == (5, 3)


def test_an_operation_fake_tensors_cannot_run_passes_through_for_the_fake_profiler_to_word():
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    with FakeTensorMode():
        x = torch.ones(3)
        with pytest.raises(DataDependentOutputException):
            model_call(lambda t: torch.zeros(int(t.sum().item())), x, "layer 0 (Lambda)'s forward")
