"""The tensor-parallel sharding plan of a decoder: which modules are split column-wise, row-wise, by sequence.

Megatron-LM's split of a transformer block over ``tp`` GPUs, as torchtitan writes it with torch's own API
(``torch.distributed.tensor.parallel.parallelize_module``):

* attention: the query, key and value projections **column-wise** (``ColwiseParallel``: each rank computes
  ``heads / tp`` query heads and ``kv_heads / tp`` key/value heads), the output projection **row-wise**
  (``RowwiseParallel``: each rank multiplies its heads' slice, the partial sums are all-reduced);
* MLP: the gate and up projections column-wise, the down projection row-wise;
* the token embedding **vocabulary-parallel** (row-wise: each rank holds ``vocab / tp`` rows, the looked-up
  vectors are all-reduced, and its gradient as its rows only:
  :class:`~workbench.parallel.tensor.styles.VocabParallelEmbedding`) and the LM head column-wise (each rank
  computes ``vocab / tp`` logits, gathered for the loss, or kept sharded for a vocabulary-parallel loss,
  ``loss_parallel``);
* the attention and the MLP each take their input through one :class:`PrepareHiddenState` (a
  ``PrepareModuleInput``): one tensor feeds the three (two) column-wise projections, so the backward
  all-reduces its gradient once per sub-block, Megatron's ``f`` operator, not once per projection;
* with **sequence parallelism** (``sequence_parallel``) the norms run on ``sequence / tp`` positions
  (``SequenceParallel``), the attention and MLP inputs are all-gathered over the sequence and the row-wise
  outputs reduce-scattered back to it: between blocks each rank holds ``1 / tp`` of the hidden state.

Modules are found by the names Hugging Face's Llama-style models (Llama, Qwen2, Mistral) and torchtitan's
Llama use: ``q_proj``/``wq``, ``k_proj``/``wk``, ``v_proj``/``wv``, ``o_proj``/``wo``,
``gate_proj``/``w1``, ``up_proj``/``w3``, ``down_proj``/``w2``; the embedding and head are the model's
``get_input_embeddings()``/``get_output_embeddings()`` (else ``embed_tokens``/``tok_embeddings`` and
``lm_head``/``output``). GPT-2 (Hugging Face's ``GPT2LMHeadModel`` and its family) is split as Megatron
splits its GPT, by the names of its ``Conv1D`` layers (:data:`GPT2_ROLES`): the fused query/key/value
projection ``attn.c_attn`` column-wise with each rank holding its own heads' query, key and value (its
columns permuted, :class:`~workbench.parallel.tensor.styles.Conv1DColwise`; :meth:`TensorPlan.permuted`),
``attn.c_proj`` row-wise, ``mlp.c_fc`` column-wise and ``mlp.c_proj`` row-wise; its token embedding ``wte``
and the head tied to it vocabulary-parallel, its position embedding ``wpe`` whole on every rank. Other fused
projections (``qkv_proj``, ``query_key_value``, ``Wqkv``, ``gate_up_proj``, GPT-2's cross-attention) are
refused: splitting them column-wise as they are would hand a rank whole query heads and none of the keys.
A model whose sizes ``tp`` does not divide is refused naming them (:func:`check_sizes`).

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> with torch.device("meta"):
...     model = LlamaForCausalLM(cfg)
>>> plan = plan_model(model, 2)
>>> plan.colwise[:3], plan.rowwise[:2], plan.embedding, plan.head
(('model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj', 'model.layers.0.self_attn.v_proj'), \
('model.layers.0.self_attn.o_proj', 'model.layers.0.mlp.down_proj'), 'model.embed_tokens', 'lm_head')
>>> from transformers import GPT2Config, GPT2LMHeadModel
>>> with torch.device("meta"):
...     gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4))
>>> plan = plan_model(gpt2, 2)
>>> plan.colwise[:2], plan.fused[:1], plan.embedding, plan.head
(('transformer.h.0.attn.c_attn', 'transformer.h.0.mlp.c_fc'), ('transformer.h.0.attn.c_attn',), \
'transformer.wte', 'lm_head')
>>> plan.permuted()["transformer.h.0.attn.c_attn.weight"]     # (dim, parts): q | k | v columns
(1, 3)
>>> plan_model(model, 4)
Traceback (most recent call last):
ValueError: tp=4 does not divide the model's key/value heads (2); sizes: query heads 4, key/value heads 2, \
hidden 64, intermediate 128, vocabulary 256
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from torch import nn

from workbench.parallel.tensor.styles import is_conv1d

__all__ = ["Sizes", "TensorPlan", "plan_model", "check_sizes", "ROLES", "GPT2_ROLES"]

#: each role of a block's linear layers, the names it goes by (Hugging Face's, then torchtitan's)
ROLES: Mapping[str, tuple[str, ...]] = {
    "query": ("q_proj", "wq"), "key": ("k_proj", "wk"), "value": ("v_proj", "wv"), "output": ("o_proj", "wo"),
    "gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2"),
}
#: GPT-2's ``Conv1D`` projections by (their parent's name, their own): the fused query | key | value, the
#: attention's output, the MLP's up and down projections
GPT2_ROLES: Mapping[tuple[str, str], str] = {
    ("attn", "c_attn"): "qkv", ("attn", "c_proj"): "output", ("mlp", "c_fc"): "up", ("mlp", "c_proj"): "down",
}
#: the parts of each fused role, side by side in its output columns
_FUSED_PARTS = {"qkv": 3}
_COLWISE = ("query", "key", "value", "qkv", "gate", "up")
_ROWWISE = ("output", "down")
#: a block's norms (sequence-parallel under ``sequence_parallel``) and the final one
_BLOCK_NORMS = ("input_layernorm", "post_attention_layernorm", "attention_norm", "ffn_norm", "ln_1", "ln_2")
_FINAL_NORMS = ("norm", "final_layernorm", "final_norm", "ln_f")
#: fused projections torch's column-wise split would cut across roles (query | key | value, gate | up)
_FUSED = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "gate_up_proj")


@dataclass(frozen=True)
class Sizes:
    """The sizes tensor parallelism splits: query and key/value heads, hidden, intermediate (MLP) and vocabulary."""

    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    vocab: int

    def items(self) -> list[tuple[str, int]]:
        return [("query heads", self.heads), ("key/value heads", self.kv_heads), ("hidden", self.hidden),
                ("intermediate", self.intermediate), ("vocabulary", self.vocab)]


@dataclass(frozen=True)
class TensorPlan:
    """Which module paths are split how (module docstring); :meth:`styles` gives torch's parallel styles."""

    tp: int
    sizes: Sizes
    colwise: tuple[str, ...]
    rowwise: tuple[str, ...]
    attention: tuple[str, ...]
    mlp: tuple[str, ...]
    norms: tuple[str, ...]
    embedding: str | None
    head: str | None
    sequence_parallel: bool = False
    loss_parallel: bool = False
    #: the fused query | key | value projections (also in ``colwise``): columns permuted, each rank its heads'
    fused: tuple[str, ...] = ()
    #: the projections that are GPT-2 ``Conv1D`` layers (weight ``[in, out]``), split by the Conv1D styles
    conv1d: tuple[str, ...] = ()
    #: under sequence parallelism, the module whose output is split over the sequence when the model adds
    #: learned positions to the token embedding (GPT-2's embedding dropout ``drop``: the token embedding is
    #: all-reduced whole, the positions added, then each rank keeps its part, Megatron's
    #: ``scatter_to_sequence_parallel_region``); None: the token embedding is reduce-scattered itself
    sequence_scatter: str | None = None

    def permuted(self) -> dict[str, tuple[int, int]]:
        """``{parameter name: (dim, parts)}`` of the parameters whose sharded ``DTensor`` holds the model's
        tensor permuted along ``dim`` (:func:`~workbench.parallel.tensor.styles.fused_order`): gathered whole,
        :func:`~workbench.parallel.tensor.styles.model_order` puts them back in the model's order."""
        return {f"{path}.{name}": (dim, _FUSED_PARTS["qkv"]) for path in self.fused
                for name, dim in (("weight", 1 if path in self.conv1d else 0), ("bias", 0))}

    def styles(self) -> dict[str, Any]:
        """``{module path: ParallelStyle}`` for ``parallelize_module``."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleOutput,
            RowwiseParallel,
            SequenceParallel,
        )

        from workbench.parallel.tensor.styles import (
            Conv1DColwise,
            Conv1DRowwise,
            PrepareHiddenState,
            VocabParallelEmbedding,
        )

        sp = self.sequence_parallel
        between = Shard(1) if sp else Replicate()     # the hidden state between sub-blocks
        styles: dict[str, Any] = {}
        scatter = sp and self.sequence_scatter is not None
        if self.embedding:
            styles[self.embedding] = VocabParallelEmbedding(input_layouts=Replicate(), output_layouts=Replicate()
                                                            if scatter else between, use_local_output=not sp or scatter)
        if scatter:
            styles[self.sequence_scatter] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=
                                                                Shard(1), use_local_output=False)
        for path in self.attention + self.mlp:
            styles[path] = PrepareHiddenState(between, Replicate())
        for path in self.colwise:                 # torch's own for an nn.Linear, ours for a Conv1D
            styles[path] = (Conv1DColwise(parts=_FUSED_PARTS["qkv"] if path in self.fused else 1)
                            if path in self.conv1d else ColwiseParallel())
        for path in self.rowwise:
            styles[path] = (Conv1DRowwise if path in self.conv1d else RowwiseParallel)(
                output_layouts=between, use_local_output=not sp)
        if sp:
            for path in self.norms:
                styles[path] = SequenceParallel()
        if self.head:
            styles[self.head] = ColwiseParallel(input_layouts=between, output_layouts=Shard(-1) if self.loss_parallel
                                                else Replicate(), use_local_output=not self.loss_parallel)
        return styles

    def describe(self) -> str:
        """One line: ``'TP 2 (Megatron: 10 column-wise, 4 row-wise linears; vocabulary-parallel embedding and
        head)'``."""
        extra = [f"{len(self.colwise)} column-wise, {len(self.rowwise)} row-wise linears"
                 + (f" ({len(self.fused)} fused query/key/value, each rank its heads')" if self.fused else "")]
        if self.embedding or self.head:
            extra.append("vocabulary-parallel " + " and ".join(n for n, p in (("embedding", self.embedding),
                                                                                ("head", self.head)) if p))
        if self.sequence_parallel:
            extra.append(f"sequence-parallel norms ({len(self.norms)})")
        if self.loss_parallel:
            extra.append("vocabulary-parallel loss")
        return f"TP {self.tp} (Megatron: {'; '.join(extra)})"


