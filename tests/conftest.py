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


@pytest.fixture
def gloo_ranks(tmp_path):
    """``gloo_ranks(target, *args)``: ``target(rank, init, folder, *args)`` in 2 forked processes that meet at a
    file rendezvous in ``tmp_path`` (``folder``, where they write what they found); fails unless both exit 0."""
    import multiprocessing

    def run(target, *args, ranks: int = 2) -> None:
        ctx = multiprocessing.get_context("fork")
        init = f"file://{tmp_path / 'rendezvous'}"
        procs = [ctx.Process(target=target, args=(r, init, str(tmp_path), *args)) for r in range(ranks)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * ranks

    return run
