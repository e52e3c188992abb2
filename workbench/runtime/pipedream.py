"""The PipeDream fallback engine: what torch's pipeline engine cannot express, one method per action.

torch's engine (:mod:`~workbench.runtime.torch_engine`) runs every plan whose
weights are one version per flush. A *periodic* plan with ``weights="stash"``
is PipeDream's: an optimizer step after **every** mini-batch's backward, no
flush, and every in-flight mini-batch keeping the weight version its forward
used (weight stashing); torch's schedules have no counterpart
(:data:`~workbench.runtime.export.LIMITATIONS`). :class:`PipeDreamRank` runs
those, and :func:`~workbench.runtime.replay.replay_devices` uses it for a
device alone (``isolated``: receives are random tensors, sends dropped).

A rank executes its program (:mod:`~workbench.schedules.program`) in order:

* :meth:`PipeDreamRank.forward`: the input from the data (stage 0), from a
  stage of this rank (a hand-off) or from a posted receive; the stage's
  layers run on the version :meth:`PipeDreamRank.weights_for` gives, the last
  stage adds the loss;
  (input, output, version) are kept until the backward;
* :meth:`PipeDreamRank.backward`: gradients of that version and of the input,
  written into the parameters' gradient buffers (kept allocated), the input
  gradient handed to the previous stage, then :meth:`PipeDreamRank.update`, inside the
  backward's mark (a ``step`` row of the trace, within its ``B`` row, times the update alone);
* :meth:`PipeDreamRank.weights_for`: every forward runs on the live weights;
* :meth:`PipeDreamRank.update`: the stage's optimizer steps the live weights in
  place. With ``stash``, when a mini-batch still in flight ran its forward on
  the live storage, the live parameters first move to a copy
  (:meth:`PipeDreamRank.stash_live`): the old storage stays with that
  mini-batch, so its backward sees the version its forward used (weight
  stashing), and a stage holds one version per distinct version in flight.
  With ``single``, no copy: backwards of in-flight mini-batches see the new
  weights.
* :meth:`PipeDreamRank.receive` / :meth:`PipeDreamRank.send`: ``irecv``
  posted ahead in the sender's order (so NCCL, which ignores tags, matches
  them too), ``isend`` that never blocks (but a tied gradient's, waited for
  as the sharer's backward ends); the wait is a ``recv`` row.

Memory per rank (docs/model.md, "Runtime"): the live weights and, under
``zero_grad zeros``, their gradient buffers (under ``none``, torch's default, a
backward writes fresh gradients and the step after it frees them), the
optimizer state of the stages' own parameters, with
``stash`` one weight version per distinct version in flight (in a steady state
of ``k`` mini-batches in flight: ``k`` versions, the live one included, as the
memory model counts),
and per in-flight mini-batch the stage's input, output and saved tensors; measured by
:class:`~workbench.runtime.rank.MemoryProbe`. A tied parameter used by stages
``a < b`` is stepped by its owner ``a`` only: after ``b``'s backward of
mini-batch ``i`` its gradient goes to ``a``, which adds it before its own
step for ``i`` (with a learning rate above 0 the copies would drift: refused).
``a`` posts that receive when its forward of ``i`` starts, so the send
completes at once and ``a`` holds one receive buffer per mini-batch in
flight (a sharer ahead of the owner would otherwise hold its gradients of
several mini-batches, as many as the timing lets it run ahead); ``b`` waits
for that send as its backward ends (:meth:`PipeDreamRank.wait_tied_sends`),
so it holds the gradient through its step and no longer, however late the
send thread runs.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from workbench.runtime.config import RunConfig
from workbench.runtime.messages import ReadyReceive, SendWaiter, channel, message_tag, plan_receives, post_schedule
from workbench.runtime.policy_layers import StageOffloads
from workbench.runtime.rank import MemoryProbe, RankModel, Recorder, chain_input, make_optimizer, shared_origin

__all__ = ["PipeDreamRank", "alias"]


def alias(p: torch.Tensor) -> torch.Tensor:
    """A leaf tensor on ``p``'s storage with a version counter of its own (the optimizer's in-place
    step of ``p`` is not an autograd error for a graph that saved the alias).

    >>> p = torch.ones(2)
    >>> a = alias(p); _ = p.add_(1); a.tolist()
    [2.0, 2.0]
    """
    t = torch.empty(0, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        t.set_(p.untyped_storage(), p.storage_offset(), p.size(), p.stride())
    return t.requires_grad_(p.requires_grad)


def _tied_group(tied, plan, layer_names: list[str]) -> Any:
    """A process group of every rank for the tied gradients when a tie spans devices (else None): on it NCCL
    matches them in their own order, apart from the F and B messages. Every rank calls it alike
    (``dist.new_group`` is collective)."""
    device_of = {layer_names[l]: st.device for st in plan.stages for l in range(st.first, st.last + 1)}
    if not any(len({device_of[n] for n in t.layers}) > 1 for t in tied):
        return None
    return dist.new_group(list(range(dist.get_world_size())))


class PipeDreamRank:
    """One rank's program with an optimizer step after every backward (see the module docstring)."""

    def __init__(self, rank: int, cfg: RunConfig) -> None:
        self.rank, self.cfg, self.plan = rank, cfg, cfg.plan
        self.S = len(cfg.plan.stages)
        self.stage_dev = [st.device for st in cfg.plan.stages]
        cuda = cfg.device == "cuda"
        self.dev = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
        # gloo moves CPU tensors only: on GPUs messages are staged through the host
        self.wire = torch.device("cpu") if cuda and cfg.backend == "gloo" and not cfg.isolated else self.dev
        self.model = RankModel.build(cfg.plan, cfg.workload, rank, self.dev)
        self.mine = sorted(self.model.stages)
        self.offloads = StageOffloads(self.model.offload_stages)
        self.live = {s: self.model.parameters(s) for s in self.mine}
        self.ties = self._ties()
        self.tied_group = None if cfg.isolated else _tied_group(self.model.tied, self.plan, self.model.layer_names)
        owned = {s: [p for n, p in self.live[s].items() if (s, n) not in self.ties["shared"]] for s in self.mine}
        self.optimizers = {s: make_optimizer(cfg.optimizer, owned[s], cfg.lr) for s in self.mine}
        self.version = {s: {n: alias(p) for n, p in self.live[s].items()} for s in self.mine}
        self.resident = cfg.zero_grad == "zeros"
        for s in self.mine:   # zeros: gradient buffers, allocated once and kept (the owner's, for a tied parameter)
            for n, p in self.live[s].items():
                if self.resident and (s, n) not in self.ties["shared"] and p.requires_grad:
                    p.grad = torch.zeros_like(p)
        self.acc: dict[int, dict[str, torch.Tensor]] | None = None
        self.recorder = Recorder(rank, cuda)
        self.probe: MemoryProbe | None = None
        self.samples: list[tuple[float, float, float]] = []
        self._reset_state()

    # ---- set-up ---------------------------------------------------------------------------
    def _ties(self) -> dict[str, Any]:
        """Which (stage, parameter) pairs share a tied parameter with an earlier (owner) stage."""
        stage_of = {self.model.layer_names[l]: s for s, st in enumerate(self.plan.stages)
                    for l in range(st.first, st.last + 1)}
        shared: dict[tuple[int, str], tuple[int, int]] = {}    # (sharer stage, name) -> (owner stage, tie)
        owners: dict[int, list[tuple[int, int, str]]] = {}     # owner stage -> [(sharer stage, tie, name)]
        for k, t in enumerate(self.model.tied):
            stages = sorted({stage_of[n] for n in t.layers})
            if len(stages) > 2:     # its sharers' messages would share one key
                raise ValueError(f"the tied parameter {t.parameter} is used by stages {stages}: the PipeDream "
                                 "engine runs a tie shared by two stages only (torch's engine: --weights single)")
            for s in stages[1:]:
                if self.cfg.lr != 0.0:
                    raise ValueError(f"the tied parameter {t.parameter} is used by stages {stages}: the PipeDream "
                                     "engine keeps such ties with a learning rate of 0 only")
                if s in self.model.stages:
                    for n in self.live_names(s):
                        if self.model.names[s][n] == t.parameter:
                            shared[(s, n)] = (stages[0], k)
                if stages[0] in self.model.stages:
                    name = next(n for n in self.live_names(stages[0]) if self.model.names[stages[0]][n] == t.parameter)
                    owners.setdefault(stages[0], []).append((s, k, name))
        return {"shared": shared, "owners": owners}

    def live_names(self, s: int) -> list[str]:
        return [n for n, _ in self.model.stages[s].named_parameters()]

    def _plan_receives(self) -> None:
        """Every message this rank receives, queued per sender in the order the sender sends them
        (:func:`~workbench.runtime.messages.plan_receives`)."""
        owners = self.ties["owners"]
        tied_shapes = {(s, name): (tuple(self.live[s][name].shape), self.live[s][name].dtype)
                       for s, entries in owners.items() for _, _, name in entries}
        receives = plan_receives(self.cfg.programs, self.rank, self.stage_dev,
                                 [st.last for st in self.plan.stages], self.model.shapes, owners, tied_shapes,
                                 len(self.model.tied))
        self.receives, self.incoming, self.queues = receives, receives.incoming, receives.queues

    def _reset_state(self) -> None:
        """Empty hand-offs, in-flight mini-batches and messages; the receive queues planned afresh."""
        self.local: dict[tuple, torch.Tensor] = {}
        self.inflight: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, dict]] = {}
        self.posted: dict[tuple, tuple[Any, torch.Tensor]] = {}
        self.tied_sends: list[tuple[Any, torch.Tensor]] = []   # this backward's tied gradients in flight
        self.issued: set[tuple] = set()
        if getattr(self, "sends", None) is None:
            self.sends = SendWaiter()
        self.sends.drain()
        self.data: dict[int, list] = {}
        self._plan_receives()

    # ---- messages -------------------------------------------------------------------------
    def post(self, key: tuple) -> None:
        """Post the receives from ``key``'s sender on ``key``'s channel, in its order, up to and including ``key``."""
        src = self.incoming[key][0]
        while key not in self.issued:
            k = self.queues[channel(key, src)].popleft()
            _, shape, dtype = self.incoming[k]
            if self.cfg.isolated:
                buf = (torch.randn(shape, device=self.dev).to(dtype) if dtype.is_floating_point
                       else torch.zeros(shape, dtype=dtype, device=self.dev))
                self.posted[k] = (ReadyReceive(), buf)
            else:
                buf = torch.empty(shape, dtype=dtype, device=self.wire)
                self.posted[k] = (dist.irecv(buf, src=src, tag=self.tag(k), group=self.group(k)), buf)
            self.issued.add(k)

    def group(self, key: tuple) -> Any:
        """The process group ``key`` travels on: tied gradients on their own (:func:`_tied_group`)."""
        return self.tied_group if key[0] == "T" else None

    def tag(self, key: tuple) -> int:
        """The message's tag: :func:`~workbench.runtime.messages.message_tag`."""
        return message_tag(key, self.cfg.steps, self.S, len(self.model.tied))

    def receive(self, key: tuple) -> torch.Tensor:
        self.post(key)
        c0, t0 = time.thread_time(), self.recorder.now()
        work, buf = self.posted.pop(key)
        work.wait()
        if not self.cfg.isolated and key[0] != "T":
            self.recorder.add("recv", key[1], key[2], t0, self.recorder.now(), (time.thread_time() - c0, c0))
        return buf.to(self.dev)

    def send(self, key: tuple, dst: int, t: torch.Tensor, stage: int) -> None:
        """``isend`` of ``t``; the message kept until its send completes: a tied gradient by this rank, which
        waits for it as its backward ends (:meth:`wait_tied_sends`), the rest by the send thread."""
        if self.cfg.isolated:
            return
        c0, t0 = time.thread_time(), self.recorder.now()
        msg = t.detach().to(self.wire).contiguous()
        work = dist.isend(msg, dst=dst, tag=self.tag(key), group=self.group(key))
        if key[0] == "T":
            self.tied_sends.append((work, msg))
        else:
            self.sends.add(work, msg)
            self.recorder.add("send", stage, key[2], t0, self.recorder.now(), (time.thread_time() - c0, c0))

    def wait_tied_sends(self) -> None:
        """The tied gradients this backward sent, waited for and released. The owner posted their receives when
        its forward of the mini-batch started, so the wait is the transfer alone; left to the send thread, a
        message lived until that thread got a core and the GIL, on a loaded machine into the sharer's next
        forward (+c there: -16 % .. -29 % against the model on a GPT-2 head alone on the last of 4 ranks)."""
        while self.tied_sends:
            work, msg = self.tied_sends.pop()
            work.wait()
            del work, msg

    # ---- actions --------------------------------------------------------------------------
    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mini-batch ``i`` (input, target), kept until the stages that need it have run."""
        if i not in self.data:
            x, y = self.cfg.workload.batch(i)
            uses = 1 if self.S == 1 else (self.stage_dev[0] == self.rank) + (self.stage_dev[-1] == self.rank)
            self.data[i] = [chain_input(x).to(self.dev), y.to(self.dev), uses]
        entry = self.data[i]
        entry[2] -= 1
        if entry[2] <= 0:
            del self.data[i]
        return entry[0], entry[1]

    def forward(self, s: int, i: int) -> None:
        if s == 0:
            x, y = self.batch(i)
        elif self.stage_dev[s - 1] == self.rank:
            x = self.local.pop(("F", s, i))
        else:
            x = self.receive(("F", s, i))
        if x.is_floating_point() and s > 0:
            x.requires_grad_(True)
        if s == self.S - 1 and self.S > 1:
            y = self.batch(i)[1]
        version = self.weights_for(s, i)
        with self.recorder.op("F", s, i), self.offloads.forward(s, i):
            h = out = torch.func.functional_call(self.model.stages[s], version, (x,))
            if s == self.S - 1:                       # the loss belongs to the last layer, as profiled
                out = self.model.loss(h, y)
        self.inflight[(s, i)] = (x, out, version)
        if s < self.S - 1:
            if self.stage_dev[s + 1] == self.rank:
                self.local[("F", s + 1, i)] = h.detach()
            else:
                self.send(("F", s + 1, i), self.stage_dev[s + 1], h, s)

    def backward(self, s: int, i: int) -> None:
        if s == self.S - 1:
            g_out = None
        elif self.stage_dev[s + 1] == self.rank:
            g_out = self.local.pop(("B", s, i))
        else:
            g_out = self.receive(("B", s, i))
        x, out, version = self.inflight.pop((s, i))
        names = list(version)
        # this mini-batch's version (and graph) must be gone before the update below copies live weights
        want_x = x.requires_grad
        for n in names:   # accumulate into the resident gradient buffers, as torch's engine does
            if (s, n) not in self.ties["shared"] and self.live[s][n].grad is not None:
                version[n].grad = self.live[s][n].grad.zero_()
        wrt = [version[n] for n in names] + ([x] if want_x else [])
        with self.recorder.op("B", s, i):
            # backward(inputs=...) accumulates into the preset gradient buffers
            with self.offloads.backward(s, i):
                if wrt:     # a first stage without parameters (its input is data) has nothing to differentiate
                    torch.autograd.backward(out, grad_tensors=g_out, inputs=wrt)
            by_name = {n: version[n].grad for n in names if version[n].grad is not None}
            gx = x.grad if want_x else None
            for t in wrt:
                t.grad = None
            del wrt, version, out, x, g_out   # the step holds none of them
            self.share_tied(s, i, by_name)
            self.update(s, by_name, i)
        if s > 0:
            if gx is None:
                shp, dt = self.model.shapes[self.plan.stages[s - 1].last]
                gx = torch.zeros(shp, dtype=dt, device=self.dev)
            if self.stage_dev[s - 1] == self.rank:
                self.local[("B", s - 1, i)] = gx
            else:
                self.send(("B", s - 1, i), self.stage_dev[s - 1], gx, s)
        self.wait_tied_sends()    # the tied gradient lives through the step, as the model counts it, and no longer

    def weights_for(self, s: int, i: int) -> dict[str, torch.Tensor]:
        """The weight version mini-batch ``i``'s forward on stage ``s`` uses: the live weights themselves
        (an alias of their storage). With ``stash`` a step that would change a version an in-flight
        mini-batch still needs moves the live weights to new storage first (:meth:`stash_live`)."""
        return self.version[s]

    def stash_live(self, s: int) -> None:
        """Before a step: if a mini-batch in flight on stage ``s`` ran its forward on the live storage,
        the live parameters move to a copy and the optimizer steps that; the old storage stays with the
        mini-batches (and what autograd saved of it) until their backwards. So a stage holds one version
        per distinct version in flight: ``k`` in a steady state of ``k`` mini-batches in flight."""
        live_version = self.version[s]
        if not any(s == t and v is live_version for (t, _), (_, _, v) in self.inflight.items()):
            return
        with torch.no_grad():
            for p in self.live[s].values():
                p.data = p.data.clone()
        self.version[s] = {n: alias(p) for n, p in self.live[s].items()}

    def share_tied(self, s: int, i: int, grads: dict[str, torch.Tensor]) -> None:
        """A sharer ships its gradient of a tied parameter to the owner; an owner adds what it gets."""
        for (sharer, name), (owner, k) in self.ties["shared"].items():
            if sharer != s or name not in grads:
                continue
            g = grads.pop(name)
            if self.stage_dev[owner] == self.rank:
                self.local[("T", owner, i, k)] = g
            else:
                self.send(("T", owner, i, k), self.stage_dev[owner], g, s)
        for sharer, k, name in self.ties["owners"].get(s, []):
            key = ("T", s, i, k)
            g = self.local.pop(key) if self.stage_dev[sharer] == self.rank else self.receive(key)
            grads[name] = grads[name].add_(g) if name in grads else g

    def update(self, s: int, grads: dict[str, torch.Tensor], i: int = -1) -> None:
        """The gradients in the buffers (and the check's sums), then, timed as mini-batch ``i``'s ``step``, a
        stash where needed and the optimizer's step; under ``zero_grad none`` the gradients are the backward's
        own tensors, set to None after the step."""
        live = self.live[s]
        with torch.no_grad():
            for n, g in grads.items():
                if live[n].grad is None:      # none: the backward wrote them fresh
                    live[n].grad = g
                elif live[n].grad is not g:   # a tied parameter's sum
                    live[n].grad.copy_(g)
                if self.acc is not None:
                    self.acc[s].setdefault(n, torch.zeros_like(g)).add_(g)
        with self.recorder.op("step", s, i):
            if self.cfg.weights == "stash":
                self.stash_live(s)
            if self.optimizers[s] is not None:
                self.optimizers[s].step()
        if not self.resident:
            for p in live.values():
                p.grad = None

    # ---- the program ------------------------------------------------------------------------
    def run(self) -> None:
        program = self.cfg.programs[self.rank]
        schedule = post_schedule(self.receives, len(program), self.cfg.lookahead)
        for j, op in enumerate(program):
            for key in schedule[j]:
                self.post(key)
            (self.forward if op.kind == "F" else self.backward)(op.stage, op.batch)
            if self.probe is not None:
                self.samples.append(self.probe.sample())
        self.sends.drain()

    def warm_up(self) -> None:
        """One forward and backward per own stage on zeros (untimed, no step): allocator, kernels."""
        for s in self.mine:
            st = self.plan.stages[s]
            if s == 0:
                h = chain_input(self.cfg.workload.batch(0)[0]).to(self.dev)
            else:
                shp, dt = self.model.shapes[st.first - 1]
                h = torch.zeros(shp, dtype=dt, device=self.dev, requires_grad=dt.is_floating_point)
            out = self.model.stages[s](h)
            if s == self.S - 1:
                out = self.model.loss(out, self.cfg.workload.batch(0)[1].to(self.dev))
            if out.requires_grad:
                torch.autograd.grad(out, [p for p in self.live[s].values()] + ([h] if h.requires_grad else []),
                                    grad_outputs=torch.ones_like(out), allow_unused=True)

    def execute(self) -> dict[str, Any]:
        """Warm-up, the timed pass (trace, gradients), the memory pass (probe); the rank's results."""
        if self.cfg.warmup:
            self.warm_up()
        origin = time.perf_counter()
        self.recorder.restart(origin if self.cfg.isolated else shared_origin(origin, self.cfg.backend, self.dev))
        self.acc = {s: {} for s in self.mine}
        self.run()
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        timed = list(self.recorder.marks)
        cpu = list(self.recorder.cpu)
        grads = {self.model.names[s][n]: g.detach().cpu().clone() for s in self.mine for n, g in self.acc[s].items()
                 if (s, n) not in self.ties["shared"]}
        for s in self.mine:   # parameters a stage never got a gradient for (unused): zeros, as one process
            for n, p in self.live[s].items():
                if (s, n) not in self.ties["shared"]:
                    grads.setdefault(self.model.names[s][n], torch.zeros_like(p, device="cpu"))
        self.acc = None
        self._reset_state()
        self.probe = MemoryProbe(self.dev)
        if not self.cfg.isolated:
            dist.barrier()
        state = [self.model.stages[s] for s in self.mine] + [o for o in self.optimizers.values() if o is not None]
        with self.probe.tracking(*state):
            self.run()
        self.recorder.marks[:] = timed
        ends = sorted(self.recorder.seconds(m[4]) for m in timed if m[0] in ("F", "B"))
        memory = [(self.rank, t, a, w, tot) for t, (a, w, tot) in zip(ends, self.samples)]
        if not memory:   # a device with no stage
            memory = [(self.rank, 0.0, 0.0, 0.0, 0.0)]
        return {"rank": self.rank, "ops": self.recorder.rows(self.plan), "cpu": cpu, "memory": memory,
                "grads": grads, "memory_peak": self.probe.peak(), "memory_breakdown": self.probe.breakdown(),
                "max_memory_allocated": (torch.cuda.max_memory_allocated(self.dev) if self.dev.type == "cuda"
                                         else None), "engine": "pipedream"}