def check_sizes(sizes: Sizes, tp: int, sequence: int | None = None) -> None:
    """A ``ValueError`` naming the sizes when ``tp`` does not divide one of them (and, under sequence
    parallelism, the ``sequence`` length).

    >>> check_sizes(Sizes(8, 8, 4096, 14336, 128256), 8)
    >>> check_sizes(Sizes(25, 25, 1600, 6400, 50257), 2)
    Traceback (most recent call last):
    ValueError: tp=2 does not divide the model's query heads (25), key/value heads (25), vocabulary (50257); \
sizes: query heads 25, key/value heads 25, hidden 1600, intermediate 6400, vocabulary 50257; pad the \
vocabulary to a multiple of tp, as Megatron-LM does
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a whole number >= 1, got {tp!r}")
    bad = [f"{name} ({n})" for name, n in sizes.items() if n % tp]
    if sequence is not None and sequence % tp:
        bad.append(f"sequence length ({sequence}, split under sequence parallelism)")
    if bad:
        hint = "; pad the vocabulary to a multiple of tp, as Megatron-LM does" if sizes.vocab % tp else ""
        raise ValueError(f"tp={tp} does not divide the model's {', '.join(bad)}; sizes: "
                         + ", ".join(f"{name} {n}" for name, n in sizes.items()) + hint)


def _leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _role_of(path: str, m: nn.Module, names: Mapping[str, str]) -> str | None:
    """The role of module ``path`` (a Llama-style nn.Linear by its name, a GPT-2 Conv1D by its and its
    parent's names), None for none; refused: a fused projection the plan does not know, a role's name on a
    module torch's styles cannot split."""
    leaf = _leaf(path)
    if is_conv1d(m) and (_leaf(_parent(path)), leaf) in GPT2_ROLES:
        return GPT2_ROLES[_leaf(_parent(path)), leaf]
    if leaf in _FUSED and not any(True for _ in m.children()):
        raise ValueError(f"tensor parallelism: {path} ({type(m).__name__}) is a fused projection; torch's "
                         "column-wise split would cut across its query/key/value (gate/up) parts: only models "
                         "with separate q_proj, k_proj, v_proj (gate_proj, up_proj) and GPT-2's self-attention "
                         "c_attn are sharded (Llama, Qwen2, Mistral, GPT-2)")
    if leaf in names and path:
        if not isinstance(m, nn.Linear):
            raise ValueError(f"tensor parallelism: {path} is a {type(m).__name__}, not an nn.Linear: torch's "
                             "ColwiseParallel and RowwiseParallel split nn.Linear and nn.Embedding only")
        return names[leaf]
    return None


def _find_roles(model: nn.Module) -> dict[str, list[str]]:
    """Every module path of each role (:data:`ROLES`, :data:`GPT2_ROLES`), in the model's order."""
    names = {n: role for role, ns in ROLES.items() for n in ns}
    found: dict[str, list[str]] = {role: [] for role in (*ROLES, "qkv")}
    for path, m in model.named_modules():
        role = _role_of(path, m, names)
        if role is not None:
            found[role].append(path)
    if not found["query"] and not found["qkv"]:
        raise ValueError(f"tensor parallelism: no attention projections in {type(model).__name__} (looked for "
                         f"{', '.join('/'.join(ROLES[r]) for r in ('query', 'key', 'value', 'output'))}, and "
                         "GPT-2's attn.c_attn)")
    attention = ("qkv", "output") if found["qkv"] else ("query", "key", "value", "output")
    if found["qkv"] and found["query"]:
        raise ValueError(f"tensor parallelism: {type(model).__name__} has both fused (c_attn) and separate "
                         "(q_proj) query projections")
    for group, roles in (("attention", attention), ("MLP", ("up", "down"))):
        counts = {r: len(found[r]) for r in roles}
        if len(set(counts.values())) != 1:
            raise ValueError(f"tensor parallelism: the {group} projections do not come in sets: "
                             + ", ".join(f"{n} {'/'.join(ROLES.get(r, ('c_attn',)))}" for r, n in counts.items()))
    if found["gate"] and len(found["gate"]) != len(found["up"]):
        raise ValueError(f"tensor parallelism: {len(found['gate'])} gate projections for {len(found['up'])} up ones")
    return found


def _features(m: nn.Module) -> tuple[int, int]:
    """(input, output) features of an nn.Linear or a GPT-2 Conv1D (weight ``[in, out]``)."""
    return (m.nx, m.nf) if is_conv1d(m) else (m.in_features, m.out_features)


def _config_int(config: Any, *names: str) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _sizes(model: nn.Module, found: Mapping[str, list[str]], embedding: nn.Module | None) -> Sizes:
    """The sizes from the model's config (Hugging Face) or its attention modules' attributes, and its layers."""
    mods = dict(model.named_modules())
    first = (found["query"] or found["qkv"])[0]
    attention = mods[_parent(first)]
    config = getattr(model, "config", None)
    heads = _config_int(config, "num_attention_heads", "n_head") or _config_int(attention, "num_heads", "n_heads")
    kv = (_config_int(config, "num_key_value_heads") or _config_int(attention, "num_key_value_heads", "n_kv_heads")
          or heads)
    if heads is None:
        raise ValueError(f"tensor parallelism: cannot tell the number of attention heads of {type(model).__name__} "
                         "(no config.num_attention_heads, no num_heads/n_heads on its attention modules)")
    hidden = _config_int(config, "hidden_size", "n_embd", "dim") or _features(mods[first])[0]
    up = _features(mods[found["up"][0]])[1] if found["up"] else 0
    vocab = embedding.num_embeddings if isinstance(embedding, nn.Embedding) else (_config_int(config, "vocab_size")
                                                                                   or 0)
    return Sizes(heads, kv, hidden, up, vocab)


def _named(model: nn.Module, getter: str, names: tuple[str, ...]) -> str | None:
    """The path of the model's input embedding (output head): its ``getter`` if it has one, else by name."""
    paths = {m: p for p, m in model.named_modules()}
    get = getattr(model, getter, None)
    if callable(get):
        try:
            m = get()
        except (NotImplementedError, AttributeError):
            m = None
        if m is not None and m in paths:
            return paths[m]
    return next((p for p in paths.values() if _leaf(p) in names), None)


def plan_model(model: nn.Module, tp: int, *, sequence_parallel: bool = False, loss_parallel: bool = False,
               sequence: int | None = None) -> TensorPlan:
    """The Megatron split of ``model`` over ``tp`` ranks (module docstring); a ``ValueError`` (one line) for a
    model it cannot split or whose sizes ``tp`` does not divide (``sequence``: the length, checked under
    sequence parallelism)."""
    found = _find_roles(model)
    mods = dict(model.named_modules())
    embedding = _named(model, "get_input_embeddings", ("embed_tokens", "tok_embeddings"))
    head = _named(model, "get_output_embeddings", ("lm_head", "output"))
    if head is not None and not isinstance(mods[head], nn.Linear):
        raise ValueError(f"tensor parallelism: the head {head} is a {type(mods[head]).__name__}, not an nn.Linear")
    sizes = _sizes(model, found, mods.get(embedding) if embedding else None)
    check_sizes(sizes, tp, sequence if sequence_parallel else None)
    colwise = tuple(p for p in mods if _role(p, found) in _COLWISE)
    rowwise = tuple(p for p in mods if _role(p, found) in _ROWWISE)
    attention = tuple(_parent(p) for p in found["query"] or found["qkv"])
    mlp = tuple(_parent(p) for p in found["up"])
    blocks = {_parent(a) for a in attention}
    norms = [p for p in mods if _leaf(p) in _BLOCK_NORMS and _parent(p) in blocks]
    norms += [p for p in mods if _leaf(p) in _FINAL_NORMS and not any(p.startswith(b + ".") for b in blocks)][:1]
    if loss_parallel and head is None:
        raise ValueError("tensor parallelism: a vocabulary-parallel loss needs the model's LM head (lm_head)")
    conv1d = tuple(p for p in colwise + rowwise if is_conv1d(mods[p]))
    return TensorPlan(tp, sizes, colwise, rowwise, attention, mlp, tuple(norms), embedding, head,
                      sequence_parallel, loss_parallel, fused=tuple(found["qkv"]), conv1d=conv1d,
                      sequence_scatter=_sequence_scatter(mods, embedding))


def _sequence_scatter(mods: Mapping[str, nn.Module], embedding: str | None) -> str | None:
    """GPT-2's embedding dropout (``drop`` beside the token embedding), where the model adds learned positions
    (``wpe`` beside it) before it: the hidden state is split over the sequence after it (sequence
    parallelism); None for a model without learned positions."""
    if embedding is None or not isinstance(mods.get(_sibling(embedding, "wpe")), nn.Embedding):
        return None
    drop = _sibling(embedding, "drop")
    if drop not in mods:
        raise ValueError(f"tensor parallelism: {embedding} has learned positions beside it but no dropout "
                         f"{drop} to split the hidden state over the sequence after them")
    return drop


def _sibling(path: str, name: str) -> str:
    return f"{_parent(path)}.{name}" if "." in path else name


def _role(path: str, found: Mapping[str, list[str]]) -> str | None:
    return next((r for r, paths in found.items() if path in paths), None)
