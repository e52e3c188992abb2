"""The accelerator table: complete, consistent, every entry with its public source, names refused clearly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.model.accelerators import ACCELERATORS, DEFAULT_NODE_BANDWIDTH, accelerator

REQUIRED = ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "mi300x")


def test_the_table_holds_the_gpus_people_rent():
    assert set(REQUIRED) <= set(ACCELERATORS)


@pytest.mark.parametrize("name", sorted(ACCELERATORS))
def test_every_entry_is_complete_and_consistent(name):
    a = ACCELERATORS[name]
    for p in ("float32", "tf32", "bfloat16", "float16"):
        assert a.flops[p] > 1e12, p
    # tensor cores beat the vector units; bf16 runs at twice TF32 on every one of these
    assert a.flops["float32"] < a.flops["tf32"] < a.flops["bfloat16"] == a.flops["float16"]
    assert a.flops["bfloat16"] == pytest.approx(2 * a.flops["tf32"], rel=0.02)
    assert 10e9 < a.memory <= 200e9 and 500e9 < a.memory_bandwidth < 10e12
    assert a.link_bandwidth < a.memory_bandwidth and a.link_bandwidth >= DEFAULT_NODE_BANDWIDTH * 0.6


def test_every_gpu_cites_a_public_source():
    """A comment naming each GPU family gives an http(s) source (a vendor's datasheet or product page)."""
    text = Path(__file__).resolve().parents[1].joinpath("workbench/model/accelerators.py").read_text()
    comments = [line for line in text.splitlines() if line.strip().startswith("#")]
    for family in ("A100", "H100", "H200", "B200", "L40S", "MI300X"):
        assert any(family in c and re.search(r"https?://", c) for c in comments), family
    assert len(set(re.findall(r"https?://[^\s,]+", text))) >= 7


def test_names_are_case_insensitive_and_unknown_ones_list_the_known():
    assert accelerator(" H100-SXM ") is ACCELERATORS["h100-sxm"]
    with pytest.raises(ValueError, match=r"unknown GPU 'v100'; known: a100-40gb, .*mi300x"):
        accelerator("v100")


def test_peak_falls_back_where_a_precision_is_missing():
    a100 = accelerator("a100-80gb")
    assert "float8" not in a100.flops and a100.peak("float8") == a100.flops["bfloat16"]
    with pytest.raises(ValueError, match="no peak"):
        a100.peak("int4")
