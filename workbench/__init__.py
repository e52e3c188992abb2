"""The workbench: pipelined model parallelism, planned under memory limits.

profile -> chain -> planner -> plan -> simulation -> trace -> figures.

The names below are imported on first use (PEP 562), so that ``python -m workbench`` can answer a memory cap
that refuses numpy's import with one ``error: out of memory`` line (exit 3) instead of a traceback.

>>> from workbench import Chain, Layer, Platform, Target, TrainingSetup
>>> Target(Platform(2, memory="8GiB"), TrainingSetup(memory_model="paper")).devices
2
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: each public name and the module that defines it
_HOMES = {
    "Chain": "workbench.model.chain", "Layer": "workbench.model.chain", "Platform": "workbench.model.chain",
    "StageCosts": "workbench.model.chain", "Target": "workbench.model.target",
    "TrainingSetup": "workbench.model.training_setup", "Plan": "workbench.model.plan", "Stage": "workbench.model.plan",
    "lower_bound": "workbench.model.plan", "make_plan": "workbench.model.plan", "Trace": "workbench.model.trace",
    "format_bytes": "workbench.model.units", "format_seconds": "workbench.model.units",
    "parse_bandwidth": "workbench.model.units", "parse_size": "workbench.model.units",
    "load_profile": "workbench.profiles", "read_profile": "workbench.profiles", "write_profile": "workbench.profiles",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
