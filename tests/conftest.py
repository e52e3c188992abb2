"""Fixtures shared by the tests."""

from __future__ import annotations

import errno
import os

import pytest


@pytest.fixture
def disk_full_at(monkeypatch):
    """``disk_full_at(n)``: from now on, the n-th ``os.fsync`` fails as on a full disk (ENOSPC)."""
    def arm(n: int) -> None:
        real, seen = os.fsync, []

        def fsync(fd):
            seen.append(fd)
            if len(seen) == n:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    return arm
