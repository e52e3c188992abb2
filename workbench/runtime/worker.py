"""The per-rank worker: one process per device executes that device's program.

What one rank does (see :func:`execute`):

1. build the whole model from the workload (same seed on every rank, so the
   slices agree), run a dry forward (on the meta device when the layers allow)
   to learn the shape and dtype of every layer's output (the receive buffers), then
   keep only its own layers;
2. run its program (:mod:`workbench.runtime.program`) in order. A forward
   takes its input from the data (first stage), from a stage on the same
   device (a local hand-off, no copy) or from a posted ``irecv``; it runs
   the stage layer by layer with ``torch.func.functional_call`` on the
   *current* weight version (the last stage also computes the loss, counted
   with the last layer) and keeps (input, output, version) until the
   backward. A backward computes ``torch.autograd.grad`` w.r.t. that
   version and the stage input, adds the weight gradients to per-layer
   accumulators, hands the input gradient to the previous stage and updates
   the weights (PipeDream's asynchronous update after every backward);
3. weight policy ``"stash"``: an update makes a *new* version (out of
   place), so every in-flight mini-batch keeps the version its forward used
   and its backward uses the same one (weight stashing); old versions are
   freed when their last mini-batch finishes. ``"single"``: one version,
   updated in place (backwards of in-flight mini-batches see new weights);
4. record every operation's start and end (``time.monotonic`` relative to a
   common origin broadcast by rank 0 after a barrier; CUDA events on GPUs)
   (plus the CPU time of the calling thread, ``time.thread_time``, per F/B:
   with fewer cores than busy processes, wall time / CPU time is the share
   of a core the rank got) and, after every operation, the memory it holds: the bytes of tensors
   autograd saved for its in-flight mini-batches (``saved_tensors_hooks``,
   counted per layer with storages deduplicated within the layer and
   parameters and buffers excluded, as :mod:`workbench.profiles.profiler` counts them) plus the bytes of the
   distinct weight versions it holds. On GPUs it also reports
   ``torch.cuda.max_memory_allocated``.

Sends are ``isend`` (never block), so the programs of a valid plan cannot
deadlock (checked beforehand by :func:`~workbench.runtime.program.check_programs`).
Receives are posted ahead, in the order the sender sends them (so NCCL,
which ignores tags, matches them too), ``lookahead`` messages beyond the
one needed now; the time a device waits for a message is a ``recv`` row of
the trace. Receive buffers, outputs kept for the backward that autograd did
not save, and gradients in flight are not counted as memory (the model of
DESIGN.md rule 7 does not count them either).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..plan import Plan
from .program import Op

__all__ = ["RunConfig", "execute", "spawn_entry", "isolated_entry", "storage_bytes"]


@dataclass
class RunConfig:
    """Everything a rank needs (picklable: it crosses the process boundary)."""

    plan: Plan
    programs: list[list[Op]]
    workload: Any                     # engine.Workload
    steps: int
    lr: float = 0.0
    weights: str = "stash"
    backend: str = "gloo"
    device: str = "cpu"              # "cpu" or "cuda"
    threads: int = 1
    timeout: float = 120.0
    lookahead: int = 2
    warmup: bool = True
    isolated: bool = False           # replay this device alone: receives are random tensors, sends dropped
    extra: dict[str, Any] = field(default_factory=dict)


def storage_bytes(t: torch.Tensor) -> tuple[int, int]:
    """(key, bytes) of the storage behind ``t``: what a saved tensor really holds."""
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


class _SavedCounter:
    """A pack hook that adds up the storages autograd saves (each storage once, parameters excluded)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.seen: set[int] = set()
        self.bytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            key, n = storage_bytes(t)
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. some subclasses)
            return t
        if key not in self.exclude and key not in self.seen:
            self.seen.add(key)
            self.bytes += n
        return t


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


