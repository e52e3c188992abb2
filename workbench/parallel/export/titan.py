"""A plan as torchtitan's settings: the TOML file torchtitan 0.2's ``JobConfig`` reads, and the command-line
overrides of torchtitan 0.3 (docs/model.md, "Export to torchtitan and Megatron-LM").

torchtitan 0.2.x reads ``--job.config_file FILE.toml`` (``torchtitan/config/job_config.py``: sections
``[parallelism]``, ``[training]``, ``[activation_checkpoint]``); torchtitan 0.3 replaced the TOML files by Python
config functions (``--module llama3 --config llama3_70b``) that take the same ``parallelism`` and ``training`` keys
as ``--section.key value`` overrides, and selects activation checkpointing with a sub-command
(``activation-checkpoint:full``). Both are written: the TOML, with the 0.3 command line in a comment.

>>> from workbench.parallel.export.job import Job
>>> from workbench.model.layout import Layout
>>> names = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(4)), "model.norm", "lm_head"]
>>> job = Job(Layout(tp=2, pp=2, dp=2, zero=3, micro_batch_size=1, micro_batches=4, schedule="1f1b"),
...           seq_len=4096, stages=(names[:3], names[3:]))
>>> s = torchtitan_settings(job)
>>> s.sections["parallelism"]["data_parallel_shard_degree"], s.sections["parallelism"]["module_fqns_per_model_part"]
(2, [['tok_embeddings', 'layers.0', 'layers.1'], ['layers.2', 'layers.3', 'norm', 'output']])
>>> s.sections["training"]
{'local_batch_size': 4, 'global_batch_size': 8, 'seq_len': 4096}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.methods import METHODS
from workbench.parallel.export.job import Job

__all__ = ["TorchtitanSettings", "torchtitan_settings", "SCHEDULES", "to_toml", "default_split"]

#: the workbench's flushed methods -> the names torch's ``get_schedule_class`` (torchtitan's
#: ``parallelism.pipeline_parallel_schedule``) maps to the same classes
SCHEDULES = {m.name: m.torchtitan_name for m in METHODS if m.torchtitan_name}
#: ZeRO level -> torchtitan's ``fsdp_reshard_after_forward`` over a ``data_parallel_shard_degree`` of dp
#: (FSDP2's ``reshard_after_forward``: never = parameters gathered from forward to backward, ZeRO-2's memory)
_RESHARD = {1: "never", 2: "never", 3: "always"}
_PRECISION = {"bf16-mixed": {"dtype": "float32", "mixed_precision_param": "bfloat16"},
              "fp32": {"dtype": "float32", "mixed_precision_param": "float32"},
              "bf16": {"dtype": "bfloat16"}}


@dataclass(frozen=True)
class TorchtitanSettings:
    """``sections``: the TOML of torchtitan 0.2 (section -> key -> value); ``overrides``: torchtitan 0.3's
    command-line arguments; ``notes``: what does not translate exactly, one sentence each."""

    sections: dict[str, dict[str, Any]]
    overrides: list[str]
    notes: list[str] = field(default_factory=list)


def torchtitan_settings(job: Job) -> TorchtitanSettings:
    """torchtitan's settings for ``job`` (refused with a ``ValueError`` where torchtitan has no equivalent)."""
    lay, notes = job.layout, []
    par: dict[str, Any] = {"data_parallel_replicate_degree": lay.dp if lay.zero == 0 else 1,
                           "data_parallel_shard_degree": 1 if lay.zero == 0 else lay.dp}
    if lay.zero and lay.dp > 1:
        par["fsdp_reshard_after_forward"] = _RESHARD[lay.zero]
    par |= {"tensor_parallel_degree": lay.tp, "enable_async_tensor_parallel": lay.tp_overlap,
            "disable_loss_parallel": not lay.loss_parallel,
            "pipeline_parallel_degree": lay.pp, "pipeline_parallel_microbatch_size": lay.micro_batch_size}
    if lay.pp > 1:
        par["pipeline_parallel_schedule"] = _schedule(job)
        par["module_fqns_per_model_part"] = [job.fqns(s) for s in range(len(job.stages))]
    local = lay.micro_batch_size * lay.micro_batches
    training = {"local_batch_size": local, "global_batch_size": local * lay.dp, "seq_len": job.seq_len}
    training |= _PRECISION.get(job.precision or "", {})
    ac = _checkpointing(job, notes)
    notes += _zero_notes(job) + _sequence_parallel_notes(job) + _loss_parallel_notes(job) + _overlap_notes(job)
    sections = {"parallelism": par, "training": training, "activation_checkpoint": ac}
    if lay.tp_overlap:         # torchtitan refuses async TP without torch.compile ("Async TP requires compile")
        sections["compile"] = {"enable": True}
    return TorchtitanSettings(sections, _overrides(job, sections, notes), notes)


