"""What a training framework needs from a plan: its layout, its pipeline stages counted in decoder blocks, and the
activation policy of every block (docs/model.md, "Layouts", "Export to torchtitan and Megatron-LM").

A plan's layers are named as the profiler found them (``model.embed_tokens+model.rotary_emb``, ``model.layers.0``,
..., ``model.norm``, ``lm_head`` for a Hugging Face Llama). The *blocks* are the layers numbered in one container
(``model.layers.N``); the layers before the first block are the embedding, those after the last the final norm and
the output layer with the loss. A :class:`Job` keeps, per pipeline stage in stage order, the layer names it holds,
its blocks and how many of them recompute their activations: what torchtitan's and Megatron-LM's settings can say.

>>> names = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm", "lm_head"]
>>> job = Job(layout=Layout(pp=2, micro_batch_size=1, micro_batches=4, schedule="1f1b"), seq_len=2048,
...           stages=(names[:3], names[3:]), policies=dict.fromkeys(names, "keep") | {"model.layers.2": "recompute"})
>>> [(s.blocks, s.recomputed, s.embedding, s.head) for s in job.parts]
[(2, 0, True, False), (1, 1, False, True)]
>>> job.blocks, job.block_container, job.fqns(1)
(3, 'model.layers', ['layers.2', 'norm', 'output'])
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from workbench.methods import flushed, method
from workbench.model.layout import Layout

__all__ = ["Job", "Part", "job_from_plan", "read_plan", "CLOSEST_FLUSHED"]

_NUMBERED = re.compile(r"^(?P<container>.+)\.(?P<index>\d+)$")
#: a periodic plan has no flush; the flushed schedule with its steady state (one forward, one backward) is 1F1B
CLOSEST_FLUSHED = "1f1b"


@dataclass(frozen=True)
class Part:
    """One pipeline stage: its layers (names as profiled), decoder blocks, blocks recomputed, and whether it holds
    the embedding (the layers before the first block) and the output layer (the last layer)."""

    layers: tuple[str, ...]
    blocks: int
    recomputed: int
    embedding: bool
    head: bool


@dataclass(frozen=True)
class Job:
    """A layout with its micro-batching and schedule settled, the sequence length, the stages (each a list of
    layer names, in stage order: stage s on pipeline rank s mod pp for looped schedules, the V for V schedules)
    and each layer's activation policy (``keep``, ``recompute`` or ``offload``; missing: ``keep``)."""

    layout: Layout
    seq_len: int
    stages: tuple[Sequence[str], ...]
    policies: Mapping[str, str] = field(default_factory=dict)
    precision: str | None = None

    def __post_init__(self) -> None:
        if self.layout.micro_batch_size is None or self.layout.micro_batches is None:
            raise ValueError("parallel: the layout has no micro_batch_size or micro_batches; a framework needs both")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"sequence length must be a whole number >= 1, got {self.seq_len!r}")
        want = self.layout.pp * self.layout.chunks
        if len(self.stages) != want:
            raise ValueError(f"the plan has {len(self.stages)} pipeline stages, its layout pp={self.layout.pp} x "
                             f"chunks={self.layout.chunks} = {want}")
        if self.block_container is None:
            raise ValueError("no decoder blocks among the plan's layers (names like model.layers.0, model.layers.1):"
                             " a framework's settings count layers in blocks")

    @property
    def layer_names(self) -> list[str]:
        return [name for stage in self.stages for name in stage]

    @property
    def block_container(self) -> str | None:
        """The container whose numbered children are the blocks (``model.layers``): the most frequent one."""
        found = Counter(m["container"] for name in self.layer_names for part in name.split("+")
                        if (m := _NUMBERED.match(part)))
        return found.most_common(1)[0][0] if found else None

    def _is_block(self, part: str) -> bool:
        m = _NUMBERED.match(part)
        return bool(m) and m["container"] == self.block_container

    def _block_positions(self) -> tuple[int, int]:
        """Index (in :attr:`layer_names`) of the first and the last layer holding a block."""
        at = [i for i, name in enumerate(self.layer_names) if any(self._is_block(p) for p in name.split("+"))]
        return at[0], at[-1]

    @property
    def parts(self) -> list[Part]:
        """The stages as :class:`Part` values (the first holds the embedding, the last the output layer)."""
        out, at = [], 0
        for stage in self.stages:
            blocks = recomputed = 0
            for name in stage:
                n = sum(self._is_block(p) for p in name.split("+"))
                blocks += n
                recomputed += n if self.policies.get(name, "keep") != "keep" else 0
            out.append(Part(tuple(stage), blocks, recomputed, embedding=at == 0,
                            head=at + len(stage) == len(self.layer_names)))
            at += len(stage)
        return out

    @property
    def blocks(self) -> int:
        return sum(p.blocks for p in self.parts)

    @property
    def offloaded_blocks(self) -> int:
        """Blocks whose activations the plan offloads to the host (neither framework offloads them per layer)."""
        return sum(1 for name in self.layer_names if self.policies.get(name) == "offload"
                   for p in name.split("+") if self._is_block(p))

    @property
    def schedule(self) -> str | None:
        """The pipeline schedule's method name; None for a layout without a pipeline (pp 1)."""
        return self.layout.schedule if self.layout.pp > 1 else None

    def fqns(self, stage: int) -> list[str]:
        """torchtitan's module names for stage ``stage``: ``tok_embeddings``, ``layers.N``, ``norm``, ``output``
        (its decoder models' names), in order, each once."""
        first, _ = self._block_positions()
        start = sum(len(s) for s in self.stages[:stage])
        names: list[str] = []
        for i, name in enumerate(self.stages[stage], start):
            for part in name.split("+"):
                if self._is_block(part):
                    fqn = f"layers.{_NUMBERED.match(part)['index']}"
                elif i < first:
                    fqn = "tok_embeddings"
                else:
                    fqn = "norm" if "norm" in part.rsplit(".", 1)[-1].lower() else "output"
                if fqn not in names:
                    names.append(fqn)
        return names

    def uniform_blocks(self) -> int | None:
        """Blocks per stage when every stage holds as many (Megatron's and torchtitan's even split), else None."""
        counts = {p.blocks for p in self.parts}
        return counts.pop() if len(counts) == 1 else None


