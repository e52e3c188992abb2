"""Rank chains profiled once and cached by content (workbench.parallel.profiles)."""

from __future__ import annotations

import textwrap

import pytest

from workbench.parallel.profiles import RankChains, key_digest

BUILDER = '''
import torch

def build(batch_size=2):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(batch_size, 16)
    return model, x, torch.zeros(batch_size, dtype=torch.long), torch.nn.functional.cross_entropy

def fixed():
    return build(3)
'''


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(BUILDER))
    return path


def test_profiled_once_then_read_back(module, tmp_path):
    cache = tmp_path / "cache"
    files = lambda: sorted(p.name for p in cache.rglob("*.csv"))  # noqa: E731
    rc = RankChains(f"{module}:build", gpu="h100-sxm", cache=cache)
    first = rc(1, 4)
    made = files()
    assert made and first.meta["batch_size"] == "4"
    again = RankChains(f"{module}:build", gpu="h100-sxm", cache=cache)(1, 4)
    assert files() == made                                  # read from the cache: no second profile
    assert [l.saved_bytes for l in again.layers] == [l.saved_bytes for l in first.layers]
    assert rc(1, 2).layers[0].saved_bytes * 2 == pytest.approx(first.layers[0].saved_bytes)   # another size
    assert len(files()) == len(made) + 1
    module.write_text(module.read_text() + "\n# edited\n")   # the module's content is in the key
    RankChains(f"{module}:build", gpu="h100-sxm", cache=cache)(1, 4)
    assert len(files()) == len(made) + 2


def test_micro_batch_sizes_only_for_builders_taking_batch_size(module, tmp_path):
    assert RankChains(f"{module}:build", gpu="h100-sxm", cache=None).micro_batch_sizes() == (1, 2, 4, 8)
    assert RankChains(f"{module}:fixed", gpu="h100-sxm", cache=None).micro_batch_sizes() == (None,)
    assert RankChains(f"{module}:build", gpu=None, cache=None).micro_batch_sizes() == (None,)


def test_tensor_parallel_without_a_gpu_is_refused(module):
    with pytest.raises(ValueError, match="tp=2"):
        RankChains(f"{module}:build", gpu=None, cache=None)(2, None)


def test_key_digest_ignores_order():
    assert key_digest({"a": 1, "b": 2}) == key_digest({"b": 2, "a": 1}) != key_digest({"a": 1, "b": 3})