class _Done:
    """A request that is already complete: the stand-in for a receive in an isolated replay."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Clock:
    """Monotonic wall clock on CPU, CUDA events on GPU; all times relative to a common origin."""

    def __init__(self, cuda: bool, origin: float) -> None:
        self.cuda = cuda
        self.origin = origin
        self.events: list[tuple[int, Any, Any]] = []
        if cuda:
            self.base = torch.cuda.Event(enable_timing=True)
            self.base.record()

    def start(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.monotonic()

    stop = start

    def seconds(self, mark: Any) -> float:
        if self.cuda:
            return self.base.elapsed_time(mark) / 1e3
        return mark - self.origin


def layer_output_shapes(children: list[tuple[str, nn.Module]], x0: torch.Tensor
                        ) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of every layer's output: a dry forward on the meta device (no arithmetic, no
    memory), or on the CPU in eval mode without autograd where a layer cannot run on meta tensors.

    >>> layer_output_shapes([("a", nn.Linear(3, 5)), ("b", nn.ReLU())], torch.zeros(2, 3))
    [((2, 5), torch.float32), ((2, 5), torch.float32)]
    """
    import copy

    for where in ("meta", "cpu"):
        shapes: list[tuple[tuple[int, ...], torch.dtype]] = []
        try:
            with torch.no_grad():
                h = x0.to(where)
                for _, m in children:
                    mm = copy.deepcopy(m).to(where) if where == "meta" else m
                    was_training = mm.training
                    mm.eval()
                    h = mm(h)
                    mm.train(was_training)
                    shapes.append((tuple(h.shape), h.dtype))
            return shapes
        except (NotImplementedError, RuntimeError):
            if where == "cpu":
                raise
    raise AssertionError("unreachable")