def read_plan(path: str | Path) -> dict[str, Any]:
    """A plan file's JSON object, with its standard fields checked as ``check`` checks them."""
    from workbench.model.plan import Plan

    Plan.from_json(Path(path))           # the plan's own checks: one line naming the file and the field
    return json.loads(Path(path).read_text())


def job_from_plan(data: Mapping[str, Any], *, seq_len: int | None = None, where: str = "plan") -> Job:
    """The :class:`Job` of a plan JSON object (``plan --parallel ... --json``): its ``"parallel"`` layout, its
    stages and layer names (``extra.layer_names``), its activations; ``seq_len`` the sequence length (default: the
    plan's ``sequence_length``). A ``ValueError`` naming what is missing otherwise."""
    from workbench.model.plan import Plan

    if "parallel" not in data:
        raise ValueError(f"{where}: no \"parallel\" layout (make the plan with plan --parallel ...)")
    layout = Layout.from_dict(data["parallel"], where=f"{where}: parallel")
    plan = Plan.from_dict(dict(data))
    names = list(plan.extra.get("layer_names") or [])
    if len(names) != len(plan.assignment) or not names:
        raise ValueError(f"{where}: extra.layer_names missing or not one per layer (plans made by "
                         "python -m workbench plan carry them)")
    stages = sorted(plan.stages, key=lambda s: s.first)
    covered = [i for s in stages for i in range(s.first, s.last + 1)]
    if covered != list(range(len(names))):
        raise ValueError(f"{where}: the stages do not cover layers 0..{len(names) - 1} once each, in order")
    layout = _settled(layout, plan, where)
    seq = seq_len if seq_len is not None else data.get("sequence_length")
    if seq is None:
        raise ValueError(f"{where}: the plan does not record its sequence length; give --seq-len")
    return Job(layout=layout, seq_len=seq, stages=tuple(tuple(names[s.first:s.last + 1]) for s in stages),
               policies=dict(zip(names, plan.activations)), precision=plan.setup.get("precision"))


def _settled(layout: Layout, plan: Any, where: str) -> Layout:
    """The layout with the plan's schedule and micro-batch count where the layout leaves them open."""
    schedule = layout.schedule or (plan.schedule if flushed(plan.schedule) else plan.method) or None
    if schedule:
        method(schedule)                 # an unknown name: one line naming the choices
    if layout.pp > 1 and schedule and not flushed(schedule):
        raise ValueError(f"{where}: the {schedule} plan is periodic (one forward and one backward of different "
                         "mini-batches per period, weight stashing): no framework runs it. The closest flushed "
                         f"schedule is {CLOSEST_FLUSHED}: re-plan with --method {CLOSEST_FLUSHED}")
    return layout.with_(schedule=schedule, micro_batches=layout.micro_batches or plan.micro_batches)
