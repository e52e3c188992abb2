"""A plan's times are the named GPU's: a fake profile is re-estimated from its stored operations, a profile
measured elsewhere is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.front.cli import main
from workbench.model.accelerators import accelerator
from workbench.profiles import read_profile, write_profile
from workbench.profiles.fake import fake_profile, fake_zoo
from workbench.profiles.kernel_time import published
from workbench.profiles.retime import chain_for_gpu, decode_works, measured_gpu, retimed


def _plan_period(tmp_path, profile, *extra) -> float:
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile), "--devices", "2", "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())["period"]


def test_a_fake_profile_planned_for_another_gpu_takes_that_gpus_times(tmp_path, capsys):
    h100, a100 = tmp_path / "h100.csv", tmp_path / "a100.csv"
    write_profile(fake_zoo("gpt", 8, "h100-sxm", dtype="bfloat16"), h100)
    write_profile(fake_zoo("gpt", 8, "a100-40gb", dtype="bfloat16"), a100)
    on_h100 = _plan_period(tmp_path, h100, "--gpu", "h100-sxm")
    on_a100 = _plan_period(tmp_path, a100, "--gpu", "a100-40gb")
    capsys.readouterr()
    retimed_period = _plan_period(tmp_path, h100, "--gpu", "a100-40gb")
    assert "times re-estimated for a100-40gb" in capsys.readouterr().out
    assert retimed_period == pytest.approx(on_a100, rel=1e-9) and on_a100 > 1.2 * on_h100


def test_a_cpu_timed_or_unstored_profile_is_refused_for_a_gpu(tmp_path, capsys):
    cpu = tmp_path / "cpu.csv"
    from workbench.profiles.profiler import profile_zoo

    write_profile(profile_zoo("tiny-gpt", 2, repeats=1, warmup=0), cpu)
    assert main(["plan", "--profile", str(cpu), "--devices", "2", "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --gpu h100-sxm: the profile's times were measured on cpu")
    assert len(err.strip().splitlines()) == 1
    old = tmp_path / "old.csv"
    chain = fake_zoo("tiny-gpt", 2, "h100-sxm")
    write_profile(chain.__class__(chain.layers, input_bytes=chain.input_bytes,
                                  meta={k: v for k, v in chain.meta.items() if k != "work"}), old)
    assert main(["plan", "--profile", str(old), "--devices", "2", "--gpu", "a100-40gb"]) == 2
    err = capsys.readouterr().err
    assert "estimates for h100-sxm and it stores no operations" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--profile", str(old), "--devices", "2", "--gpu", "h100-sxm"]) == 0   # its own GPU


def test_retimed_equals_a_profile_made_for_that_gpu():
    made_h100, made_h200 = fake_zoo("tiny-resnet", 4, "h100-sxm"), fake_zoo("tiny-resnet", 4, "h200")
    again = retimed(made_h100, "h200")
    assert [l.forward for l in again.layers] == pytest.approx([l.forward for l in made_h200.layers], rel=1e-12)
    assert [l.backward for l in again.layers] == pytest.approx([l.backward for l in made_h200.layers], rel=1e-12)
    assert again.meta["gpu"] == "h200" and again.meta["device"] == made_h200.meta["device"]
    assert [l.saved_bytes for l in again.layers] == [l.saved_bytes for l in made_h100.layers]
    assert len(decode_works(made_h100.meta["work"])) == len(made_h100.layers)


def test_a_compute_bound_layer_scales_with_the_gpus_matmul_throughput():
    def build():
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = torch.nn.Sequential(torch.nn.Linear(16384, 16384, bias=False))
        finally:
            torch.set_default_dtype(torch.float32)
        return (model, torch.zeros(16384, 16384, dtype=torch.bfloat16), torch.zeros(16384, 16384,
                                                                                      dtype=torch.bfloat16),
                torch.nn.functional.mse_loss)

    chain = fake_profile(build, "h100-sxm")
    other, _ = chain_for_gpu(chain, "a100-40gb")
    rate = {g: accelerator(g).peak("bfloat16") * published(accelerator(g)).matmul for g in ("h100-sxm", "a100-40gb")}
    layer, slow = chain.layers[0], other.layers[0]
    assert slow.forward / layer.forward == pytest.approx(rate["h100-sxm"] / rate["a100-40gb"], rel=0.03)


def test_which_gpu_a_measured_profile_names():
    assert measured_gpu("cuda (NVIDIA H100 80GB HBM3)") == "h100-sxm"
    assert measured_gpu("cuda (NVIDIA H100 PCIe)") == "h100-pcie"
    assert measured_gpu("cuda (NVIDIA A100-SXM4-80GB)") == "a100-80gb"
    assert measured_gpu("cuda (NVIDIA GeForce RTX 4090)") is None and measured_gpu("cpu (x86_64)") is None
    measured = read_profile(__import__("workbench.paths", fromlist=["PROFILES_DIR"]).PROFILES_DIR / "h100" /
                            "gpt-small.csv")
    assert chain_for_gpu(measured, "h100-sxm") == (measured, None)
    with pytest.raises(ValueError, match="measured on cuda \\(NVIDIA H100 80GB HBM3\\), not on a100-40gb"):
        chain_for_gpu(measured, "a100-40gb")
