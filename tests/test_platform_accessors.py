"""A device's memory limit and a link are read through Platform's accessors (docs/model.md, "Instance"):
``memory_of(d)`` (or ``memory_limit``, the one limit all devices share), ``comm_time(bytes, p, q)`` and
``host_time(bytes)``. The package is scanned, as tests/test_methods.py scans it for method tables, so that a
direct read of ``platform.memory`` (or of a link's field) outside workbench/model/chain.py fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from workbench.model.chain import Chain, Layer, Platform
from workbench.model.target import Target
from workbench.planners import plan

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
#: the fields behind the accessors: the memory limit, and the links (between devices, and to the host)
FIELDS = {"memory", "bandwidth", "node_bandwidth", "latency", "host_bandwidth"}
#: the names a Platform goes by in the package (``platform``, ``plat``, ``job.platform``, ``self.platform``)
NAMES = {"platform", "plat"}
#: (file, field): why that file reads the field itself
ALLOWED = {
    # the plan records the links it was made for in its memory_setup (the JSON), so that check and simulate
    # default to them: a copy of the field's value, not a price
    ("workbench/planners/__init__.py", "bandwidth"): "platform_links: the plan's record of its links",
    ("workbench/planners/__init__.py", "node_bandwidth"): "platform_links: the plan's record of its links",
    ("workbench/planners/__init__.py", "host_bandwidth"): "the plan's record of its host link",
    ("workbench/planners/fixed_policies.py", "host_bandwidth"): "the plan's record of its host link",
    # a ring collective over a data-parallel group (its slowest link decides the ring's bandwidth): not the
    # link of a pair, which is all comm_time prices
    ("workbench/parallel/evaluate.py", "bandwidth"): "data_parallel_ring: a group's ring, not a pair's link",
    ("workbench/parallel/evaluate.py", "node_bandwidth"): "data_parallel_ring: a group's ring, not a pair's link",
    ("workbench/parallel/evaluate.py", "latency"): "data_parallel_ring: a group's ring, not a pair's link",
}


def _is_platform(node: ast.AST) -> bool:
    """``platform``, ``plat``, ``x.platform``, ``Platform(...)``, ``Platform.on(...)``, ``Target(...)``,
    ``Target.of(...)``, ``Target.on(...)``, ``platform.with_(...)``."""
    if isinstance(node, ast.Name):
        return node.id in NAMES
    if isinstance(node, ast.Attribute):
        return node.attr == "platform"
    if isinstance(node, ast.Call):
        f = node.func
        return ((isinstance(f, ast.Name) and f.id in ("Platform", "Target"))
                or (isinstance(f, ast.Attribute) and f.attr in ("on", "of") and isinstance(f.value, ast.Name)
                    and f.value.id in ("Platform", "Target"))
                or (isinstance(f, ast.Attribute) and f.attr == "with_" and _is_platform(f.value)))
    return False


def direct_reads(source: str) -> list[tuple[int, str]]:
    """(line, field) of every read of a Platform's memory or link field in ``source``."""
    return sorted((n.lineno, n.attr) for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Attribute) and n.attr in FIELDS and isinstance(n.ctx, ast.Load)
                  and _is_platform(n.value))


def _package_reads() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("workbench/model/chain.py", "workbench/model/target.py"):  # the accessors' own modules
            continue
        for line, field in direct_reads(path.read_text(encoding="utf-8")):
            found.setdefault((rel, field), []).append(line)
    return found


def test_the_scan_finds_direct_reads():
    src = ("def f(platform, job, plat):\n"
           "    a = platform.memory + job.platform.latency + plat.bandwidth\n"
           "    b = Target.of(1, memory=m).memory + platform.with_(memory=2).host_bandwidth + Platform(1).latency\n"
           "    c = plan.memory, trace.memory, platform.memory_of(0), platform.memory_limit, platform.setup.weights\n"
           "    platform.comm_time(1.0, 0, 1)\n")
    assert direct_reads(src) == [(2, "bandwidth"), (2, "latency"), (2, "memory"), (3, "host_bandwidth"),
                                 (3, "latency"), (3, "memory")]


def test_no_module_reads_the_platforms_memory_or_links_directly():
    found = _package_reads()
    unexplained = [f"{rel}:{lines}: platform.{field}" for (rel, field), lines in found.items()
                   if (rel, field) not in ALLOWED]
    assert not unexplained, ("read memory_of(d) / memory_limit, comm_time or host_time instead:\n"
                             + "\n".join(unexplained))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed reads that are gone (drop them from ALLOWED): {stale}"


class Uneven(Platform):
    """Devices whose limits differ: what the accessors leave room for."""

    def memory_of(self, device: int) -> float:
        return self.memory * (1 + device)


def test_memory_limit_is_every_devices_limit_or_a_clear_error():
    p = Target.of(4, memory="16GiB")
    assert p.memory_limit == p.memory_of(0) == p.memory_of(3) == 16 * 2**30
    assert Target.of(3).memory_limit == float("inf")
    with pytest.raises(ValueError, match="memory limits differ"):
        Uneven(2, memory="1GiB").memory_limit


def test_the_planners_ask_the_accessor():
    """A planner that takes one limit asks ``memory_limit``, so devices of different limits reach it as an error,
    not as device 0's limit."""
    chain = Chain.from_layers([Layer(f"l{i}", forward=1.0, backward=2.0, weight_bytes=10, activation_bytes=5)
                               for i in range(4)])
    assert plan(chain, Target.of(2, memory=1e6), "dp").feasible
    with pytest.raises(ValueError, match="memory limits differ"):
        plan(chain, Target(Uneven(2, memory=1e6)), "dp")


def test_host_time_is_elementwise():
    slow, free = Target.of(1, host_bandwidth="4B/s"), Target.of(1, host_bandwidth=float("inf"))
    assert slow.host_time(np.array([8.0, 2.0])).tolist() == [2.0, 0.5] and slow.host_time(8.0) == 2.0
    assert free.host_time(np.array([8.0, 2.0])).tolist() == [0.0, 0.0] and free.host_time(8.0) == 0.0
