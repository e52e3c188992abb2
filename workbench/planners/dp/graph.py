"""Graph mode of ``dp``: the best topological order of a DAG for a straight pipeline.

On a DAG the chain order matters. A straight pipeline of P stages is a chain
of down-sets (ideals) ``{} = D0 <= D1 <= ... <= DP = V``; stage k holds
``Dk - D(k-1)``. :func:`best_order` minimises the bottleneck stage compute
(forward + backward) over *every* such chain, as PipeDream's antichain DP
does (no replication; communication ignored unless a platform is given,
then a boundary costs ``max(compute, comm)`` as link load). It returns a
topological order in which the optimal stages are contiguous, so the plan
stays a chain plan: ``graph.linearise(result.order)``.

The down-set lattice explodes (PipeDream: 221,564 states on inception_v3,
nothing in 15 minutes on nasnetamobile), so it is built block by block:

1. **Zero-compute merges (lossless without communication).** A unit with
   zero compute and one predecessor (or one successor) is merged into it:
   any stage chain can move it there at no cost.
2. **Blocks between forced cuts.** A prefix X of a topological order with
   every node of X an ancestor of every node outside X is comparable with
   every down-set, so the lattice is a *series* of block lattices and their
   sizes add instead of multiplying (a ResNet block, an Inception module...).
   Stages crossing blocks are handled by a Pareto front (exact).
3. **Bounded series contraction (lossy, bounded).** In a block whose
   lattice has more than ``block_states`` down-sets, runs u -> v (u's only
   successor in the block is v, v's only predecessor is u) are merged while
   the merged unit weighs at most theta; theta doubles until the lattice fits.
   Rounding every stage boundary down to whole units moves only units that
   cross one boundary, and those form an antichain; so the optimum loses at
   most the heaviest antichain of merged units, bounded by the sum of the
   ``w`` heaviest merged units of a block (``w``: the width of the merged
   units' order). ``GraphDPResult.bound`` is the largest such bound.
4. **Fixed-order fallback.** Every block's family also holds the prefixes
   of the default topological order, so the result is never worse than the
   chain DP on the default order; a block still too large after full series
   contraction keeps only those prefixes (then ``bound`` is ``inf``).

Within a block every pair of down-sets D' <= D is a candidate stage (bit
masks, vectorised); across blocks the best predecessor comes from the
Pareto front of (weight, bottleneck so far), which is exact.

>>> from workbench.profiles.pipedream import Graph, Node
>>> nodes = [Node(f"n{i}", "", w / 2, w / 2, 1.0, 0.0) for i, w in enumerate([2, 2, 3, 3])]
>>> g = Graph(tuple(nodes), (("n0", "n1"), ("n0", "n2"), ("n1", "n3"), ("n2", "n3")), "diamond")
>>> r = best_order(g, 2)
>>> r.value, r.stages, r.order
(5.0, [['n0', 'n2'], ['n1', 'n3']], ['n0', 'n2', 'n1', 'n3'])
>>> r.default_value, chain_bottleneck([2, 2, 3, 3], 2)   # the default order n0 n1 n2 n3
(6.0, (6.0, [1, 3]))
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from workbench.model.target import Target
from workbench.planners.dp.graph_units import Units, block_family, forced_splits, words, zero_merges
from workbench.planners.partition import bottleneck_partition

__all__ = ["GraphDPResult", "best_order", "chain_bottleneck", "stage_values"]


@dataclass(frozen=True)
class GraphDPResult:
    """What :func:`best_order` found. Times in seconds.

    ``order``: a topological order of all node ids in which ``stages`` are
    contiguous; ``value``: the bottleneck (largest stage compute, or
    ``max(compute, comm)`` with a platform); ``states``: down-sets in the
    searched family; ``bound``: how much worse than the optimum over every
    down-set chain the result can be (0.0: exact; ``inf``: a block fell back
    to the fixed order); ``default_value``: the chain DP on the default
    topological order, for comparison; ``lower_bound``: max(total / P,
    largest node).
    """

    order: list[str]
    value: float
    stages: list[list[str]]
    states: int
    compression: str
    bound: float
    seconds: float
    default_value: float = math.nan
    lower_bound: float = 0.0
    blocks: int = 0
    details: dict = field(default_factory=dict, compare=False)

    @property
    def exact(self) -> bool:
        return self.bound == 0.0


# ----- the chain DP (chains-on-chains) -------------------------------------
def chain_bottleneck(weights: Sequence[float], devices: int,
                     cut_costs: Sequence[float] | None = None) -> tuple[float, list[int]]:
    """Min over partitions of a chain into <= ``devices`` contiguous parts of the max part weight.

    ``cut_costs[i]`` (optional) is the cost of a boundary after item i, then a
    part costs max(its weight, its boundary). Returns the value and the last
    index of every part (among optimal partitions, one with fewest parts).
    The DP is :func:`workbench.planners.partition.bottleneck_partition`.

    >>> chain_bottleneck([3, 1, 1, 3], 2)
    (4.0, [1, 3])
    """
    w = np.asarray(weights, dtype=float)
    n = len(w)
    if n == 0:
        return 0.0, []
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    S = np.concatenate([[0.0], np.cumsum(w)])
    cost = S[None, 1:] - S[:-1, None]                  # cost[i, j]: items i..j as one part
    if cut_costs is not None:                          # ... and the boundary after item j
        after = np.concatenate([np.asarray(cut_costs, float)[: n - 1], [0.0]])
        cost = np.maximum(cost, after[None, :])
    value, bounds = bottleneck_partition(cost, devices)
    return value, [last for _, last in bounds]


def stage_values(graph, stages: Sequence[Sequence[str]], platform: Target | None = None) -> list[float]:
    """Per stage: its compute, or max(compute, comm of the boundary after it) with a platform."""
    done: set[str] = set()
    out = []
    for k, st in enumerate(stages):
        comp = sum(graph.node[v].compute for v in st)
        done |= set(st)
        if platform is not None and k < len(stages) - 1:
            cut = sum(graph.node[v].output_bytes for v in done if any(w not in done for w in graph.successors[v]))
            comp = max(comp, platform.comm_time(cut))
        out.append(comp)
    return out


# ----- the search ------------------------------------------------------------
def best_order(graph, devices: int, *, platform: Target | None = None, max_states: int = 200_000,
               block_states: int = 2048) -> GraphDPResult:
    """The best straight-pipeline split of ``graph`` into ``devices`` stages, over down-set chains.

    Minimises the largest stage compute (seconds), or with ``platform`` the
    largest of stage compute and boundary communication time. See the module
    text for the compression and what it can cost (``result.bound``).

    >>> from workbench.profiles.pipedream import Graph, Node
    >>> g = Graph((Node("a", "", 1, 0, 1, 0), Node("b", "", 1, 0, 1, 0), Node("c", "", 2, 0, 1, 0)),
    ...           (("a", "c"), ("b", "c")), "v")
    >>> best_order(g, 2).value
    2.0
    """
    t0 = time.perf_counter()
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    order0 = graph.topological_order()
    n = len(order0)
    pos0 = {v: i for i, v in enumerate(order0)}
    w = np.array([graph.node[v].compute for v in order0], dtype=float)
    outb = np.array([graph.node[v].output_bytes for v in order0], dtype=float)
    succ_pos = [[pos0[s] for s in graph.successors[v]] for v in order0]
    comm = platform is not None and platform.comm_time(1.0) > 0      # links cost something
    link = platform if comm else None

    # default order, for comparison (and the guarantee never to do worse)
    default_cuts = [platform.comm_time(c) for c in graph.cut_bytes_of(order0)] if link is not None else None
    default_value, _ = chain_bottleneck(w, devices, default_cuts)

    # 1. units, lossless zero-weight merges (compute only)
    units = _units(graph, order0, pos0, w)
    zero_merged = 0 if comm else zero_merges(units)
    # 2.-4. blocks and their down-set families
    fam = _families(units, max_states, block_states)
    states = sum(len(m) for _, m in fam.blocks) + 1

    # the DP
    stages_pos, dp_value = _search(fam.blocks, w, outb, succ_pos, devices, link)
    stage_ids = [[order0[i] for i in sorted(st)] for st in stages_pos if st]
    order = [v for st in stage_ids for v in st]
    graph.check_order(order)
    vals = stage_values(graph, stage_ids, link)
    value = max(vals) if vals else 0.0
    lb = float(max(w.sum() / devices, w.max() if n else 0.0))

    note = _compression_note(n, len(fam.blocks), states, zero_merged, comm, fam.kinds, fam.max_theta, fam.bound)
    return GraphDPResult(order=order, value=float(value), stages=stage_ids, states=states, compression=note,
                         bound=float(fam.bound), seconds=time.perf_counter() - t0,
                         default_value=float(default_value), lower_bound=lb, blocks=len(fam.blocks),
                         details={"block_states": fam.cap, "dp_value": dp_value, "notes": []})


def _units(graph, order0: list[str], pos0: dict[str, int], w: np.ndarray) -> Units:
    """One unit per node (by its position in the default order ``order0``), with its compute and edges."""
    n = len(order0)
    return Units({i: [i] for i in range(n)}, {i: float(w[i]) for i in range(n)},
                 {i: {pos0[p] for p in graph.predecessors[v]} for i, v in enumerate(order0)},
                 {i: {pos0[s] for s in graph.successors[v]} for i, v in enumerate(order0)})


@dataclass(frozen=True)
class _Families:
    """The blocks' down-set families: ``blocks`` (node positions sorted, masks over them), the largest
    loss ``bound``, how many blocks of each kind, the largest series theta, and the per-block cap used."""

    blocks: list[tuple[list[int], list[int]]]
    bound: float
    kinds: dict[str, int]
    max_theta: float
    cap: int


def _families(units: Units, max_states: int, block_states: int) -> _Families:
    """Every block's down-set family (steps 2-4 of the module text), the per-block cap halved (up to 8
    tries) until the families hold at most ``max_states`` down-sets in all."""
    cap = max(16, int(block_states))
    for _attempt in range(8):
        blocks: list[tuple[list[int], list[int]]] = []
        bound = 0.0
        kinds: dict[str, int] = {}
        max_theta = 0.0
        for bu in forced_splits(units):
            for nodes, masks, blk_bound, theta, kind in block_family(units.restrict(bu), cap):
                blocks.append((nodes, masks))
                bound = max(bound, blk_bound)
                if kind == "series":
                    max_theta = max(max_theta, theta)
                kinds[kind] = kinds.get(kind, 0) + 1
        if sum(len(m) for _, m in blocks) <= max_states:
            break
        cap = max(16, cap // 2)
    return _Families(blocks, bound, kinds, max_theta, cap)


def _compression_note(n: int, blocks: int, states: int, zero_merged: int, comm: bool, kinds: dict[str, int],
                      max_theta: float, bound: float) -> str:
    """What the compression did and what it can cost (``GraphDPResult.compression``)."""
    note = (f"{n} nodes -> {blocks} blocks, {states} down-sets searched; "
            f"{zero_merged} zero-compute nodes merged (lossless)" + ("" if not comm else " [off: communication on]")
            + f"; {kinds.get('series', 0)} blocks series-contracted (largest theta {max_theta * 1e3:.3f} ms)"
            + (f"; {kinds['relaxed']} blocks made by splitting too-wide blocks at their narrowest middle cut "
               "(down-sets across those cuts not searched: no a-priori bound)" if kinds.get("relaxed") else "")
            + (f"; {kinds['fixed']} blocks kept the default order only" if kinds.get("fixed") else "")
            + ("; exact over all down-set chains" if bound == 0 else
               f"; at most {bound * 1e3:.3f} ms above the optimum over all down-sets" if math.isfinite(bound) else
               "; no a-priori bound on the loss (never worse than the default order)"))
    if comm and bound > 0 and math.isfinite(bound):
        note += " (bound on compute; communication evaluated exactly on the searched family)"
    return note


def _search(blocks, w, outb, succ_pos, devices, platform):
    """DP over the block families. Returns the stages (sets of node positions) and the DP value."""
    W, C, st_block, st_mask, ranges, pair_lists = _states(blocks, w, outb, succ_pos, platform)
    S = len(W)
    parents, val = _stage_dp(W, C, ranges, pair_lists, devices)
    # reconstruct
    stages = []
    s = S - 1
    for par in reversed(parents):
        p = int(par[s])
        stages.append(_diff_nodes(blocks, st_block, st_mask, p, s))
        s = p
    stages.reverse()
    return stages, float(val[S - 1])


def _states(blocks, w, outb, succ_pos, platform):
    """The global states (for each block its masks except the full one, then V): their weight ``W`` (compute
    of the down-set), boundary cost ``C``, block and mask, the range of each block's states, and each block's
    comparable pairs (i a subset of j) sorted by j."""
    st_block, st_mask, W, C = [], [], [], []
    prefix_w = 0.0
    done_positions: list[int] = []
    ranges = []
    pair_lists = []
    block_of = np.full(len(w), -1)
    for b, (nodes, _) in enumerate(blocks):
        block_of[nodes] = b
    for b, (nodes, masks) in enumerate(blocks):
        full = (1 << len(nodes)) - 1
        local = [m for m in masks if m != full]
        start = len(W)
        wn = w[nodes]
        arr = words(local, len(nodes))
        bits = np.unpackbits(arr.view(np.uint8), axis=1, bitorder="little")[:, : len(nodes)].astype(bool)
        W.extend((prefix_w + bits.astype(float) @ wn).tolist())
        st_block.extend([b] * len(local))
        st_mask.extend(local)
        if platform is not None:
            lidx = {v: i for i, v in enumerate(nodes)}
            cut = np.zeros(len(local))
            for v in list(done_positions) + list(nodes):
                later = any(block_of[x] > b for x in succ_pos[v])
                here = [lidx[x] for x in succ_pos[v] if block_of[x] == b]
                if block_of[v] < b:
                    live = np.full(len(local), later)
                    if here:
                        live = live | (~bits[:, here]).any(axis=1)
                else:
                    inside = bits[:, lidx[v]]
                    live = inside & ((~bits[:, here]).any(axis=1) | later if here else np.full(len(local), later))
                cut += live * outb[v]
            C.extend(platform.comm_time(c) for c in cut)
        else:
            C.extend([0.0] * len(local))
        end = len(W)
        ranges.append((start, end))
        # comparable pairs (i subset of j), i != j, within the block
        ii, jj = [], []
        k = len(local)
        chunk = max(1, 2_000_000 // max(k, 1))
        for a in range(0, k, chunk):
            blk = arr[a:a + chunk]
            sub = np.all((arr[:, None, :] & ~blk[None, :, :]) == 0, axis=2)  # sub[i, j]: local[i] <= blk[j]
            i_idx, j_idx = np.nonzero(sub)
            keep = i_idx != (j_idx + a)
            ii.append(i_idx[keep] + start)
            jj.append(j_idx[keep] + a + start)
        ii = np.concatenate(ii) if ii else np.zeros(0, int)
        jj = np.concatenate(jj) if jj else np.zeros(0, int)
        o = np.argsort(jj, kind="stable")
        pair_lists.append((ii[o], jj[o]))
        prefix_w += float(wn.sum())
        done_positions += list(nodes)
    # final state V
    W.append(prefix_w)
    C.append(0.0)
    st_block.append(len(blocks))
    st_mask.append(None)
    ranges.append((len(W) - 1, len(W)))
    pair_lists.append((np.zeros(0, int), np.zeros(0, int)))
    W = np.array(W)
    C = np.array(C)
    return W, C, st_block, st_mask, ranges, pair_lists


def _stage_dp(W, C, ranges, pair_lists, devices):
    """One stage per device: ``val[s]`` the least bottleneck of a down-set chain ending at state s; the
    parent of every state per stage count."""
    S = len(W)
    val = np.full(S, np.inf)
    val[0] = 0.0
    parents = []
    for _k in range(devices):
        a = np.maximum(val, C)
        new = val.copy()          # an empty stage keeps the state
        par = np.arange(S)
        fW = np.zeros(0)
        fa = np.zeros(0)
        fid = np.zeros(0, dtype=int)
        for b, (start, end) in enumerate(ranges):
            idx = np.arange(start, end)
            # across blocks: Pareto front of (W high, a low) over earlier blocks
            if len(fW):
                g = fa + fW
                j = np.searchsorted(g, W[idx], side="left")
                c1 = np.where(j < len(fW), fa[np.minimum(j, len(fW) - 1)], np.inf)
                jm = np.maximum(j - 1, 0)
                c2 = np.where(j > 0, W[idx] - fW[jm], np.inf)
                best = np.minimum(c1, c2)
                who = np.where(c1 <= c2, fid[np.minimum(j, len(fW) - 1)], fid[jm])
                better = best < new[idx]
                new[idx[better]] = best[better]
                par[idx[better]] = who[better]
            # within the block
            ii, jj = pair_lists[b]
            if len(ii):
                vals = np.maximum(a[ii], W[jj] - W[ii])
                starts = np.flatnonzero(np.r_[True, jj[1:] != jj[:-1]])
                mins = np.minimum.reduceat(vals, starts)
                tgt = jj[starts]
                hit = np.flatnonzero(vals == np.repeat(mins, np.diff(np.r_[starts, len(jj)])))
                _, first = np.unique(jj[hit], return_index=True)
                arg = ii[hit[first]]
                better = mins < new[tgt]
                new[tgt[better]] = mins[better]
                par[tgt[better]] = arg[better]
            # add this block's states to the front (for later blocks)
            if end > start and b < len(ranges) - 1:
                allW = np.concatenate([fW, W[idx]])
                alla = np.concatenate([fa, a[idx]])
                allid = np.concatenate([fid, idx])
                o = np.lexsort((alla, -allW))
                allW, alla, allid = allW[o], alla[o], allid[o]
                runmin = np.minimum.accumulate(alla)
                keep = np.r_[True, alla[1:] < runmin[:-1]] & np.isfinite(alla)
                fW, fa, fid = allW[keep][::-1], alla[keep][::-1], allid[keep][::-1]
        val = new
        parents.append(par)
    return parents, val


def _state_nodes(blocks, st_block, st_mask, s) -> set[int]:
    b = st_block[s]
    out: set[int] = set()
    for bb in range(min(b, len(blocks))):
        out.update(blocks[bb][0])
    if b < len(blocks):
        nodes = blocks[b][0]
        m = st_mask[s]
        out.update(nodes[i] for i in range(len(nodes)) if (m >> i) & 1)
    return out


def _diff_nodes(blocks, st_block, st_mask, p, s) -> set[int]:
    return _state_nodes(blocks, st_block, st_mask, s) - _state_nodes(blocks, st_block, st_mask, p)