def execute(rank: int, world: int, cfg: RunConfig) -> dict[str, Any]:
    """Run this rank's program; return its operation rows, memory rows, gradients and notes."""
    plan = cfg.plan
    S = len(plan.stages)
    stage_dev = [st.device for st in plan.stages]
    cuda = cfg.device == "cuda"
    dev = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
    # gloo moves CPU tensors only: on GPUs it sends host copies (a device-to-host copy before the
    # send, host-to-device after the receive; both inside the send / recv rows of the trace)
    staged = cuda and cfg.backend == "gloo" and not cfg.isolated
    wire = torch.device("cpu") if staged else dev
    iso = cfg.isolated
    prog = cfg.programs[rank]
    wl = cfg.workload

    # ---- model, shapes, slicing -------------------------------------------------
    model: nn.Sequential = wl.build()
    children = list(model.named_children())
    if len(children) != len(plan.assignment):
        raise ValueError(f"the model has {len(children)} layers, the plan {len(plan.assignment)}")
    x0, y0 = wl.batch(0)
    shapes = layer_output_shapes(children, x0)
    mine = [s for s in range(S) if stage_dev[s] == rank]
    layer_ids = [l for s in mine for l in range(plan.stages[s].first, plan.stages[s].last + 1)]
    mods = {l: children[l][1].to(dev) for l in layer_ids}
    lname = {l: children[l][0] for l in layer_ids}
    bufs = {l: {storage_bytes(b)[0] for b in mods[l].buffers()} for l in layer_ids}
    del model, children
    # current weight version: per layer, name -> leaf tensor
    cur: dict[int, dict[str, torch.Tensor]] = {l: dict(mods[l].named_parameters()) for l in layer_ids}
    acc = {l: {n: torch.zeros_like(p) for n, p in cur[l].items()} for l in layer_ids}

    # ---- messages ------------------------------------------------------------------
    index_of: list[dict[tuple[int, str, int], int]] = [
        {(o.stage, o.kind, o.batch): j for j, o in enumerate(p)} for p in cfg.programs]

    def tag(kind: str, s: int, i: int) -> int:
        return (i * S + s) * 2 + (0 if kind == "F" else 1)

    # incoming: (kind, consumer stage, batch) -> (src, shape, dtype); queues per source in sender order
    incoming: dict[tuple[str, int, int], tuple[int, tuple[int, ...], torch.dtype]] = {}
    queues: dict[int, list[tuple[int, tuple[str, int, int]]]] = {}
    for op in prog:
        s, i = op.stage, op.batch
        if op.kind == "F" and s > 0 and stage_dev[s - 1] != rank:
            src = stage_dev[s - 1]
            shp, dt = shapes[plan.stages[s - 1].last]
            incoming[("F", s, i)] = (src, shp, dt)
            queues.setdefault(src, []).append((index_of[src][(s - 1, "F", i)], ("F", s, i)))
        if op.kind == "B" and s < S - 1 and stage_dev[s + 1] != rank:
            src = stage_dev[s + 1]
            shp, dt = shapes[plan.stages[s].last]
            incoming[("B", s, i)] = (src, shp, dt)
            queues.setdefault(src, []).append((index_of[src][(s + 1, "B", i)], ("B", s, i)))
    pending_q = {src: deque(k for _, k in sorted(q)) for src, q in queues.items()}
    posted: dict[tuple[str, int, int], tuple[Any, torch.Tensor]] = {}
    issued: set[tuple[str, int, int]] = set()

    def post_until(key: tuple[str, int, int]) -> None:
        """Post irecvs from key's source in the sender's order, up to and including key."""
        src = incoming[key][0]
        q = pending_q[src]
        while key not in issued:
            k = q.popleft()
            _, shp, dt = incoming[k]
            if iso:  # no peer: a fresh random message of the right shape, ready at once
                buf = torch.randn(shp, device=dev).to(dt) if dt.is_floating_point else torch.zeros(shp, dtype=dt,
                                                                                                    device=dev)
                posted[k] = (_Done(), buf)
            else:
                buf = torch.empty(shp, dtype=dt, device=wire)
                posted[k] = (dist.irecv(buf, src=src, tag=tag(*k)), buf)
            issued.add(k)

    recv_at = [(j, (o.kind, o.stage, o.batch)) for j, o in enumerate(prog) if (o.kind, o.stage, o.batch) in incoming]
    sends: list[tuple[Any, torch.Tensor]] = []

    # ---- state -----------------------------------------------------------------------
    local: dict[tuple[str, int, int], torch.Tensor] = {}       # hand-offs between stages of this device
    inflight: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, dict, int]] = {}
    batches: dict[int, list] = {}
    first_dev, last_dev = stage_dev[0], stage_dev[-1]
    ops_rows: list[tuple] = []
    marks: list[tuple] = []  # (kind, stage, batch, start mark, end mark)
    mem_rows: list[tuple] = []
    cpu_rows: list[tuple] = []  # (device, stage, kind, batch, CPU seconds of the calling thread)
    saved_per_stage: dict[int, list[int]] = {s: [] for s in mine}

    uses = 1 if S == 1 else (first_dev == rank) + (last_dev == rank)

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The data of mini-batch i, dropped once the forwards that need it have run."""
        if i not in batches:
            x, y = wl.batch(i)
            batches[i] = [x.to(dev), y.to(dev), uses]
        b = batches[i]
        b[2] -= 1
        if b[2] <= 0:
            del batches[i]
        return b[0], b[1]

    def weight_bytes() -> int:
        seen: dict[int, int] = {}
        for vers in [cur] + [v for (_, _, v, _) in inflight.values()]:
            for l, d in vers.items():
                for t in d.values():
                    k, n = storage_bytes(t)
                    seen[k] = n
        return sum(seen.values())

    def act_bytes() -> int:
        return sum(v[3] for v in inflight.values())

    def forward(s: int, i: int) -> None:
        st = plan.stages[s]
        if s == 0:
            x, y = batch(i)
        elif stage_dev[s - 1] == rank:
            x = local.pop(("F", s, i))
        else:
            t0 = clock.start()
            work, x = posted.pop(("F", s, i))
            work.wait()
            x = x.to(dev)
            if not iso:
                marks.append(("recv", s, i, t0, clock.stop()))
        if x.is_floating_point() and s > 0:
            x.requires_grad_(True)
        if s == S - 1 and S > 1:
            y = batch(i)[1]
        version = {l: cur[l] for l in range(st.first, st.last + 1)}
        c0 = time.thread_time()
        t0 = clock.start()
        saved = 0
        h = out = x
        for l in range(st.first, st.last + 1):
            counter = _SavedCounter({storage_bytes(p)[0] for p in version[l].values()} | bufs[l])
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, _unpack):
                h = out = torch.func.functional_call(mods[l], version[l], (h,))
                if s == S - 1 and l == st.last:  # the loss belongs to the last layer, as the profiler counts it
                    out = wl.loss(h, y)
            saved += counter.bytes
        t1 = clock.stop()
        cpu_rows.append((rank, s, "F", i, time.thread_time() - c0))
        marks.append(("F", s, i, t0, t1))
        inflight[(s, i)] = (x, out, version, saved)
        saved_per_stage[s].append(saved)
        if s < S - 1:
            if stage_dev[s + 1] == rank:
                local[("F", s + 1, i)] = h.detach()
            elif not iso:
                t0 = clock.start()
                msg = h.detach().to(wire).contiguous()
                sends.append((dist.isend(msg, dst=stage_dev[s + 1], tag=tag("F", s + 1, i)), msg))
                marks.append(("send", s, i, t0, clock.stop()))
        return t1

    def backward(s: int, i: int) -> None:
        st = plan.stages[s]
        if s == S - 1:
            g_out = None
        elif stage_dev[s + 1] == rank:
            g_out = local.pop(("B", s, i))
        else:
            t0 = clock.start()
            work, g_out = posted.pop(("B", s, i))
            work.wait()
            g_out = g_out.to(dev)
            if not iso:
                marks.append(("recv", s, i, t0, clock.stop()))
        c0 = time.thread_time()
        t0 = clock.start()
        x, out, version, _ = inflight[(s, i)]
        params = [(l, n, t) for l in range(st.first, st.last + 1) for n, t in version[l].items()]
        inputs = [t for (_, _, t) in params]
        want_x = x.requires_grad
        if want_x:
            inputs.append(x)
        grads = torch.autograd.grad(out, inputs, grad_outputs=g_out, allow_unused=True)
        with torch.no_grad():
            for (l, n, _), g in zip(params, grads):
                if g is not None:
                    acc[l][n].add_(g)
            # update the current weights with this mini-batch's gradient
            for (l, n, _), g in zip(params, grads):
                if g is None:
                    continue
                if cfg.weights == "stash":
                    cur[l] = dict(cur[l])
                    cur[l][n] = torch.add(cur[l][n], g, alpha=-cfg.lr).requires_grad_(True)
                elif cfg.lr != 0.0:
                    cur[l][n].data.add_(g, alpha=-cfg.lr)
        t1 = clock.stop()
        cpu_rows.append((rank, s, "B", i, time.thread_time() - c0))
        marks.append(("B", s, i, t0, t1))
        del inflight[(s, i)]
        if s > 0:
            gx = grads[-1] if want_x else None
            if gx is None:
                gx = torch.zeros(shapes[plan.stages[s - 1].last][0], dtype=shapes[plan.stages[s - 1].last][1],
                                 device=dev)
            if stage_dev[s - 1] == rank:
                local[("B", s - 1, i)] = gx
            elif not iso:
                t0 = clock.start()
                msg = gx.to(wire).contiguous()
                sends.append((dist.isend(msg, dst=stage_dev[s - 1], tag=tag("B", s - 1, i)), msg))
                marks.append(("send", s, i, t0, clock.stop()))
        return t1

    # ---- warm-up (untimed): one forward and backward of every own stage on dummy data, so that
    # one-time costs (allocator, autograd engine start, kernel selection) stay out of the trace
    if cfg.warmup:
        h = inputs = None                 # a device with no stage has nothing to warm up
        for _ in range(2):
            for s in mine:
                st = plan.stages[s]
                if s == 0:
                    h = x0.to(dev)
                else:
                    shp, dt = shapes[st.first - 1]
                    h = torch.zeros(shp, dtype=dt, device=dev, requires_grad=dt.is_floating_point)
                inputs = [h] if h.requires_grad else []
                for l in range(st.first, st.last + 1):
                    ps = {n: p.detach().requires_grad_(True) for n, p in cur[l].items()}
                    inputs += list(ps.values())
                    h = torch.func.functional_call(mods[l], ps, (h,))
                if s == S - 1:
                    h = wl.loss(h, y0.to(dev))
                if h.is_floating_point() and h.requires_grad:
                    # a dense gradient, like the real ones (an expanded one takes other kernels)
                    torch.autograd.grad(h, inputs, grad_outputs=torch.ones_like(h), allow_unused=True)
        del h, inputs

    # ---- run ---------------------------------------------------------------------------
    origin = torch.tensor([time.monotonic()], dtype=torch.float64)
    if not iso:
        dist.barrier()
        if cfg.backend == "nccl":
            origin = origin.to(dev)
        dist.broadcast(origin, src=0)
    clock = _Clock(cuda, float(origin.item()))
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    mem_marks: list[tuple[Any, int, int]] = [(clock.start(), 0, weight_bytes())]
    r = 0
    for j, op in enumerate(prog):
        # post the receives this op and the next `lookahead` ones need
        while r < len(recv_at) and recv_at[r][0] < j:
            r += 1
        for _, k in recv_at[r:r + 1 + cfg.lookahead]:
            post_until(k)
        end = forward(op.stage, op.batch) if op.kind == "F" else backward(op.stage, op.batch)
        mem_marks.append((end, act_bytes(), weight_bytes()))
        sends[:] = [(w, t) for (w, t) in sends if not w.is_completed()]
    for w, _ in sends:
        w.wait()
    if cuda:
        torch.cuda.synchronize(dev)

    # ---- results -----------------------------------------------------------------------
    for kind, s, i, a, b in marks:
        st = plan.stages[s]
        ops_rows.append((rank, s, st.first, st.last, kind, i, clock.seconds(a), clock.seconds(b)))
    for m, a, w in mem_marks:
        mem_rows.append((rank, clock.seconds(m), float(a), float(w), float(a + w)))
    grads = {f"{lname[l]}.{n}": acc[l][n].detach().cpu() for l in layer_ids for n in acc[l]}
    out: dict[str, Any] = {
        "rank": rank, "ops": ops_rows, "cpu": cpu_rows, "memory": mem_rows, "grads": grads,
        "saved_per_stage": {s: v for s, v in saved_per_stage.items()},
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev) if cuda else None,
    }
    return out


def spawn_entry(rank: int, world: int, cfg: RunConfig, outdir: str, addr: str, port: int) -> None:
    """Target of ``torch.multiprocessing.start_processes``: init, execute, save ``rank{r}.pt``."""
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    run_rank(rank, world, cfg, outdir, init_method=f"tcp://{addr}:{port}")


def _save(res: dict[str, Any], rank: int, outdir: str) -> None:
    tmp = os.path.join(outdir, f".rank{rank}.pt.tmp")
    torch.save(res, tmp)
    os.replace(tmp, os.path.join(outdir, f"rank{rank}.pt"))


def _setup(rank: int, cfg: RunConfig) -> None:
    torch.set_num_threads(max(1, cfg.threads))
    if cfg.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count())
        torch.cuda.set_device(local)


def isolated_entry(_index: int, rank: int, cfg: RunConfig, outdir: str) -> None:
    """Target of ``start_processes`` for an isolated replay: device ``rank`` alone, no process group."""
    _setup(rank, cfg)
    _save(execute(rank, cfg.plan.devices, cfg), rank, outdir)


def run_rank(rank: int, world: int, cfg: RunConfig, outdir: str, init_method: str = "env://") -> None:
    _setup(rank, cfg)
    dist.init_process_group(cfg.backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout))
    try:
        _save(execute(rank, world, cfg), rank, outdir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
