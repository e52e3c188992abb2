"""The one registry of planning methods: every method's name, label, colour, family and capabilities.

Everything that lists methods reads this module: :mod:`workbench.planners`
(``METHODS``, ``GENERAL_METHODS``, ``AUTO_METHODS``, dispatch), the CLI's
``--method`` help and checks, the demo, the explorer, the experiments (their
method keys, labels, line styles and checks) and the figures. No other module
names a set of methods. It imports nothing from the package, so any module may
read it.

A :class:`Method` names a planner: ``fn(chain, platform, *, allocation,
time_limit, **options) -> Plan`` (docs/model.md, "Plan"), imported by name in
:data:`workbench.planners.PLANNERS`. Its *family* is ``periodic`` (one forward and one
backward of different mini-batches per device per period, weight stashing) or
``flushed`` (GPipe, 1F1B and torch's multi-stage schedules: micro-batches, then a flush; its name
is also the plan's ``schedule``). ``torch_schedule`` marks torch's schedules
(:mod:`workbench.schedules.torch_orders`: several stages per device, ``--chunks``).
A :class:`Variant` is a method run with one allocation,
as the experiments compare them (``ilp-general``, ``ilp-contiguous``, ``dp``,
...), with the label and line style of the sweeps' figures. :data:`LINEUPS`
names the methods each study runs.

>>> [m.name for m in METHODS][:3]
['dp', 'pipedream', 'mcap']
>>> method("ilp").allocations, method("ilp").exact, method("gpipe").family
(('contiguous', 'general'), True, 'flushed')
>>> variant("ilp", "general").key, variant("ilp", "general").label
('ilp-general', 'general ILP')
>>> [m.name for m in METHODS if m.auto_activations]
['dp', 'brute', 'ilp']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Method", "Variant", "LineStyle", "METHODS", "VARIANTS", "LINEUPS", "method", "variant", "names",
           "flushed", "lineup", "colour_of"]

Family = Literal["periodic", "flushed"]


@dataclass(frozen=True)
class Method:
    """One planning method and what it can do.

    ``allocations``: the allocations it plans (docs/model.md, "Plan");
    ``memory_aware``: it chooses its partition under the memory limit (the
    others partition without it and the schedule on top fits what it can);
    ``exact``: an ``optimal`` plan is the best of every plan it searches;
    ``auto_activations``: it chooses every layer's activation policy itself
    (``activations="auto"``); ``baseline``: a periodic method the exact
    methods are checked against (the experiments' checks, the ILP acceptance
    benchmark; ``mcap`` came after those checks and is not among them);
    ``slow``: it may take seconds to minutes (the explorer shows a progress
    bar and streams its log); ``blocks``: the explorer plans a long chain on
    blocks of layers with it (the ILP coarsens by itself, flushed schedules
    simulate); ``warm_start``: it takes ``warm_start=plan`` (a plan to start
    from, :func:`workbench.planners.sweep.sweep`); ``aliases``: other names
    its results carry in peer data. torch's multi-stage schedules, planned as a partition into P x V
    stages under torch's own order (:mod:`workbench.schedules.torch_orders`, :mod:`workbench.planners.torch_schedules`):
    ``torch_class`` (its class in ``torch.distributed.pipelining.schedules``), ``layout`` (``loop``: stage s
    on device s mod P; ``v``: s, then 2P - 1 - s), ``split_backward`` (it runs I and W apart) and
    ``fixed_chunks`` (the stages per device it requires; None: any, ``--chunks``). The flushed schedules the
    workbench orders itself (:mod:`workbench.schedules.registry`) say how many forwards a stage runs before its
    first backward, ``warmup``: ``all`` (GPipe: every micro-batch of the flush) or ``downstream`` (1F1B:
    min(m, S - 1 - s), one per stage after it), then one forward and one backward in turn; torch runs them
    with its single-stage class ``single_stage_class`` when a rank holds one stage. Exported to a framework
    (:mod:`workbench.parallel.export`): ``torchtitan_name`` (the name torch's ``get_schedule_class``, and so
    torchtitan's ``pipeline_parallel_schedule``, gives the same class) and ``megatron_closest`` (the method
    Megatron-LM runs instead of one it lacks; empty: Megatron runs it).
    """

    name: str
    label: str
    short: str
    colour: str
    family: Family
    allocations: tuple[str, ...] = ("contiguous",)
    memory_aware: bool = False
    exact: bool = False
    auto_activations: bool = False
    baseline: bool = False
    slow: bool = False
    blocks: bool = False
    warm_start: bool = False
    aliases: tuple[str, ...] = ()
    torch_class: str = ""
    layout: str = ""
    split_backward: bool = False
    fixed_chunks: int | None = None
    warmup: str = ""
    single_stage_class: str = ""
    torchtitan_name: str = ""
    megatron_closest: str = ""

    @property
    def torch_schedule(self) -> bool:
        """One of torch's multi-stage schedules (``torch_class`` names it)."""
        return bool(self.torch_class)


