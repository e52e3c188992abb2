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


@pytest.fixture(autouse=True, scope="session")
def _order_cache(tmp_path_factory):
    """torch's orders kept on disk (workbench.schedules.order_cache) go to a folder of this session, not the
    user's cache."""
    from workbench.schedules.order_cache import ENV

    was = os.environ.get(ENV)
    os.environ[ENV] = str(tmp_path_factory.mktemp("order-cache"))
    yield
    if was is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = was
