"""The layout search: every way to split a job over its GPUs, bounded, evaluated, the fastest that fits
(docs/model.md, "Layouts").

:func:`candidates` enumerates the layouts of a job: every factorisation ``tp x pp x dp`` of the GPUs with ``tp``
dividing a node (``tp > 1`` where the workbench has tensor-parallel profiles; for ``tp > 1`` sequence
parallelism and the vocabulary-parallel loss each off and on, every one of the four its own per-rank chain, unless
the call pins them or the chain source takes neither: :data:`SWITCHES`), every ZeRO level (0 alone for
``dp = 1``), every micro-batch size the builder takes that divides the global batch over ``dp``, every schedule
of :data:`SCHEDULES` (one stage: ``1f1b``, which on one stage is every flushed schedule; the seed's periodic plans
for ``tp = dp = 1``: their weight stashing runs on the PipeDream engine, which runs no tensor or data
parallelism), ``chunks`` 2 for the
multi-stage schedules (or the ``--chunks`` given), and the activation policies ``keep`` and ``recompute`` (and
``auto`` for the periodic plans, whose planner chooses per layer).

:func:`search` orders them by a lower bound on their step time and evaluates them best first
(:func:`workbench.parallel.evaluate.evaluate`), skipping a layout whose bound on some rank's memory exceeds the
GPU's (:func:`memory_bound`), whose time bound (:func:`time_bound`) is no better than the fastest layout that
fits so far, or that holds no less memory on every rank than one of the same degrees, schedule and micro-batching
found not to fit (a lower ZeRO level, a policy that keeps more: the model's memory grows with each; for the
memory-aware planners, whose partition changes with the limit, this is assumed). The leanest layout of each
group (the highest ZeRO level, every layer recomputed) is evaluated first. The bounds are bounds
of the model, so a skipped layout is never faster than the answer (``tests/test_search.py`` checks it against
evaluating every layout).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.parallel.evaluate import Job
>>> ch = Chain(tuple(Layer(f"l{i}", 0.01, 0.02, 4e6, 1e6) for i in range(8)), input_bytes=1e6)
>>> job = Job(Target.of(4, memory="1GB", bandwidth="100GB/s"), global_batch=8)
>>> best = search(job, lambda tp, mbs: ch, schedules=("1f1b",))
>>> best.best.layout.describe()
'TP 1 x PP 1 x DP 4, DDP, 1f1b, micro-batch 1 x 2'
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from workbench.methods import method as method_of
from workbench.methods import names
from workbench.model.activations import apply_policies
from workbench.model.layout import Layout
from workbench.model.memory import layer_terms
from workbench.parallel.evaluate import (
    ChainFor,
    Evaluation,
    Job,
    complete_layout,
    evaluate,
    rank_chain,
)

__all__ = ["SCHEDULES", "SWITCHES", "Candidate", "SearchResult", "candidates", "search", "memory_bound", "time_bound",
           "factorisations", "busiest_rank", "bottleneck", "describe_switches"]

#: the schedules a search tries: the seed's periodic plans (``dp``), GPipe, 1F1B and torch's multi-stage ones
SCHEDULES = ("dp",) + names(family="flushed")
#: the settings of sequence parallelism and of the vocabulary-parallel loss a search tries for ``tp > 1``
SWITCHES = (False, True)


@dataclass(frozen=True)
class Candidate:
    """A layout (micro-batching and schedule set) and its activation policy, with its bounds once known."""

    layout: Layout
    activations: str = "keep"
    bound_seconds: float = 0.0
    bound_memory: float = 0.0


@dataclass
class SearchResult:
    """The fastest layout that fits (``best``, None when none does), every evaluation, the candidates skipped
    by a bound (``pruned``: (candidate, why)), and the search's figures."""

    best: Evaluation | None
    evaluated: list[Evaluation]
    pruned: list[tuple[Candidate, str]]
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: the settings searched for ``tp > 1``: {"sequence_parallel": (False, True), "loss_parallel": (False, True)}
    switches: dict[str, tuple[bool, ...]] = field(default_factory=dict)

    def least_memory(self) -> float:
        """What the leanest layout needs on its fullest rank: the least of the evaluated layouts' peaks and of the
        memory bounds of those skipped for it (every other skipped layout holds at least what one of these
        holds)."""
        seen = [e.peak for e in self.evaluated if e.memory] + [c.bound_memory for c, why in self.pruned
                                                                if why == "memory bound"]
        return min(seen) if seen else math.inf


