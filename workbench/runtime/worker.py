"""A rank's process: join the process group, run its share on the plan's engine, save the result.

:func:`spawn_entry` is the target :func:`~workbench.runtime.engine.run_plan`
starts once per device with ``torch.multiprocessing``; :func:`isolated_entry`
the one :func:`~workbench.runtime.replay.replay_devices` starts for a device
alone (no process group). Both run :func:`run_rank`'s steps: threads and GPU
(:func:`_setup`), the engine (:func:`_execute`: torch's pipeline engine,
:mod:`~workbench.runtime.torch_engine`, or the PipeDream fallback,
:mod:`~workbench.runtime.pipedream`), and an atomic ``rank{r}.pt`` (:func:`_save`)
that the parent merges.

>>> import tempfile, os
>>> with tempfile.TemporaryDirectory() as d:
...     _save({"rank": 3}, 3, d)
...     sorted(os.listdir(d)), torch.load(os.path.join(d, "rank3.pt"))["rank"]
(['rank3.pt'], 3)
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workbench.runtime.config import RunConfig
from workbench.runtime.pipedream import PipeDreamRank


def free_port() -> int:
    """A TCP port free on this machine now, for the process group's rendezvous (``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

__all__ = ["run_rank", "spawn_entry", "isolated_entry"]


def _save(res: dict[str, Any], rank: int, outdir: str) -> None:
    tmp = os.path.join(outdir, f".rank{rank}.pt.tmp")
    torch.save(res, tmp)
    os.replace(tmp, os.path.join(outdir, f"rank{rank}.pt"))


def _setup(rank: int, cfg: RunConfig) -> None:
    torch.set_num_threads(max(1, cfg.threads))
    if cfg.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count())
        torch.cuda.set_device(local)


def _execute(rank: int, world: int, cfg: RunConfig) -> dict[str, Any]:
    if cfg.engine == "torch" and not cfg.isolated:
        from workbench.runtime.torch_engine import run_torch_rank

        return run_torch_rank(rank, world, cfg)
    return PipeDreamRank(rank, cfg).execute()


def spawn_entry(rank: int, world: int, cfg: RunConfig, outdir: str, addr: str, port: int) -> None:
    """Target of ``torch.multiprocessing.start_processes``: init, execute, save ``rank{r}.pt``."""
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    run_rank(rank, world, cfg, outdir, init_method=f"tcp://{addr}:{port}")


def isolated_entry(_index: int, rank: int, cfg: RunConfig, outdir: str) -> None:
    """Target of ``start_processes`` for an isolated replay: device ``rank`` alone, no process group."""
    _setup(rank, cfg)
    _save(PipeDreamRank(rank, cfg).execute(), rank, outdir)


def run_rank(rank: int, world: int, cfg: RunConfig, outdir: str, init_method: str = "env://") -> None:
    """Join the process group, run this rank's share with the plan's engine, save ``rank{r}.pt``."""
    _setup(rank, cfg)
    dist.init_process_group(cfg.backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout))
    try:
        _save(_execute(rank, world, cfg), rank, outdir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
