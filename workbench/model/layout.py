"""A parallel layout: how the GPUs of one training job split it (docs/model.md, "Layouts").

A :class:`Layout` is tensor-parallel degree ``tp`` x pipeline degree ``pp`` x data-parallel degree ``dp``
(their product is the number of GPUs), the data-parallel sharding ``zero`` (0: DDP, gradients all-reduced;
1: optimizer state sharded over the ``dp`` group; 2: and gradients; 3: FSDP, parameters too, all-gathered
per layer), the micro-batch size, the micro-batches per optimizer step of each pipeline, the pipeline
schedule (a method of :mod:`workbench.methods`) with its stages per rank (``chunks``), and two choices of
tensor parallelism (``tp > 1`` only): sequence parallelism (``sp``: the norms and dropouts on ``sequence / tp``
positions, Megatron's ``--sequence-parallel``) and the vocabulary-parallel loss (``lp``: the logits kept split
over the vocabulary for the cross-entropy, as Megatron always computes it and torchtitan's ``loss_parallel``;
off by default, the logits gathered on every rank), and the communication overlap (``tpo``: sequence parallelism's
all-gathers and reduce-scatters pipelined with the GEMMs they feed and drain, Megatron's ``--tp-comm-overlap`` and
torch's async TP; needs ``sp``; off by default, as torch eager runs: :mod:`workbench.parallel.tensor.overlap`),
and, for ZeRO-1 only, the data-parallel overlap (``dpo``: ZeRO-1 as Megatron-Core's distributed optimizer runs it,
``--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather``: gradients reduce-scattered in buckets
behind the backward, parameters all-gathered behind the next step's forward; off by default, ZeRO-1 as torch's
DDP + ZeroRedundancyOptimizer runs it: :mod:`workbench.parallel.data.time`).
Today's pipeline plans are the layout ``tp=1, dp=1``.

Ranks are numbered as torchtitan's device mesh ``["pp", "dp", "tp"]`` numbers them: ``tp`` innermost (a
tensor-parallel group is ``tp`` consecutive ranks, so it sits in one node), then ``dp``, then ``pp``:

>>> lay = Layout.parse("tp=4,pp=8,dp=2,zero=1")
>>> lay.devices, lay.describe()
(64, 'TP 4 x PP 8 x DP 2, ZeRO-1')
>>> lay.coords(13), lay.rank(pp=1, dp=1, tp=1)
((1, 1, 1), 13)
>>> lay.group("tp", 13), lay.group("dp", 13), lay.group("pp", 13)[:3]
((12, 13, 14, 15), (9, 13), (5, 13, 21))
>>> lay.spans_nodes("dp", devices_per_node=8), lay.spans_nodes("tp", devices_per_node=8)
(False, False)
>>> Layout.parse("tp=3,pp=1,dp=1").check(devices=4)
Traceback (most recent call last):
ValueError: layout tp=3 x pp=1 x dp=1 uses 3 GPUs, not the 4 of --devices
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

__all__ = ["Layout", "DIMENSIONS", "ZERO_LEVELS", "LAYOUT_KEYS", "every_rank_json", "pipeline_json"]

#: the mesh's dimensions, outermost first (torchtitan's order: a ``tp`` group is consecutive ranks)
DIMENSIONS = ("pp", "dp", "tp")
#: ZeRO sharding of the data-parallel group: 0 DDP, 1 optimizer state, 2 and gradients, 3 and parameters (FSDP)
ZERO_LEVELS = (0, 1, 2, 3)
#: ``Layout.parse`` keys: short names users type, and the field each sets
_KEYS = {"tp": "tp", "pp": "pp", "dp": "dp", "zero": "zero", "mbs": "micro_batch_size",
         "micro_batch_size": "micro_batch_size", "mb": "micro_batches", "micro_batches": "micro_batches",
         "schedule": "schedule", "method": "schedule", "chunks": "chunks", "vp": "chunks", "sp": "sequence_parallel",
         "sequence_parallel": "sequence_parallel", "lp": "loss_parallel", "loss_parallel": "loss_parallel",
         "tpo": "tp_overlap", "tp_overlap": "tp_overlap", "dpo": "dp_overlap", "dp_overlap": "dp_overlap"}
#: the on/off choices of tensor parallelism: field and the short key users type
_SWITCHES = {"sequence_parallel": "sp", "loss_parallel": "lp", "tp_overlap": "tpo"}
#: every on/off choice (the data-parallel overlap besides tensor parallelism's)
_BOOLS = {**_SWITCHES, "dp_overlap": "dpo"}
_INTS = ("tp", "pp", "dp", "zero", "micro_batch_size", "micro_batches", "chunks")


@dataclass(frozen=True)
class Layout:
    """tp x pp x dp GPUs, ZeRO sharding, micro-batching and the pipeline schedule (see the module docstring).

    ``micro_batch_size`` (samples per micro-batch) and ``micro_batches`` (per optimizer step, per pipeline)
    are ``None`` where the planner chooses them; ``schedule`` ``None`` likewise.

    >>> Layout(tp=2, dp=4, zero=3, micro_batch_size=2, micro_batches=8).global_batch
    64
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    micro_batch_size: int | None = None
    micro_batches: int | None = None
    schedule: str | None = None
    chunks: int = 1
    sequence_parallel: bool = False
    loss_parallel: bool = False
    tp_overlap: bool = False
    dp_overlap: bool = False

    def __post_init__(self) -> None:
        for name in _INTS:
            value = getattr(self, name)
            if value is None and name in ("micro_batch_size", "micro_batches"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "zero" else 1):
                low = "0" if name == "zero" else "1"
                raise ValueError(f"layout: {name} must be a whole number >= {low}, got {value!r}")
        if self.zero not in ZERO_LEVELS:
            raise ValueError(f"layout: zero must be one of 0, 1, 2, 3 (0 DDP ... 3 FSDP), got {self.zero}")
        for name, short in _BOOLS.items():
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"layout: {name} must be true or false, got {value!r}")
            if value and self.tp == 1 and name in _SWITCHES:
                raise ValueError(f"layout: {short}=1 ({name.replace('_', ' ')}) splits over the tensor-parallel "
                                 "group, but tp=1")
        if self.tp_overlap and not self.sequence_parallel:
            raise ValueError("layout: tpo=1 overlaps sequence parallelism's all-gathers and reduce-scatters with their "
                             "GEMMs: it needs sp=1 (Megatron's --tp-comm-overlap asserts the same)")
        if self.dp_overlap and self.zero != 1:
            raise ValueError(f"layout: dpo=1 is ZeRO-1 as Megatron's distributed optimizer overlaps it (reduce-scatter "
                             f"behind the backward, all-gather behind the next forward): it needs zero=1, not "
                             f"zero={self.zero}")

    @property
    def devices(self) -> int:
        """GPUs the layout uses: tp x pp x dp."""
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step: micro-batch size x micro-batches x dp (None while either is open)."""
        if self.micro_batch_size is None or self.micro_batches is None:
            return None
        return self.micro_batch_size * self.micro_batches * self.dp

    def degree(self, dim: str) -> int:
        """The degree of mesh dimension ``dim`` (``"pp"``, ``"dp"`` or ``"tp"``)."""
        if dim not in DIMENSIONS:
            raise ValueError(f"unknown layout dimension {dim!r}; known: {', '.join(DIMENSIONS)}")
        return int(getattr(self, dim))

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) coordinates of ``rank`` in the mesh."""
        if not 0 <= rank < self.devices:
            raise ValueError(f"rank {rank} is outside the layout's {self.devices} GPUs")
        return rank // (self.dp * self.tp), rank // self.tp % self.dp, rank % self.tp

    def rank(self, pp: int = 0, dp: int = 0, tp: int = 0) -> int:
        """The rank at mesh coordinates (pp, dp, tp)."""
        for name, value in (("pp", pp), ("dp", dp), ("tp", tp)):
            if not 0 <= value < self.degree(name):
                raise ValueError(f"{name} coordinate {value} is outside 0..{self.degree(name) - 1}")
        return (pp * self.dp + dp) * self.tp + tp

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``dim`` (the ranks that differ from it in that coordinate only)."""
        at = dict(zip(DIMENSIONS, self.coords(rank)))
        return tuple(self.rank(**{**at, dim: i}) for i in range(self.degree(dim)))

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """Every group along ``dim``, each once, in rank order."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.devices):
            seen.setdefault(self.group(dim, r), None)
        return list(seen)

    def spans_nodes(self, dim: str, devices_per_node: int | None) -> bool:
        """Whether a group along ``dim`` holds ranks of two nodes (nodes of ``devices_per_node`` consecutive
        ranks; None: one node)."""
        if devices_per_node is None:
            return False
        return any(len({r // devices_per_node for r in g}) > 1 for g in self.groups(dim))

    def check(self, devices: int | None = None, devices_per_node: int | None = None) -> "Layout":
        """The layout itself when it fits ``devices`` GPUs in nodes of ``devices_per_node``; a ``ValueError``
        naming the values otherwise (tp x pp x dp must be the GPU count, a tp group must fit in a node)."""
        if devices is not None and self.devices != devices:
            raise ValueError(f"layout tp={self.tp} x pp={self.pp} x dp={self.dp} uses {self.devices} GPUs, "
                             f"not the {devices} of --devices")
        if devices_per_node is not None and (self.tp > devices_per_node or devices_per_node % self.tp):
            raise ValueError(f"layout: tp={self.tp} must divide the {devices_per_node} GPUs of a node "
                             "(tensor parallelism stays within a node)")
        if self.dp == 1 and self.zero:
            raise ValueError(f"layout: zero={self.zero} shards over the data-parallel group, but dp=1")
        return self

    def describe(self) -> str:
        """``'TP 4 x PP 8 x DP 2, ZeRO-1'``; sequence parallelism (``SP``), the vocabulary-parallel loss
        (``LP``), the communication overlaps (``TPO``, ``DPO``), the schedule, virtual stages and micro-batching
        when set.

        >>> Layout.parse("tp=2,dp=2,sp=1,lp=1").describe(), Layout.parse("tp=2,sp=1,tpo=1").describe()
        ('TP 2 x PP 1 x DP 2, DDP, SP, LP', 'TP 2 x PP 1 x DP 1, SP, TPO')
        >>> Layout.parse("dp=4,zero=1,dpo=1").describe()
        'TP 1 x PP 1 x DP 4, ZeRO-1, DPO'
        """
        text = f"TP {self.tp} x PP {self.pp} x DP {self.dp}"
        if self.dp > 1:
            text += {0: ", DDP", 3: ", FSDP"}.get(self.zero, f", ZeRO-{self.zero}")
        text += ", SP" * self.sequence_parallel + ", LP" * self.loss_parallel + ", TPO" * self.tp_overlap
        text += ", DPO" * self.dp_overlap
        if self.schedule:
            text += f", {self.schedule}" + (f" x{self.chunks}" if self.chunks > 1 else "")
        if self.micro_batch_size is not None:
            text += f", micro-batch {self.micro_batch_size}"
        if self.micro_batches is not None:
            text += f" x {self.micro_batches}"
        return text

    def with_(self, **kw: Any) -> "Layout":
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's ``"parallel"`` object (docs/model.md, "JSON"); ``tp_overlap`` and ``dp_overlap`` only
        when on (a plan without them reads as off: plans written before them load, and stay as they were)."""
        out = asdict(self)
        for name in ("tp_overlap", "dp_overlap"):
            if not out[name]:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "parallel") -> "Layout":
        """A layout from the plan JSON's ``"parallel"`` object; unknown keys are refused naming them."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected an object with tp, pp, dp, zero, got {type(d).__name__}")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: "
                             f"{', '.join(cls.__dataclass_fields__)}")
        schedule = d.get("schedule")
        if schedule is not None:
            from workbench.methods import METHODS

            names = [m.name for m in METHODS]
            if schedule not in names:
                raise ValueError(f"{where}: schedule {schedule!r} is not a method; one of {', '.join(names)}")
        try:
            return cls(**dict(d))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """A layout from ``"tp=4,pp=8,dp=2,zero=1"`` (also ``mbs=``, ``mb=``, ``schedule=``, ``chunks=``,
        ``sp=``, ``lp=``, ``tpo=``, ``dpo=``); a missing degree is 1.

        >>> Layout.parse("tp=2, dp=4, zero=3, mbs=1, sp=1")
        Layout(tp=2, pp=1, dp=4, zero=3, micro_batch_size=1, micro_batches=None, schedule=None, chunks=1, \
sequence_parallel=True, loss_parallel=False, tp_overlap=False, dp_overlap=False)
        >>> Layout.parse("tp=2,pp=two")
        Traceback (most recent call last):
        ValueError: --parallel tp=2,pp=two: pp must be a whole number, got 'two'
        """
        fields: dict[str, Any] = {}
        if not str(text).strip():
            raise ValueError(f"--parallel {text!r} is empty: give auto or tp=T,pp=P,dp=D[,zero=Z]")
        for part in (p.strip() for p in str(text).split(",")):
            if not part:
                raise ValueError(f"--parallel {text}: an empty item (two commas, or a comma at an end)")
            key, sep, value = (s.strip() for s in part.partition("="))
            if not sep or key.lower() not in _KEYS:
                raise ValueError(f"--parallel {text}: {part!r} is not KEY=VALUE with KEY one of "
                                 f"tp, pp, dp, zero, mbs, mb, schedule, chunks, sp, lp, tpo, dpo")
            name = _KEYS[key.lower()]
            if name in fields:
                raise ValueError(f"--parallel {text}: {key} is given twice")
            fields[name] = _value(name, value, text)
        try:
            return cls(**fields)
        except ValueError as e:
            raise ValueError(f"--parallel {text}: {e}") from None


def _value(name: str, value: str, text: str) -> Any:
    """One ``--parallel`` value as its field's type."""
    if name == "schedule":
        return value
    if name in _BOOLS:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"--parallel {text}: {_BOOLS[name]} must be 0 or 1, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--parallel {text}: {name.replace('micro_batch_size', 'mbs')} must be a whole number, "
                         f"got {value!r}") from None


#: the top-level keys of a layout's plan (docs/model.md, "Layouts"), kept in ``Plan.parallel``
LAYOUT_KEYS = ("parallel", "global_batch", "tokens_per_sample", "sequence_length", "step_seconds", "tokens_per_second",
               "tokens_per_second_per_gpu", "mfu", "mfu_convention", "step_breakdown", "pipeline_memory",
               "frontier", "search")


def every_rank_json(parallel: Mapping[str, Any], pipeline_memory: list[float]) -> dict[str, Any]:
    """A layout plan's top-level keys (``Plan.parallel``), with ``devices`` every GPU and ``memory`` every rank's
    peak, in the layout's rank order (tp innermost, then dp, then pp); ``pipeline_memory`` the pipeline ranks'.

    >>> out = every_rank_json({"parallel": {"tp": 2, "pp": 2}}, [10.0, 20.0])
    >>> out["devices"], out["memory"], out["pipeline_memory"]
    (4, [10.0, 10.0, 20.0, 20.0], [10.0, 20.0])
    """
    layout = Layout.from_dict(parallel["parallel"])
    out = dict(parallel)
    out["pipeline_memory"] = list(pipeline_memory)
    out["devices"] = layout.devices
    if pipeline_memory:
        out["memory"] = [pipeline_memory[layout.coords(r)[0]] for r in range(layout.devices)]
    return out


def pipeline_json(d: dict[str, Any], devices: int) -> dict[str, Any]:
    """A layout plan's JSON object (``devices`` its whole number of devices) read as its pipeline's: ``devices``
    the layout's ``pp``, ``memory`` per pipeline rank (``pipeline_memory``, or the per-rank list at ranks
    (p, 0, 0)). A plan that already counts its pipeline's ranks in ``devices`` (and ``memory``) is read as it is.

    >>> pipeline_json({"parallel": {"tp": 2, "pp": 2}, "devices": 4, "memory": [1, 1, 2, 2]}, 4)["memory"]
    [1, 2]
    """
    layout = Layout.from_dict(d["parallel"])
    if devices == layout.pp and "pipeline_memory" not in d:
        return d
    if devices != layout.devices:
        raise ValueError(f"devices: {devices} is neither the layout's {layout.devices} GPUs "
                         f"(tp={layout.tp} x pp={layout.pp} x dp={layout.dp}) nor its pipeline's {layout.pp}")
    d = dict(d)
    ranks = d.get("memory", [])
    if "pipeline_memory" in d:
        d["memory"] = d["pipeline_memory"]
    elif isinstance(ranks, list) and len(ranks) == layout.devices:
        d["memory"] = [ranks[layout.rank(pp=p)] for p in range(layout.pp)]
    d["devices"] = layout.pp
    return d