def factorisations(devices: int, devices_per_node: int | None, tps: Iterable[int] | None = None
                   ) -> list[tuple[int, int, int]]:
    """Every (tp, pp, dp) with tp x pp x dp = ``devices`` and tp dividing a node (``tps``: the tp allowed).

    >>> factorisations(8, 8, tps=(1, 2))[:4]
    [(1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1)]
    """
    node = devices_per_node or devices
    out = []
    for tp in range(1, min(node, devices) + 1):
        if node % tp or devices % tp or (tps is not None and tp not in tps):
            continue
        rest = devices // tp
        out += [(tp, pp, rest // pp) for pp in range(1, rest + 1) if rest % pp == 0]
    return out


def _schedules(pp: int, zero: int, layers: int, schedules: Sequence[str], chunks: int | None,
               replicated: bool = False) -> list[tuple[str, int]]:
    """(schedule, chunks) pairs for a pipeline of ``pp`` ranks over ``layers`` layers (``replicated``: tp or dp
    above 1, where the periodic plans' weight stashing does not run)."""
    if pp == 1:
        return [("1f1b", 1)]
    out = []
    for name in schedules:
        m = method_of(name)
        if m.family == "periodic" and (zero >= 2 or replicated):
            continue
        v = m.fixed_chunks or ((chunks or 2) if m.torch_schedule else 1)
        if pp * v <= layers:
            out.append((name, v))
    return out


def candidates(job: Job, layers: int, *, micro_batch_sizes: Sequence[int | None] = (None,),
               schedules: Sequence[str] = SCHEDULES, chunks: int | None = None, tps: Iterable[int] | None = (1,),
               activations: Sequence[str] | None = None, zeros: Sequence[int] = (0, 1, 2, 3),
               degrees: Sequence[tuple[int, int, int]] | None = None, sequence_parallel: Sequence[bool] = SWITCHES,
               loss_parallel: Sequence[bool] = SWITCHES, tp_overlap: bool = False,
               dp_overlap: bool = False) -> list[Candidate]:
    """Every layout of the module docstring for a chain of ``layers`` layers (micro-batches filled in);
    ``degrees``: only these (tp, pp, dp); ``sequence_parallel``, ``loss_parallel``: the settings tried for
    ``tp > 1``; ``tp_overlap``: its layouts with sequence parallelism overlap their collectives; ``dp_overlap``:
    its ZeRO-1 layouts on flushed schedules run as Megatron's overlapped distributed optimizer (``dpo=1``)."""
    out = []
    for tp, pp, dp in factorisations(job.devices, job.platform.devices_per_node, tps):
        if degrees is not None and (tp, pp, dp) not in degrees:
            continue
        switches = [(sp, lp) for sp in sequence_parallel for lp in loss_parallel] if tp > 1 else [(False, False)]
        for zero, (sp, lp) in ((z, s) for z in zeros if dp > 1 or z == 0 for s in switches):
            for mbs in micro_batch_sizes:
                size = mbs or job.micro_batch_size
                if job.global_batch % (dp * size):
                    continue
                for name, v in _schedules(pp, zero, layers, schedules, chunks, replicated=tp * dp > 1):
                    periodic = method_of(name).family == "periodic"
                    for act in activations or (("keep", "auto") if periodic else ("keep", "recompute")):
                        if act == "auto" and not periodic:
                            continue
                        layout = Layout(tp=tp, pp=pp, dp=dp, zero=zero, micro_batch_size=mbs, schedule=name, chunks=v,
                                        sequence_parallel=sp, loss_parallel=lp, tp_overlap=tp_overlap and sp,
                                        dp_overlap=dp_overlap and zero == 1 and not periodic)
                        out.append(Candidate(complete_layout(job, layout), act))
    return out


def _policy_chain(chain, activations: str):
    return apply_policies(chain, "recompute") if activations == "recompute" else chain


def bottleneck(terms, counts: Sequence[int]) -> float:
    """The least largest resident memory of a stage over every split of the chain into ``len(counts)`` contiguous
    stages, stage s holding ``counts[s]`` micro-batches (bisection on the bound, each probe greedy: a stage takes
    as many layers as fit, which leaves the later stages the least to hold)."""
    from workbench.model.memory import stage_memory

    L = len(terms)

    def fits(bound: float) -> bool:
        a = 0
        for k in counts:
            if a == L:
                return True
            b = a
            while b < L and stage_memory(terms, a, b, k) <= bound:
                b += 1
            if b == a:
                return False
            a = b
        return a == L

    lo, hi = 0.0, stage_memory(terms, 0, L - 1, max(counts))
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        if hi - lo <= 1e-4 * hi:
            break
    return lo


def memory_bound(job: Job, candidate: Candidate, chain) -> float:
    """A lower bound on the largest per-rank peak (no plan of the layout holds less on its fullest rank): the
    average over the pipeline's ranks of the static state (parameters, resident gradients, optimizer state as the
    rank's ZeRO level keeps them) and of one micro-batch's activations (none for ``auto``, which may offload
    them), and the least largest resident memory of a stage (:func:`bottleneck`) with the micro-batches each
    stage holds at least: GPipe m, 1F1B min(m, pp - s), torch's schedules what their order holds, periodic
    plans one."""
    layout = candidate.layout
    eff = _policy_chain(chain, candidate.activations)
    t = layer_terms(eff, job.platform.for_layout(layout))
    acts = 0.0 if candidate.activations == "auto" else float(t.act.sum())
    average = (float(t.static.sum()) + acts) / layout.pp
    if candidate.activations == "auto" or layout.pp == 1:
        return average
    m, pp = int(layout.micro_batches or 1), layout.pp
    warmup = method_of(layout.schedule).warmup if layout.schedule else ""
    if warmup == "all":              # GPipe: every micro-batch of the flush
        counts = [m] * pp
    elif warmup == "downstream":     # 1F1B: one per stage after it
        counts = [min(m, pp - s) for s in range(pp)]
    else:
        counts = [1] * (pp * layout.chunks)
    if method_of(layout.schedule or "1f1b").torch_schedule:
        counts = _torch_counts(layout, m)
    return max(average, bottleneck(t, counts))


def _torch_counts(layout: Layout, m: int) -> list[int]:
    """Per stage, the micro-batches torch's order makes it hold at once, read off the order of at most
    max(16, 2 pp) micro-batches (fewer hold no more; 1 where torch refuses that many)."""
    from workbench.schedules.torch_orders import order_counts, torch_order

    S = layout.pp * layout.chunks
    try:
        order = torch_order(layout.schedule, layout.pp, layout.chunks, min(m, max(16, 2 * layout.pp)))
    except ValueError:
        return [1] * S
    return [max(1, k) for k in order_counts(order, S)[0]]


def time_bound(job: Job, candidate: Candidate, chain) -> float:
    """A lower bound on the step time: the pipeline's compute, with C one micro-batch's compute and b a bound on
    the busiest rank's share of it (:func:`busiest_rank`): GPipe and 1F1B the flow-shop bound C + (m - 1) b,
    periodic plans and torch's multi-stage schedules m b (``auto`` as if every layer kept its activations);
    FSDP2 on one stage at least its collectives on the link; plus the optimizer step of the average rank."""
    from workbench.parallel.evaluate import data_parallel_ring, optimizer_seconds

    layout = candidate.layout
    eff = _policy_chain(chain, candidate.activations)
    m, pp = int(layout.micro_batches or 1), layout.pp
    comp = eff.forward + eff.backward
    C = float(comp.sum())
    load = busiest_rank(comp, pp)
    kind = method_of(layout.schedule or "1f1b")
    compute = m * load if (kind.family == "periodic" or kind.torch_schedule) else C + (m - 1) * load
    if pp == 1 and layout.zero >= 2 and layout.dp > 1:
        ring = data_parallel_ring(job, layout)
        W, G = float(eff.weights.sum()), float(sum(_grad_bytes(eff)))
        link = m * ((2 if layout.zero == 3 else 1) * ring("all_gather", W) + ring("reduce_scatter", G))
        compute = max(compute, link)
    return compute + optimizer_seconds(eff, job.platform.for_layout(layout), layout, job,
                                       [list(range(len(eff)))])[0] / pp


def busiest_rank(compute, pp: int) -> float:
    """A lower bound on the busiest pipeline rank's compute per micro-batch, whatever the partition: the
    average C / pp, and for every k, ceil(k / pp) times the k-th largest layer (some rank holds at least
    ceil(k / pp) of the k largest layers).

    >>> busiest_rank([4.0, 4.0, 4.0, 1.0], 2)    # two of the three 4 s layers share a rank
    8.0
    """
    largest = sorted((float(x) for x in compute), reverse=True)
    return max([sum(largest) / pp] + [-(-k // pp) * c for k, c in enumerate(largest, start=1)])


def _grad_bytes(chain) -> list[float]:
    return [float(l.weight_bytes if l.grad_bytes is None else l.grad_bytes) for l in chain.layers]


def _chain_key(lay: Layout) -> tuple:
    """What the chain of one rank of ``lay`` depends on: tp, the micro-batch size and tp's two switches."""
    return lay.tp, lay.micro_batch_size, lay.sequence_parallel, lay.loss_parallel, lay.tp_overlap


def _estimate(c: Candidate, chain) -> float:
    """The order candidates are evaluated in (fastest first, to prune early): the time bound plus the bubble a
    schedule usually leaves, (pp - 1) / v of a micro-batch's compute per rank for the interleaved schedules, half
    that for the zero-bubble and V ones (an estimate, not a bound: pruning uses the bound)."""
    lay = c.layout
    kind = method_of(lay.schedule or "1f1b")
    if not kind.torch_schedule or lay.pp == 1:
        return c.bound_seconds
    eff = _policy_chain(chain, c.activations)
    per_rank = float((eff.forward + eff.backward).sum()) / lay.pp
    bubble = (lay.pp - 1) / lay.chunks * per_rank
    return c.bound_seconds + (bubble / 2 if kind.split_backward else bubble)


#: activation policies by the memory they hold, least first
_POLICY_MEMORY = {"auto": 0, "offload": 0, "recompute": 1, "keep": 2}


def _memory_order(c: Candidate) -> tuple[tuple, tuple[int, int]]:
    """A candidate's group (the degrees, schedule and micro-batching it shares with the layouts it is compared
    with) and its position in memory: it holds no less than another of its group when each coordinate is at
    least the other's (a lower ZeRO level, a policy that keeps more). The micro-batch size is not ordered: a
    larger one holds more per micro-batch but may leave fewer micro-batches, whose gradients accumulate."""
    lay = c.layout
    group = (lay.tp, lay.pp, lay.dp, lay.schedule, lay.chunks, lay.micro_batch_size, lay.sequence_parallel,
             lay.loss_parallel, lay.tp_overlap)
    return group, (-lay.zero, _POLICY_MEMORY.get(c.activations, 2))


def _probe_of(c: Candidate) -> tuple[Layout, str]:
    """The key of the leanest candidate of ``c``'s group: the highest ZeRO level the schedule takes (2 in a
    pipeline, where 3 holds the same), every layer recomputed (periodic plans: ``auto``)."""
    lay = c.layout
    periodic = method_of(lay.schedule or "1f1b").family == "periodic"
    zero = 0 if lay.dp == 1 else (1 if periodic else (3 if lay.pp == 1 else 2))
    return replace(lay, zero=zero, dp_overlap=lay.dp_overlap and zero == 1), ("auto" if periodic else "recompute")


class _Search:
    """The state of one search: the best layout that fits, what was evaluated and skipped, and the layouts
    found not to fit, by group (:func:`_memory_order`)."""

    def __init__(self, job: Job, chain_for: ChainFor, prune: bool, progress: Callable[[str], None] | None,
                 total: int) -> None:
        self.job, self.chain_for, self.prune, self.progress, self.total = job, chain_for, prune, progress, total
        self.best: Evaluation | None = None
        self.evaluated: list[Evaluation] = []
        self.pruned: list[tuple[Candidate, str]] = []
        self.over: dict[tuple, list[tuple[int, int]]] = {}
        self.done: set[Candidate] = set()

    def skip(self, c: Candidate) -> str:
        """Why ``c`` need not be evaluated ('' when it must)."""
        if not self.prune:
            return ""
        if c.bound_memory > self.job.platform.memory_limit:
            return "memory bound"
        if c.layout.pp > 1 and c.layout.zero == 3:
            return "in a pipeline zero 3 holds what zero 2 holds and gathers more"
        if self.best is not None and c.bound_seconds >= self.best.step_seconds:
            return "time bound"
        group, lean = _memory_order(c)
        if any(all(x >= y for x, y in zip(lean, o)) for o in self.over.get(group, ())):
            return "holds more than a layout that does not fit"
        return ""

    def run(self, c: Candidate) -> None:
        e = evaluate(self.job, c.layout, self.chain_for, c.activations)
        self.done.add(c)
        self.evaluated.append(e)
        if e.status == "over" or (e.status == "infeasible" and "fit" in e.note):
            group, lean = _memory_order(c)
            self.over.setdefault(group, []).append(lean)
        if e.fits and (self.best is None or e.step_seconds < self.best.step_seconds):
            self.best = e
            if self.progress:
                self.progress(f"[{len(self.evaluated)} evaluated] {e.layout.describe()}, {e.activations}: "
                              f"{e.tokens_per_second / self.job.devices:,.0f} tokens/s per GPU")


def search(job: Job, chain_for: ChainFor, *, micro_batch_sizes: Sequence[int | None] = (None,),
           schedules: Sequence[str] = SCHEDULES, chunks: int | None = None, tps: Iterable[int] | None = (1,),
           activations: Sequence[str] | None = None, zeros: Sequence[int] = (0, 1, 2, 3),
           progress: Callable[[str], None] | None = None, prune: bool = True,
           degrees: Sequence[tuple[int, int, int]] | None = None, sequence_parallel: Sequence[bool] | None = None,
           loss_parallel: Sequence[bool] | None = None, tp_overlap: bool = False,
           dp_overlap: bool = False) -> SearchResult:
    """The fastest layout of ``job`` that fits (module docstring); ``prune=False`` evaluates every one;
    ``degrees``: only these (tp, pp, dp) (a family of layouts, e.g. the pure pipeline); ``sequence_parallel``,
    ``loss_parallel``: the settings tried for ``tp > 1`` (each its own per-rank profile; None: both,
    :data:`SWITCHES`, where ``chain_for`` takes them, else off with a note); ``tp_overlap``: those with sequence
    parallelism overlap their collectives (``tpo=1``); ``dp_overlap``: the ZeRO-1 layouts run as Megatron's
    overlapped distributed optimizer (``dpo=1``)."""
    t0 = time.perf_counter()
    chains: dict[tuple, object] = {}
    notes: list[str] = []
    sequence_parallel, loss_parallel = _switches(chain_for, sequence_parallel, loss_parallel, notes)
    found = []
    layers = len(chain_for(1, micro_batch_sizes[0] or job.micro_batch_size))
    for c in candidates(job, layers, micro_batch_sizes=micro_batch_sizes, schedules=schedules, chunks=chunks,
                        tps=tps, activations=activations, zeros=zeros, degrees=degrees,
                        sequence_parallel=sequence_parallel, loss_parallel=loss_parallel, tp_overlap=tp_overlap,
                        dp_overlap=dp_overlap):
        key = _chain_key(c.layout)
        if key not in chains:
            try:
                chains[key] = rank_chain(chain_for, c.layout)
            except ValueError as e:
                chains[key] = None
                flags = "".join(f", {k}" for k, on in zip(("sequence parallel", "loss parallel"), key[2:]) if on)
                notes.append(f"tp={key[0]}, micro-batch size {key[1]}{flags}: not profiled ({e})")
        if chains[key] is None:
            continue
        found.append(replace(c, bound_seconds=time_bound(job, c, chains[key]),
                             bound_memory=memory_bound(job, c, chains[key])))
    found.sort(key=lambda c: (_estimate(c, chains[_chain_key(c.layout)]), c.bound_memory))
    state = _Search(job, chain_for, prune, progress, len(found))
    by_key = {(x.layout, x.activations): x for x in found}
    for c in found:
        why = state.skip(c)
        if why:
            state.pruned.append((c, why))
            continue
        probe = by_key.get(_probe_of(c))
        if prune and probe is not None and probe is not c and probe not in state.done and not state.skip(probe):
            state.run(probe)                 # the leanest layout of c's group first: if it does not fit, none does
            if state.skip(c):
                state.pruned.append((c, state.skip(c)))
                continue
        if c not in state.done:
            state.run(c)
    best, evaluated, pruned = state.best, state.evaluated, state.pruned
    switches = {"sequence_parallel": tuple(sequence_parallel), "loss_parallel": tuple(loss_parallel)}
    return SearchResult(best, evaluated, pruned, time.perf_counter() - t0, notes, switches)


def _switches(chain_for: ChainFor, sequence_parallel: Sequence[bool] | None, loss_parallel: Sequence[bool] | None,
              notes: list[str]) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """The settings a search tries for ``tp > 1``: those given; for one not given (None) both, where the chain
    source takes the keyword (else off, with a note: its chains are the plain tensor-parallel ones)."""
    import inspect

    out = []
    for name, given in (("sequence_parallel", sequence_parallel), ("loss_parallel", loss_parallel)):
        if given is not None:
            out.append(tuple(given))
            continue
        try:
            inspect.signature(chain_for).bind(2, 1, **{name: True})
            out.append(SWITCHES)
        except TypeError:
            out.append((False,))
            notes.append(f"{name.replace('_', ' ')} not searched: the chain source takes tp and the micro-batch size "
                         "only")
        except ValueError:          # no signature to read: try both
            out.append(SWITCHES)
    return out[0], out[1]


def describe_switches(switches: dict[str, Sequence[bool]]) -> str:
    """The tp > 1 settings a search tried, in ``--parallel`` keys.

    >>> describe_switches({"sequence_parallel": (False, True), "loss_parallel": (False,)})
    'sp 0/1, lp 0 for tp > 1'
    """
    keys = (("sp", "sequence_parallel"), ("lp", "loss_parallel"))
    return ", ".join(f"{k} " + "/".join(str(int(v)) for v in switches.get(name, (False,))) for k, name in keys) + \
        " for tp > 1"
