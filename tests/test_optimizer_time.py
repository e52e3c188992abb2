"""The optimizer step's time: the bytes torch's own optimizers move, at the memory bandwidth."""

from __future__ import annotations

import pytest
import torch

from workbench.model.accelerators import accelerator
from workbench.profiles.kernel_time import H100_CALIBRATION, KINDS, memory_fraction
from workbench.profiles.optimizer_time import (
    ACCESSES,
    grad_clip_seconds,
    optimizer_step_seconds,
    step_bytes_per_parameter,
)
from workbench.profiles.roofline import WorkCounter

H100 = accelerator("h100-sxm")
TORCH_OPTIMIZERS = {
    "adamw": lambda p, **kw: torch.optim.AdamW(p, weight_decay=0.1, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, **kw),
    "momentum": lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, **kw),
    "sgd": lambda p, **kw: torch.optim.SGD(p, lr=0.1, **kw),
}


def _moved_by_torch(name: str, **kw) -> float:
    """Bytes per parameter torch's own step moves, counted by the work counter (its second step: the first
    creates the state)."""
    params = [torch.nn.Parameter(torch.zeros(300, 100)) for _ in range(4)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = TORCH_OPTIMIZERS[name](params, **kw)
    opt.step()
    counter = WorkCounter()
    with counter:
        opt.step()
    work = counter.take()
    return float(work.bytes[work.kind != KINDS.index("host")].sum()) / (4 * 300 * 100)


@pytest.mark.parametrize("name", sorted(TORCH_OPTIMIZERS))
def test_the_foreach_counts_are_torchs_own(name):
    """torch's foreach implementation, run: the step counter adds a few bytes per tensor, nothing per element."""
    assert _moved_by_torch(name, foreach=True) == pytest.approx(step_bytes_per_parameter(name, "fp32"), abs=0.01)


def test_fused_adamw_moves_each_tensor_once():
    # the fused kernel's schema marks the gradients as written (for a grad scaler); without one it only reads
    # them: torch's count less the gradient's write is the table's
    assert _moved_by_torch("adamw", fused=True) - 4 == pytest.approx(step_bytes_per_parameter("adamw", "fp32",
                                                                                             "fused"), abs=0.01)


def test_adamw_moves_sixteen_bytes_and_more_per_parameter_and_scales_with_them():
    assert step_bytes_per_parameter("adamw", "fp32") == 80 >= 16
    stream = H100.memory_bandwidth * memory_fraction(H100, H100_CALIBRATION)     # what STREAM measures
    one = optimizer_step_seconds(1e9, "adamw", "fp32", H100)
    four = optimizer_step_seconds(4e9, "adamw", "fp32", H100)
    assert four - one == pytest.approx(3 * 80e9 / stream, rel=1e-9)            # every parameter's 80 bytes
    assert one == pytest.approx(80e9 / stream, rel=0.01)                       # and a few launches
    assert optimizer_step_seconds(1e9, "adamw", "bf16", H100) == pytest.approx(one / 2, rel=0.01)
    assert optimizer_step_seconds(1e9, "adamw", "bf16-mixed", H100) > one          # masters, and the casts
    costs = [optimizer_step_seconds(1e9, o, "fp32", H100) for o in ("none", "sgd", "momentum", "adam", "adamw")]
    assert costs[0] == 0 and all(a < b for a, b in zip(costs, costs[1:]))
    assert optimizer_step_seconds(1e9, "adamw", "fp32", accelerator("h200")) < one   # faster memory


def test_clipping_and_bad_names():
    stream = H100.memory_bandwidth * memory_fraction(H100, H100_CALIBRATION)
    assert grad_clip_seconds(1e9, "fp32", H100) == pytest.approx(12e9 / stream + 2 * H100_CALIBRATION.kernel_floor)
    with pytest.raises(ValueError, match="optimizer 'lion'.*known optimizers"):
        optimizer_step_seconds(1e9, "lion")
    with pytest.raises(ValueError, match="precision 'fp8'"):
        optimizer_step_seconds(1e9, "adamw", "fp8")
    assert set(ACCESSES) >= {(o, i) for o in ("none", "sgd", "momentum", "adam", "adamw")
                             for i in ("foreach", "fused")}