@dataclass(frozen=True)
class LineStyle:
    """How a variant's line is drawn in the sweeps' figures (plotly dash, width, marker symbol and size)."""

    dash: str = "solid"
    width: float = 2.0
    marker: str = "circle"
    size: int = 8


@dataclass(frozen=True)
class Variant:
    """A method with one allocation, as the experiments run and draw it.

    ``label``/``short``/``colour`` default to the method's; ``layer`` orders
    the lines bottom to top (where methods coincide the one drawn first shows
    as a wider line and a larger marker around the next); ``legend_note`` is
    appended to its legend entry.
    """

    key: str
    method: str
    allocation: str
    style: LineStyle
    layer: int
    label: str = ""
    short: str = ""
    colour: str = ""
    legend_note: str = ""

    def __post_init__(self) -> None:
        m = method(self.method)
        for field_ in ("label", "short", "colour"):
            if not getattr(self, field_):
                object.__setattr__(self, field_, getattr(m, field_))


#: every method, in the order the CLI and the tables list them
METHODS: tuple[Method, ...] = (
    Method("dp", "memory-aware DP", "dp", "#3366CC", "periodic",
           memory_aware=True, exact=True, auto_activations=True, baseline=True, blocks=True, aliases=("madpipe",)),
    Method("pipedream", "PipeDream", "PipeDream", "#F28E2B", "periodic",
           memory_aware=True, baseline=True, blocks=True),
    Method("mcap", "mCAP (memory-balanced)", "mCAP", "#8C564B", "periodic"),
    Method("uniform", "uniform (DeepSpeed)", "uniform", "#9C755F", "periodic", baseline=True, blocks=True),
    Method("parameters", "parameters (DeepSpeed)", "parameters", "#76B7B2", "periodic", baseline=True, blocks=True),
    Method("torchgpipe", "torchgpipe balance", "torchgpipe", "#EDC948", "periodic", baseline=True, blocks=True),
    Method("gpipe", "GPipe", "GPipe", "#59A14F", "flushed", warmup="all", single_stage_class="ScheduleGPipe",
           torchtitan_name="GPipe", megatron_closest="1f1b"),
    Method("1f1b", "1F1B-flush", "1F1B", "#B07AA1", "flushed", warmup="downstream", single_stage_class="Schedule1F1B",
           torchtitan_name="1F1B"),
    Method("interleaved-1f1b", "Interleaved 1F1B (torch)", "Interleaved", "#E377C2", "flushed",
           torch_class="ScheduleInterleaved1F1B", layout="loop", torchtitan_name="Interleaved1F1B"),
    Method("looped-bfs", "Looped BFS (torch)", "LoopedBFS", "#7F7F7F", "flushed",
           torch_class="ScheduleLoopedBFS", layout="loop", torchtitan_name="LoopedBFS",
           megatron_closest="interleaved-1f1b"),
    Method("interleaved-zb", "Interleaved zero bubble (torch)", "ZB", "#BCBD22", "flushed",
           torch_class="ScheduleInterleavedZeroBubble", layout="loop", split_backward=True,
           torchtitan_name="InterleavedZeroBubble", megatron_closest="interleaved-1f1b"),
    Method("zbv", "ZB-V (torch)", "ZB-V", "#1F77B4", "flushed",
           torch_class="ScheduleZBVZeroBubble", layout="v", split_backward=True, fixed_chunks=2,
           torchtitan_name="ZBVZeroBubble", megatron_closest="interleaved-1f1b"),
    Method("dualpipev", "DualPipeV (torch)", "DualPipeV", "#9467BD", "flushed",
           torch_class="ScheduleDualPipeV", layout="v", split_backward=True, fixed_chunks=2,
           torchtitan_name="DualPipeV", megatron_closest="interleaved-1f1b"),
    Method("brute", "brute force", "brute", "#000000", "periodic",
           allocations=("contiguous", "general"), memory_aware=True, exact=True, auto_activations=True, slow=True,
           blocks=True),
    Method("ilp", "ILP", "ILP", "#D62728", "periodic",
           allocations=("contiguous", "general"), memory_aware=True, exact=True, auto_activations=True, slow=True,
           warm_start=True),
)
_BY_NAME = {m.name: m for m in METHODS}


def method(name: str) -> Method:
    """The method called ``name``; a clear ``ValueError`` naming the choices otherwise.

    >>> method("nosuch")
    Traceback (most recent call last):
    ...
    ValueError: unknown method 'nosuch'; choose one of 1f1b, brute, dp, dualpipev, gpipe, ilp, interleaved-1f1b,
    interleaved-zb, looped-bfs, mcap, parameters, pipedream, torchgpipe, uniform, zbv
    """
    if name not in _BY_NAME:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[name]


