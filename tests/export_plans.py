"""Plan JSON objects with a "parallel" layout for the export tests: a Hugging Face Llama's layer names (the
embedding with the rotary table, numbered blocks, the final norm, the head), stages in stage order."""

from __future__ import annotations

from typing import Sequence


def llama_names(blocks: int) -> list[str]:
    return ["model.embed_tokens+model.rotary_emb", *(f"model.layers.{i}" for i in range(blocks)), "model.norm",
            "lm_head"]


def layout_plan(blocks_per_stage: Sequence[int], *, pp: int, schedule: str = "1f1b", chunks: int = 1,
                v_shape: bool = False, activations: Sequence[str] | None = None, **parallel) -> dict:
    """A plan whose stage s holds ``blocks_per_stage[s]`` blocks (the first also the embedding, the last the norm
    and the head), stage s on pipeline rank s mod pp (or the V for ``v_shape``); ``parallel`` sets the layout
    (micro-batch size 1 and 2 pp micro-batches unless given)."""
    names = llama_names(sum(blocks_per_stage))
    stages, first, count = [], 0, len(blocks_per_stage)
    for s, n in enumerate(blocks_per_stage):
        last = first + n - 1 + (s == 0) + 2 * (s == count - 1)
        device = (s if s < pp else 2 * pp - 1 - s) if v_shape else s % pp
        stages.append({"layers": [first, last], "device": device, "fwd_start": 0.0, "bwd_start": 0.0})
        first = last + 1
    assert first == len(names)
    assignment = [st["device"] for st in stages for _ in range(st["layers"][0], st["layers"][1] + 1)]
    layout = {"pp": pp, "micro_batch_size": 1, "micro_batches": 2 * pp, "schedule": schedule, "chunks": chunks,
              **parallel}
    return {"method": schedule, "schedule": schedule, "devices": pp, "micro_batches": layout["micro_batches"],
            "assignment": assignment, "stages": stages, "activations": list(activations or ["keep"] * len(names)),
            "memory_setup": {"memory_model": "full", "optimizer": "adam", "precision": "bf16-mixed"},
            "extra": {"layer_names": names}, "parallel": layout}
