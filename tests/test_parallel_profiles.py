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


def test_repeat_blocks_makes_the_80_block_chain_of_llama3_70b_from_2_blocks():
    import dataclasses

    from workbench.parallel.profiles import repeat_blocks
    from workbench.profiles import load_profile

    short = load_profile("layouts/llama3-70b-2-blocks-h100-sxm-tp1-mbs1")     # scripts/make_layout_profiles.py
    whole = load_profile("fake/llama3-70b-h100-sxm")                          # the 80-block model, profiled whole
    long = repeat_blocks(short, 80)
    assert [l.name for l in long.layers] == [l.name for l in whole.layers]
    for a, b in zip(long.layers, whole.layers):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name in ("forward", "backward"):
                assert x == pytest.approx(y, rel=0.03), (a.name, f.name)   # the embedding's mask: 2.4 % apart
            else:
                assert x == y, (a.name, f.name)
    odd = short.layers[1]
    bad = type(short)((short.layers[0], dataclasses.replace(odd, forward=odd.forward * 2)) + short.layers[2:])
    with pytest.raises(ValueError, match="differs"):
        repeat_blocks(bad, 80)


TINY = '''
from workbench.parallel.tensor.tiny import tiny_llama


def build(batch_size=2):
    return tiny_llama(batch_size)
'''


def test_sequence_parallel_and_the_split_loss_are_profiles_of_their_own(tmp_path):
    from workbench.parallel.tensor.profile import tensor_parallel_profile

    module = tmp_path / "tiny.py"
    module.write_text(textwrap.dedent(TINY))
    cache = tmp_path / "cache"
    files = lambda: len(list(cache.rglob("*.csv")))  # noqa: E731
    rc = RankChains(f"{module}:build", gpu="h100-sxm", cache=cache)
    plain = rc(2, 2)
    made = files()
    sp = rc(2, 2, sequence_parallel=True)
    assert files() == made + 1                                       # cached apart from sp=0
    assert RankChains(f"{module}:build", gpu="h100-sxm", cache=cache)(2, 2, sequence_parallel=True) == sp
    assert files() == made + 1                                       # and read back
    direct = tensor_parallel_profile(f"{module}:build", "h100-sxm", 2, sequence_parallel=True, micro_batch_size=2,
                                     cache=False)
    assert [l.saved_bytes for l in sp.layers] == [l.saved_bytes for l in direct.layers]
    assert sp.meta["sequence_parallel"] == "true" and "reduce_scatter" in sp.meta["tp_collectives"]
    blocks = [i for i, l in enumerate(plain.layers) if ".layers." in l.name]
    assert blocks and all(sp.layers[i].saved_bytes < plain.layers[i].saved_bytes for i in blocks)
    lp = rc(2, 2, loss_parallel=True)
    assert files() == made + 2 and lp.meta["loss_parallel"] == "true"
    assert lp.layers[-1].activation_bytes * 2 == pytest.approx(plain.layers[-1].activation_bytes)   # logits split
    with pytest.raises(ValueError, match="tp=1: sequence parallelism"):
        rc(1, 2, sequence_parallel=True)
    # a rank's chain checked against a layout: the split loss must be the layout's too (run's --profile)
    from workbench.model.layout import Layout
    from workbench.parallel.profiles import check_rank_chain

    check_rank_chain(lp, Layout(tp=2, micro_batch_size=2, loss_parallel=True), "--profile lp.csv")
    with pytest.raises(ValueError, match="--profile plain.csv has loss_parallel false, the plan's layout true"):
        check_rank_chain(plain, Layout(tp=2, micro_batch_size=2, loss_parallel=True), "--profile plain.csv")
    with pytest.raises(ValueError, match="has sequence_parallel true, the plan's layout false"):
        check_rank_chain(sp, Layout(tp=2, micro_batch_size=2), "--profile sp.csv")


def test_fused_kernels_are_a_profile_of_their_own_and_need_a_gpu(module, tmp_path):
    cache = tmp_path / "cache"
    eager = RankChains(f"{module}:build", gpu="h100-sxm", cache=cache)
    fused = RankChains(f"{module}:build", gpu="h100-sxm", cache=cache, kernels="fused")
    assert "kernels" not in eager.key(1, 2) and fused.key(1, 2)["kernels"] == "fused"
    assert fused(1, 2).meta["kernels"] == "fused" and "kernels" not in eager(1, 2).meta
    assert len(list(cache.rglob("*.csv"))) == 2
    with pytest.raises(ValueError, match="fake tensors"):
        RankChains(f"{module}:build", gpu=None, cache=None, kernels="fused")(1, None)


