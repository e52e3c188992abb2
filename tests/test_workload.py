"""What a run trains (workbench.profiles.workload): a module's mini-batches in tensors of their own."""

from __future__ import annotations

import torch

from workbench.profiles.workload import Workload


def batch_dict():
    """A ``--module`` builder whose inputs are a dict of tensors (as Hugging Face models take them)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 2))
    return model, {"x": torch.randn(4, 8), "mask": torch.ones(4, 8)}, torch.zeros(4, dtype=torch.long), \
        lambda out, y: torch.nn.functional.cross_entropy(out, y)


def test_every_mini_batch_of_a_module_is_a_tensor_of_its_own():
    """A data loader hands out every mini-batch in tensors of its own; a rank holding k mini-batches in flight
    holds k inputs (docs/model.md, "Memory"): the module's example batch is copied, not shared."""
    wl = Workload.module(f"{__file__}:batch_dict")
    (x0, y0), (x1, y1) = wl.batch(0), wl.batch(1)
    for a, b in ((x0["x"], x1["x"]), (x0["mask"], x1["mask"]), (y0, y1)):
        assert torch.equal(a, b)                                       # the same values ...
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()   # ... in storages of their own
