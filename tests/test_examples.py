"""examples/: each model built from its public configuration has the published parameter count, under fake
tensors (nothing allocated), and a reduced one profiles fake end to end."""

from __future__ import annotations

import pytest
import torch

from workbench.paths import REPO_ROOT
from workbench.profiles.usermodel import load_user_model

pytest.importorskip("transformers")

#: FILE:FUNC -> published parameter count (Meta's model cards; GPT-3 paper Table 2.1; ViT paper Table 1)
PUBLISHED = {
    "llama3.py:llama3_8b": 8.03e9,
    "llama3.py:llama3_70b": 70.6e9,
    "gpt3.py:gpt3_1_3b": 1.3e9,
    "gpt3.py:gpt3_6_7b": 6.7e9,
    "gpt3.py:gpt3_13b": 13.0e9,
    "vit.py:vit_h14": 632e6,
}


@pytest.mark.parametrize("spec", sorted(PUBLISHED))
def test_each_example_has_its_published_size_in_bf16(spec):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.profiles.fake import value_free_init

    with FakeTensorMode(), value_free_init():
        um = load_user_model(str(REPO_ROOT / "examples" / spec))
        params = {id(p): p for p in um.model.parameters()}       # tied weights once
        count = sum(p.numel() for p in params.values())
        assert {p.dtype for p in params.values()} == {torch.bfloat16}
        assert torch.get_default_dtype() == torch.float32           # restored after building
    assert count == pytest.approx(PUBLISHED[spec], rel=0.03), count


def test_a_reduced_llama_profiles_fake():
    from workbench.profiles.fake import fake_module

    chain = fake_module(str(REPO_ROOT / "examples" / "llama3.py:llama3_8b_2_layers"), "h100-sxm")
    assert chain.meta["layers_found"] == "blocks at model.layers" and len(chain) == 5
    assert chain.meta["dtype"] == "bfloat16" and chain.meta["input_shape"] == "1x2048"
    assert chain.layers[-1].weight_bytes == 128256 * 4096 * 2           # the LM head, untied in Llama-3
