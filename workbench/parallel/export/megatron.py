"""A plan as Megatron-LM's command-line flags (docs/model.md, "Export to torchtitan and Megatron-LM").

The flags are spelled as ``megatron/training/arguments.py`` of Megatron-LM core_v0.15.0 (commit 0d7e02bd) declares
them; from core_v0.16 most are generated from the same fields of ``ModelParallelConfig`` and
``TransformerConfig``, with the same names. Megatron numbers its ranks tensor-parallel innermost, then data, then
pipeline (its default order ``tp-cp-ep-dp-pp``), as :class:`~workbench.model.layout.Layout` does; the data-parallel
degree is the world size over tp x pp, so it is not a flag.

>>> from workbench.parallel.export.job import Job
>>> from workbench.model.layout import Layout
>>> names = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(8)), "model.norm", "lm_head"]
>>> job = Job(Layout(tp=2, pp=2, dp=2, zero=1, micro_batch_size=1, micro_batches=8, schedule="interleaved-1f1b",
...           chunks=2, sequence_parallel=True), seq_len=4096, stages=(names[:3], names[3:5], names[5:7], names[7:]))
>>> " ".join(megatron_flags(job).args)  # doctest: +NORMALIZE_WHITESPACE
'--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --num-layers 8
 --seq-length 4096 --micro-batch-size 1 --global-batch-size 16 --use-distributed-optimizer
 --num-layers-per-virtual-pipeline-stage 2'
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from workbench.methods import METHODS
from workbench.parallel.export.job import Job

__all__ = ["MegatronFlags", "megatron_flags", "layout_string"]

#: the workbench's flushed methods Megatron does not run -> the closest it does
_CLOSEST = {m.name: m.megatron_closest for m in METHODS if m.megatron_closest}
#: ZeRO 2 and 3: Megatron-FSDP's sharding strategies (``--data-parallel-sharding-strategy``)
_FSDP = {2: "optim_grads", 3: "optim_grads_params"}


@dataclass(frozen=True)
class MegatronFlags:
    """``args``: the flags, in order; ``env``: environment variables Megatron asks for; ``notes``: what does not
    translate exactly."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def text(self, header: list[str] = ()) -> str:
        """A shell fragment: comments, ``export`` lines, then one flag (and its value, shell-quoted) per line."""
        lines = [f"# {h}" for h in header] + [f"# note: {n}" for n in self.notes]
        lines += [f"export {k}={v}" for k, v in self.env.items()]
        flags, i = [], 0
        while i < len(self.args):
            takes_value = i + 1 < len(self.args) and not self.args[i + 1].startswith("--")
            flags.append(" ".join(shlex.quote(a) for a in self.args[i:i + 1 + takes_value]))  # "Et*2|L": one word
            i += 1 + takes_value
        return "\n".join(lines + [f + " \\" for f in flags[:-1]] + flags[-1:]) + "\n"


def megatron_flags(job: Job) -> MegatronFlags:
    """Megatron-LM's flags for ``job``; a ``ValueError`` naming the closest schedule for one Megatron lacks."""
    lay, notes, env = job.layout, [], {}
    _check_schedule(job)
    args = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp)]
    if lay.tp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"        # Megatron asserts it under TP (arguments.py)
        if lay.sequence_parallel:
            args.append("--sequence-parallel")
        if lay.tp_overlap:        # needs --sequence-parallel (arguments.py asserts it; so does the layout)
            args.append("--tp-comm-overlap")
            notes.append("--tp-comm-overlap: Transformer Engine's userbuffers with their default overlap settings "
                         "(as the plan priced them); --tp-comm-overlap-cfg takes a per-model YAML")
        if not lay.loss_parallel:
            notes.append("Megatron always computes the loss vocabulary-parallel (the logits stay split over TP); the "
                         "plan gathered them on every rank (lp=0): Megatron holds less and moves less than planned; "
                         "re-plan with lp=1 to price what it runs")
    args += ["--num-layers", str(job.blocks), "--seq-length", str(job.seq_len),
             "--micro-batch-size", str(lay.micro_batch_size), "--global-batch-size", str(lay.global_batch)]
    args += _data_parallel(job, notes, env)
    if job.precision in ("bf16-mixed", "bf16"):
        args.append("--bf16")
        if job.precision == "bf16":
            notes.append("pure bf16 (no fp32 master weights): Megatron's --bf16 keeps fp32 main parameters and "
                         "optimizer state, more memory than the plan")
    args += _pipeline_split(job, notes) + _recompute(job, notes)
    return MegatronFlags(args, env, notes)