def names(**capabilities: Any) -> tuple[str, ...]:
    """Names of the methods whose fields equal ``capabilities``, in registry order.

    >>> names(family="flushed")[:2], names(slow=True), names(torch_schedule=True)[-1]
    (('gpipe', '1f1b'), ('brute', 'ilp'), 'dualpipev')
    """
    return tuple(m.name for m in METHODS if all(getattr(m, k) == v for k, v in capabilities.items()))


def flushed(schedule: str) -> bool:
    """True when a plan's ``schedule`` is a flushed one (the name of a flushed method).

    >>> flushed("1f1b"), flushed("periodic")
    (True, False)
    """
    return schedule in _BY_NAME and _BY_NAME[schedule].family == "flushed"


#: the experiments' sweep variants, in legend order (their keys are the experiments' method keys)
VARIANTS: tuple[Variant, ...] = (
    Variant("ilp-general", "ilp", "general", LineStyle("solid", 1.8, "circle", 6), 11, "general ILP", "general ILP"),
    Variant("ilp-contiguous", "ilp", "contiguous", LineStyle("dash", 2.0, "square-open", 12), 10, "contiguous ILP",
            "contiguous ILP", "#17BECF", legend_note=" (dashed: equals the DP where both are optimal)"),
    Variant("dp", "dp", "contiguous", LineStyle("solid", 3.5, "diamond", 11), 9),
    # lighter than the method's colour: drawn wide beneath the DP
    Variant("pipedream", "pipedream", "contiguous", LineStyle("solid", 7.0, "triangle-up", 15), 7, colour="#F5B87A"),
    Variant("mcap", "mcap", "contiguous", LineStyle("solid", 2.5, "triangle-down", 10), 8),
    Variant("gpipe", "gpipe", "contiguous", LineStyle("dot", 2.0, "x", 9), 0),
    Variant("1f1b", "1f1b", "contiguous", LineStyle("dot", 2.0, "cross", 9), 1),
    Variant("interleaved-1f1b", "interleaved-1f1b", "contiguous", LineStyle("dashdot", 2.0, "star", 10), 3),
    Variant("looped-bfs", "looped-bfs", "contiguous", LineStyle("dot", 1.5, "hexagon-open", 9), 2),
    Variant("interleaved-zb", "interleaved-zb", "contiguous", LineStyle("dashdot", 2.0, "pentagon", 9), 4),
    Variant("zbv", "zbv", "contiguous", LineStyle("longdash", 2.0, "triangle-left", 10), 5),
    Variant("dualpipev", "dualpipev", "contiguous", LineStyle("longdashdot", 2.0, "triangle-right", 10), 6),
)


def variant(method_name: str, allocation: str = "contiguous") -> Variant:
    """The sweep variant of ``method_name`` with ``allocation`` (a ``KeyError`` if the sweeps do not run it)."""
    for v in VARIANTS:
        if v.method == method_name and v.allocation == allocation:
            return v
    raise KeyError(f"no sweep variant of {method_name!r} with {allocation} allocation")


#: the (method, allocation) pairs each study runs, in the order its tables list them
LINEUPS: dict[str, tuple[tuple[str, str], ...]] = {
    # make demo: one plan per method on every bundled profile
    "demo": (("dp", "contiguous"), ("pipedream", "contiguous"), ("uniform", "contiguous"), ("1f1b", "contiguous"),
             ("gpipe", "contiguous"), ("interleaved-1f1b", "contiguous"), ("interleaved-zb", "contiguous"),
             ("zbv", "contiguous"), ("dualpipev", "contiguous")),
    # the complexity study: solve time against layers and devices
    "scaling": (("dp", "contiguous"), ("ilp", "contiguous"), ("ilp", "general")),
    # the family where general allocations win by a factor k
    "family": (("dp", "contiguous"), ("ilp", "contiguous"), ("ilp", "general"), ("brute", "general")),
    # 3-PARTITION instances: which planners decide them
    "three_partition": (("brute", "general"), ("ilp", "general")),
    # the largest GPT each method fits (each with every layer kept, and with policies chosen per layer)
    "largest": (("pipedream", "contiguous"), ("mcap", "contiguous"), ("dp", "contiguous"), ("ilp", "general")),
}


def lineup(study: str) -> tuple[tuple[str, str], ...]:
    """The (method, allocation) pairs ``study`` runs (:data:`LINEUPS`).

    >>> lineup("scaling")[0]
    ('dp', 'contiguous')
    """
    if study not in LINEUPS:
        raise ValueError(f"unknown study {study!r}; choose one of {', '.join(LINEUPS)}")
    return LINEUPS[study]


def colour_of(name: str, default: str | None = None) -> str | None:
    """The colour of a method, a method's alias or a variant key; ``default`` for anything else.

    >>> colour_of("madpipe") == colour_of("dp"), colour_of("ilp-contiguous")
    (True, '#17BECF')
    """
    for v in VARIANTS:
        if v.key == name and v.key not in _BY_NAME:
            return v.colour
    for m in METHODS:
        if name == m.name or name in m.aliases:
            return m.colour
    return default
