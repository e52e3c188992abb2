"""Where the units of ``reproduce`` run: in this process, in local worker processes, or on Dask.

An :class:`Executor` computes units and hands each one's CSV text back as it finishes
(:func:`run_units`); the caller stores it (:func:`~workbench.experiments.cache.store_unit`:
atomic writes, under the one folder lock ``reproduce`` holds). So the cache, the lock, the
atomic writes, the progress bar and resuming are the same whichever executor runs the units,
and the workers need no access to the results folder.

* ``serial`` (the default): one unit after the other, here;
* ``processes``: ``jobs`` local worker processes (``$WORKBENCH_JOBS``);
* ``dask``: each unit a task on Dask's distributed scheduler: a local cluster of ``workers``
  processes (one thread each), or the existing cluster at ``scheduler`` (``tcp://HOST:8786``).
  Every worker needs the same workbench (``pip install -e .`` of the same commit, with its
  ``data/profiles``): a worker whose model code differs from the client's
  (:func:`~workbench.experiments.provenance.code_version`) refuses the unit, and a sweep refuses a
  profile whose digest differs from the unit's key, so no result is stored under another key.

>>> Executor().describe(), Executor("dask", workers=4).describe()
('serial', 'dask (a local cluster of 4 workers)')
>>> list(run_units([], Executor()))
[]
>>> makespan([5, 4, 3, 3, 3], 2)      # longest first onto the least loaded worker
10.0
"""

from __future__ import annotations

import heapq
import os
import platform
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from workbench.experiments.provenance import code_version
from workbench.experiments.sweeps import compute_unit
from workbench.experiments.units import Unit

__all__ = ["EXECUTORS", "Executor", "Finished", "unit_csv", "finish_unit", "run_units", "makespan",
           "check_scheduler"]

EXECUTORS = ("serial", "processes", "dask")


@dataclass(frozen=True)
class Executor:
    """How to run the units: ``kind`` one of :data:`EXECUTORS`; ``workers`` processes (``processes``, a local
    Dask cluster); ``scheduler`` the address of a running Dask scheduler (``dask`` only, instead of workers)."""

    kind: str = "serial"
    workers: int | None = None
    scheduler: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"--executor {self.kind!r}: choose one of {', '.join(EXECUTORS)}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers {self.workers}: give at least 1")
        if self.workers is not None and self.kind == "serial":
            raise ValueError("--workers needs --executor dask (or processes)")
        if self.scheduler is not None and self.kind != "dask":
            raise ValueError("--scheduler needs --executor dask")
        if self.scheduler is not None and self.workers is not None:
            raise ValueError("--workers starts a local cluster, --scheduler joins one: give one of them")

    def describe(self) -> str:
        if self.kind == "dask":
            return (f"dask (the scheduler at {self.scheduler})" if self.scheduler else
                    f"dask (a local cluster of {self.local_workers()} workers)")
        return f"{self.local_workers()} local processes" if self.kind == "processes" else "serial"

    def local_workers(self) -> int:
        """Worker processes of a local pool or cluster (default: the cores, at most 4)."""
        return self.workers or min(4, os.cpu_count() or 1)


def unit_csv(unit: Unit) -> str:
    """Compute ``unit`` (on whichever worker runs it): its frame as CSV text.

    Refuses (ValueError) a unit keyed by other model code than this process runs.
    """
    wanted = unit.settings.get("code_version")
    if wanted is not None and wanted != code_version():
        raise ValueError(f"{unit.name}: the worker on {platform.node()} runs model code {code_version()}, the unit's "
                         f"key says {wanted}; install the same workbench on every worker")
    return compute_unit(unit).to_csv(index=False)


@dataclass(frozen=True)
class Finished:
    """A computed unit as a worker hands it back: its CSV text, the seconds it took there and the host."""

    unit: Unit
    text: str
    seconds: float
    host: str


def finish_unit(unit: Unit) -> Finished:
    """:func:`unit_csv`, timed, on the worker that runs it."""
    t0 = time.perf_counter()
    text = unit_csv(unit)
    return Finished(unit, text, time.perf_counter() - t0, platform.node())


def run_units(units: Sequence[Unit], executor: Executor) -> Iterator[Finished]:
    """Each unit computed, in the order they finish. A unit that fails stops the run (its error is raised
    here); the units handed back before it are the caller's to keep."""
    if not units:
        return
    if executor.kind == "serial" or (executor.kind == "processes" and executor.local_workers() == 1):
        for u in units:
            yield finish_unit(u)
    elif executor.kind == "processes":
        yield from _on_processes(units, executor.local_workers())
    else:
        yield from _on_dask(units, executor)


