"""The workbench: pipelined model parallelism, planned under memory limits.

profile -> chain -> planner -> plan -> simulation -> trace -> figures.

>>> from workbench import Chain, Layer, Platform
>>> Platform(2, memory="8GiB", memory_model="paper").devices
2
"""

from workbench.model.chain import Chain, Layer, Platform, StageCosts
from workbench.model.plan import Plan, Stage, lower_bound, make_plan
from workbench.model.trace import Trace
from workbench.model.units import format_bytes, format_seconds, parse_bandwidth, parse_size
from workbench.profiles import load_profile, read_profile, write_profile

__version__ = "0.1.0"
__all__ = [
    "Chain", "Layer", "Platform", "StageCosts", "Plan", "Stage", "lower_bound", "make_plan",
    "load_profile", "read_profile", "write_profile", "Trace", "format_bytes", "format_seconds",
    "parse_bandwidth", "parse_size",
]
