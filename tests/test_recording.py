"""The profiler's recording switch (workbench/profiles/recording.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.profiles.recording import dispatch_modes, is_suspended, suspended


def test_suspension_nests_and_ends_even_on_an_error():
    assert not is_suspended()
    with suspended():
        with suspended():
            assert is_suspended()
        assert is_suspended()
    assert not is_suspended()
    with pytest.raises(RuntimeError):
        with suspended():
            raise RuntimeError("inside")
    assert not is_suspended()


def test_a_counter_that_honours_the_switch_sees_only_what_runs_outside_it():
    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if not is_suspended():
                self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.ones(3)
    with Counter() as counter:
        assert counter in dispatch_modes()
        x + 1
        with suspended():
            x * 2
    assert counter.seen == ["add"] and dispatch_modes() == []