def _check_schedule(job: Job) -> None:
    name = job.schedule
    if name in _CLOSEST:
        closest = _CLOSEST[name]
        extra = f" --chunks {job.layout.chunks}" if closest == "interleaved-1f1b" else ""
        raise ValueError(f"schedule {name}: Megatron-LM runs 1F1B and interleaved 1F1B only; the closest is "
                         f"{closest}: re-plan with --method {closest}{extra}")


def _data_parallel(job: Job, notes: list[str], env: dict[str, str]) -> list[str]:
    lay = job.layout
    if lay.dp == 1 or lay.zero == 0:
        return []
    if lay.zero == 1 and lay.dp_overlap:
        notes.append("dpo=1: --overlap-grad-reduce --overlap-param-gather at Megatron's default buckets (max(40M, 1M x "
                     "dp) parameters) and fp32 gradient reduction (--bf16's default), as the plan priced them")
        return ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if lay.zero == 1:
        return ["--use-distributed-optimizer"]
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)      # FSDP asserts it is not 1
    notes.append(f"ZeRO-{lay.zero} is Megatron-FSDP (Megatron's distributed optimizer is ZeRO-1); it saves "
                 "checkpoints as fsdp_dtensor only" + (". Megatron's arguments.py refuses torch FSDP2 with pipeline "
                                                       "parallelism; check that your version runs Megatron-FSDP "
                                                       "with it" if lay.pp > 1 else ""))
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _FSDP[lay.zero], "--ckpt-format",
            "fsdp_dtensor"]


def layout_string(job: Job) -> str:
    """Megatron's ``--pipeline-model-parallel-layout``: the stages in stage order, ``|`` between them, ``E`` the
    embedding, ``t`` a decoder block, ``L`` the output layer with the loss; ``t*n`` n blocks."""
    stages = []
    for part in job.parts:
        text = "E" * part.embedding + (f"t*{part.blocks}" if part.blocks > 1 else "t" * part.blocks)
        stages.append(text + "L" * part.head)
    return "|".join(stages)


def _pipeline_split(job: Job, notes: list[str]) -> list[str]:
    """Megatron's even split when the plan's is it (the embedding on the first stage and the output layer on the
    last, uncounted), else the plan's own as a layout string."""
    lay, parts = job.layout, job.parts
    per = job.uniform_blocks()
    if any(not p.head and p.layers and "norm" in p.layers[-1].rsplit(".", 1)[-1].lower() for p in parts):
        notes.append("the plan puts the final norm on another stage than the output layer; Megatron keeps it with "
                     "the output layer")
    if lay.pp == 1:
        return []
    if per is not None and per > 0:
        return ["--num-layers-per-virtual-pipeline-stage", str(per)] if lay.chunks > 1 else []
    return ["--pipeline-model-parallel-layout", layout_string(job)]


def _recompute(job: Job, notes: list[str]) -> list[str]:
    """Full recomputation of whole blocks: every block (uniform, 1), or the first k of each stage (block, k)."""
    counts = [p.recomputed for p in job.parts]
    if job.offloaded_blocks:
        notes.append(f"{job.offloaded_blocks} blocks offload their activations in the plan; Megatron's flags do not "
                     "offload activations (its cpu_offloading refuses pipeline parallelism): recomputed instead")
    if not any(counts):
        return []
    if all(p.recomputed == p.blocks for p in job.parts):
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    most = max(counts)
    if len(set(counts)) > 1:
        notes.append(f"the plan recomputes {min(counts)} to {most} blocks per stage; Megatron takes one number: "
                     f"{most} on every stage (memory at most the plan's, more recomputation)")
    return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(most)]