def _on_processes(units: Sequence[Unit], workers: int) -> Iterator[Finished]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(finish_unit, u) for u in units]
        try:
            for f in as_completed(futures):
                yield f.result()
        finally:
            for f in futures:
                f.cancel()


def _on_dask(units: Sequence[Unit], executor: Executor) -> Iterator[Finished]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ValueError("--executor dask needs dask and distributed: pip install -e .[dask] "
                         "(make setup installs them)") from None
    import contextlib

    with contextlib.ExitStack() as stack:
        if executor.scheduler:
            check_scheduler(executor.scheduler)
            try:
                client = stack.enter_context(Client(executor.scheduler, timeout="30s"))
            except (OSError, TimeoutError, TypeError, ValueError, MemoryError) as e:
                raise ValueError(f"--scheduler {executor.scheduler}: cannot reach it ({type(e).__name__}: "
                                 f"{e})") from None
        else:
            cluster = stack.enter_context(LocalCluster(n_workers=executor.local_workers(), threads_per_worker=1,
                                                       processes=True, dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        # one task per unit, keyed by its name and this run (a shared scheduler never hands back another run's)
        import uuid

        run = uuid.uuid4().hex[:8]
        futures = [client.submit(finish_unit, u, key=f"workbench-{run}-{u.name}") for u in units]
        try:
            for f in as_completed(futures):
                yield f.result()
        finally:
            client.cancel(futures)


#: seconds to connect to a scheduler, and for it to say who it is
CONNECT_SECONDS = 10.0
#: a Dask scheduler's first message (its handshake) is at most this many bytes
HANDSHAKE_BYTES = 1 << 20


def check_scheduler(address: str, seconds: float | None = None) -> None:
    """Refuse, in one ``ValueError``, a ``--scheduler`` address Dask's client cannot use: a transport it has no
    working connector for (``ucx://`` without UCX), nothing listening, a server that accepts and says nothing
    (Dask's client would wait for ever), or one that answers but not with a Dask handshake (Dask's client would
    read its first bytes as a message length and run out of memory). A Dask scheduler speaks first on a
    connection: a message of frames whose total length comes first (8 bytes), then their count."""
    import socket
    import struct

    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    def refuse(why: str) -> ValueError:
        return ValueError(f"--scheduler {address}: {why}")

    seconds = CONNECT_SECONDS if seconds is None else seconds
    try:
        scheme, loc = parse_address(address)
        get_backend(scheme).get_connector()
    except (ValueError, TypeError, ImportError) as e:
        raise refuse(f"Dask cannot connect with this transport here ({type(e).__name__}: {e}); a scheduler "
                     f"started with dask scheduler listens on tcp://HOST:8786") from None
    if scheme not in ("tcp", "tls"):
        return
    try:
        host, port = parse_host_port(loc)
        with socket.create_connection((host, port), timeout=seconds) as sock:
            if scheme == "tls":
                return
            head = _read(sock, 8)
            total = struct.unpack("<Q", head)[0]
            body = _read(sock, min(total, 16)) if 16 <= total <= HANDSHAKE_BYTES else b""
    except socket.timeout:
        raise refuse(f"nothing answered within {seconds:g} s (it accepts connections but says nothing: not a "
                     "Dask scheduler, or one that hangs)") from None
    except (OSError, ValueError, struct.error) as e:
        raise refuse(f"cannot reach it ({e})") from None
    frames = struct.unpack("<Q", body[:8])[0] if len(body) >= 8 else 0
    if not (len(body) >= 8 and 1 <= frames <= 64 and 8 * (frames + 1) <= total):
        raise refuse(f"something answers there, but not as a Dask scheduler (its first bytes: {head!r})")


def _read(sock, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock`` (a ``ValueError`` if it closes first)."""
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ValueError("the connection closed before it said anything")
        out += got
    return out


def makespan(seconds: Iterable[float], workers: int) -> float:
    """How long ``workers`` machines take for units of these ``seconds``: the longest first, each onto the
    worker that is free first (within 4/3 of the best order; never below the longest unit or the total
    over ``workers``)."""
    free = [0.0] * max(1, int(workers))
    for s in sorted((float(x) for x in seconds), reverse=True):
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)
