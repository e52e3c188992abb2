"""Take a plan to the framework you train with: torchtitan's settings and Megatron-LM's flags (docs/model.md,
"Export to torchtitan and Megatron-LM"; ``python -m workbench export PLAN.json --to torchtitan|megatron``).

:mod:`~workbench.parallel.export.job` reads what a framework needs from a plan (the layout, the stages counted in
decoder blocks, each block's activation policy); :mod:`~workbench.parallel.export.titan` and
:mod:`~workbench.parallel.export.megatron` write it in each framework's terms, with what does not translate
exactly said in notes, and refuse what has no equivalent naming the closest.
"""

from workbench.parallel.export.job import Job, job_from_plan, read_plan
from workbench.parallel.export.megatron import MegatronFlags, megatron_flags
from workbench.parallel.export.titan import TorchtitanSettings, to_toml, torchtitan_settings

__all__ = ["Job", "job_from_plan", "read_plan", "MegatronFlags", "megatron_flags", "TorchtitanSettings",
           "to_toml", "torchtitan_settings"]