def _schedule(job: Job) -> str:
    name = job.schedule or "1f1b"
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name}: torchtitan runs {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def _checkpointing(job: Job, notes: list[str]) -> dict[str, Any]:
    """``[activation_checkpoint]``: none, full, or selective every n-th block (torchtitan 0.2's
    ``selective_ac_option = "n"`` wraps blocks n, 2n, ... of each rank)."""
    blocks, recomputed = job.blocks, sum(p.recomputed for p in job.parts)
    if job.offloaded_blocks:
        notes.append(f"{job.offloaded_blocks} blocks offload their activations in the plan; torchtitan does not "
                     "offload activations per layer: they are recomputed instead (the plan's time does not hold)")
    if recomputed == 0:
        return {"mode": "none"}
    if recomputed == blocks:
        return {"mode": "full"}
    every = blocks // recomputed
    notes.append(f"the plan recomputes {recomputed} of {blocks} blocks; torchtitan 0.2 recomputes every "
                 f"{every}-th block ({blocks // every} of {blocks}, not necessarily the plan's), torchtitan 0.3 "
                 "all of them (activation-checkpoint:full; its selective mode is per operation)")
    return {"mode": "selective", "selective_ac_option": str(every)}


def _zero_notes(job: Job) -> list[str]:
    lay = job.layout
    if lay.dp == 1:
        return []
    if lay.zero == 1:
        return ["ZeRO-1 (optimizer state sharded only) has no torchtitan equivalent: FSDP without resharding after "
                "forward shards gradients too (ZeRO-2: less memory than the plan; the same bytes on the links, "
                "reduce-scatter and all-gather instead of all-reduce)"] + ([
                "dpo=1 (Megatron's distributed optimizer overlapping its reduce-scatter with the backward and its "
                "all-gather with the next forward): the closest is the same FSDP, which prefetches its gathers and "
                "reduce-scatters layer by layer (priced as zero=2 by the workbench: re-plan with zero=2 to compare)"]
                if lay.dp_overlap else [])
    if lay.zero == 0 and (lay.tp > 1 or lay.pp > 1):
        return ["torchtitan 0.2 refuses DDP together with TP or PP ('DDP has not supported > 1D parallelism'); "
                "torchtitan 0.3 replicates over the same mesh with FSDP's code (shard degree 1)"]
    return []


def _sequence_parallel_notes(job: Job) -> list[str]:
    if job.layout.tp > 1 and not job.layout.sequence_parallel:
        return ["torchtitan 0.2 always shards the norms' activations over TP (sequence parallelism): less memory "
                "than the plan, which keeps them whole; torchtitan 0.3 follows the plan "
                "(--parallelism.no_enable_sequence_parallel)"]
    return []


def _loss_parallel_notes(job: Job) -> list[str]:
    if job.layout.tp > 1 and not job.layout.loss_parallel:
        return ["the plan gathers the logits on every TP rank for the loss (lp=0): torchtitan 0.2's "
                "parallelism.disable_loss_parallel = true, as planned; its default (and Megatron's only way) is the "
                "vocabulary-parallel loss: plan with lp=1 for it. torchtitan 0.3's command line has no such option"]
    return []


def _overlap_notes(job: Job) -> list[str]:
    if not job.layout.tp_overlap:
        return []
    return ["tpo=1: torch's async TP (parallelism.enable_async_tensor_parallel), which torchtitan runs only under "
            "torch.compile ([compile] enable = true, set here): its micro-pipelined all-gather + matmul and matmul + "
            "reduce-scatter are the overlap the plan priced after Transformer Engine's userbuffers (chunks and SMs "
            "differ); torchtitan 0.3 sets both in its Python config function"]


def default_split(blocks: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """Blocks per stage of torchtitan 0.3's split when no module names are given (its documented rule: the
    embedding counts as ``first_less`` blocks and the norm with the output as ``last_less``; the stages share
    the total as evenly as whole numbers allow, the first ones one more)."""
    total = blocks + first_less + last_less
    share = [total // stages + (i < total % stages) for i in range(stages)]
    share[0] -= first_less
    share[-1] -= last_less
    return share


def _split_overrides(job: Job) -> list[str] | None:
    """torchtitan 0.3's three split settings that give the plan's blocks per stage, or None."""
    want, stages = [p.blocks for p in job.parts], len(job.parts)
    for first in range(0, max(want) + 2):
        for last in range(0, max(want) + 2):
            total = job.blocks + first + last
            per = math.ceil(total / stages)
            accepted = max(first, last) <= total // stages      # torchtitan refuses a heavier end stage
            if accepted and default_split(job.blocks, stages, first, last) == want and \
                    math.ceil(total / per) == stages:
                return ["--parallelism.pipeline_parallel_layers_per_stage", str(per),
                        "--parallelism.pipeline_parallel_first_stage_less_layers", str(first),
                        "--parallelism.pipeline_parallel_last_stage_less_layers", str(last)]
    return None


def _overrides(job: Job, sections: dict[str, dict[str, Any]], notes: list[str]) -> list[str]:
    """torchtitan 0.3's command line: every TOML key as ``--section.key value`` but the 0.2-only ones, the
    split as its three settings, sequence parallelism, CUDA graphs off under PP, the checkpointing sub-command."""
    out: list[str] = []
    for section in ("parallelism", "training"):
        for key, value in sections[section].items():
            if key in ("enable_async_tensor_parallel", "module_fqns_per_model_part", "disable_loss_parallel"):
                continue
            out += [f"--{section}.{key}", str(value)]
    lay = job.layout
    if lay.tp > 1:
        out.append(f"--parallelism.{'' if lay.sequence_parallel else 'no_'}enable_sequence_parallel")
    if lay.pp > 1:
        out.append("--training.disable_cuda_graphs")
        split = _split_overrides(job)
        if split is None:
            parts = [[f if f != "output" else "lm_head" for f in job.fqns(s)] for s in range(len(job.stages))]
            notes.append("torchtitan 0.3 takes this split only in its Python config function: "
                         f"parallelism.module_fqns_per_model_part = {parts}")
        else:
            out += split
    mode = sections["activation_checkpoint"]["mode"]
    out.append(f"activation-checkpoint:{'full' if mode == 'selective' else mode}")
    return out


def to_toml(settings: TorchtitanSettings, header: list[str] = ()) -> str:
    """The TOML text: ``header`` and the notes as comments, then the 0.3 command line as a comment, then the
    sections (values are whole numbers, booleans, strings and lists of lists of strings)."""
    lines = [f"# {h}" for h in header] + [f"# note: {n}" for n in settings.notes]
    lines += ["# torchtitan 0.3 (no TOML; after --module M --config C):", "#   " + " ".join(settings.overrides)]
    for section, keys in settings.sections.items():
        lines += ["", f"[{section}]"] + [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")
