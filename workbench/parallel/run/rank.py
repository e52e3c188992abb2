"""One rank of a layout: the model's layers of its pipeline stages, each dimension's transform, two steps.

:func:`run_layout_rank` composes the pieces as torchtitan and picotron compose them, one transform per
dimension over the mesh of :mod:`~workbench.parallel.run.grid`:

1. every rank builds the whole model from the same seed and keeps the layers of the plan's stages at its
   pipeline coordinate (:class:`~workbench.runtime.rank.RankModel`, activation policies included);
2. tensor parallelism shards those layers over ``mesh["tp"]`` (:mod:`~workbench.parallel.run.tensor`; with
   ``lp=1`` the head's logits stay vocabulary-sharded and every step runs under torch's ``loss_parallel()``);
3. data parallelism wraps each stage over ``mesh["dp"]`` as ``zero`` says (:mod:`~workbench.parallel.run.data`);
4. the pipeline runs the stages with torch's ``PipelineStage`` and the plan's schedule over
   ``mesh["pp"]`` (:mod:`~workbench.parallel.run.pipeline`); one stage (``pp`` = 1) runs without them, as
   torchtitan's training loop: each micro-batch's forward, loss and backward in turn (FSDP2 gathering,
   resharding and reduce-scattering layer by layer in every micro-batch; DDP under ``no_sync`` but in the last),
   which is what the layout model prices (:func:`workbench.parallel.data.ranks.single_stage`);
5. tied parameters on several pipeline stages add their gradients over their tie groups before the step.

A step is the schedule over the replica's micro-batches (replica ``dp`` runs the workload's mini-batches
:func:`~workbench.parallel.run.config.micro_batch_indices` of the step), the tied gradients' all-reduce, the
optimizer's step. The run's ``optimizer_steps`` (``--steps`` mini-batches per replica over its micro-batches) are
timed and give the gradients (DTensor shards gathered whole, summed over the steps); then, once the optimizer's
state, DDP's buckets and torch's receive buffers exist (under DDP after one more step, in which it rebuilds its
buckets), one step runs under :class:`~workbench.parallel.run.memory.RankMemory` for the peak. Step ``t`` of the
rank takes the mini-batches of the run's step ``t mod k``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from workbench.parallel.data.ranks import single_stage
from workbench.parallel.run.config import LayoutConfig, micro_batch_indices
from workbench.parallel.run.data import (
    ddp_buckets,
    is_fsdp,
    local_optimizer,
    local_tensor,
    make_layout_optimizer,
    shard_data_parallel,
    zero_grads,
)
from workbench.parallel.run.grid import build_mesh, mesh_coords, tie_groups
from workbench.parallel.run.memory import RankMemory, collective_buffers, tensor_bytes
from workbench.parallel.run.pipeline import build_stages, make_schedule, receive_buffers
from workbench.parallel.run.tensor import apply_tensor_parallel, loss_context

__all__ = ["run_layout_rank", "LayoutRank"]


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective of its mesh), or ``t``; on the CPU, detached."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu().clone()


def _placed_as(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``grad`` laid out as ``param`` (under tensor parallelism torch's embedding backward may return the
    vocabulary-parallel weight's gradient whole, ``Replicate``: the copies of a tie must add equal shards)."""
    placements = getattr(param, "placements", None)
    if placements is None or tuple(grad.placements) == tuple(placements):
        return grad
    return grad.redistribute(param.device_mesh, placements)


def _as_is(_: str, whole: torch.Tensor) -> torch.Tensor:
    return whole


def _rank_model(cfg: LayoutConfig, pp: int, tp_mesh: Any, device: torch.device) -> tuple[Any, Any]:
    """The whole model built and found as a chain, sharded over ``tp_mesh`` (tensor parallelism: every layer,
    collectively, before the pipeline's split), then the layers of the stages at pipeline coordinate ``pp``;
    and the function putting a whole parameter back in the model's order (``ModelOrder``: GPT-2's fused
    query/key/value columns are permuted under tensor parallelism)."""
    from workbench.profiles.discover import discover_layers
    from workbench.runtime.rank import RankModel, chain_input

    wl = cfg.workload
    inputs, target = wl.batch(0)
    model = wl.build()
    layers = discover_layers(model, inputs, wl.loss, target)
    x0 = chain_input(inputs)
    if cfg.layout.tp == 1:
        return RankModel.from_layers(cfg.plan, layers, x0, pp, device), _as_is
    modules, loss, shapes, order = apply_tensor_parallel(model, layers, x0, tp_mesh, cfg.layout)
    return RankModel.from_layers(cfg.plan, layers, x0, pp, device, modules=modules, loss=loss, shapes=shapes), order


class LayoutRank:
    """A rank's model, transforms, schedule, optimizer and tie groups (see the module docstring)."""

    def __init__(self, rank: int, cfg: LayoutConfig, device: torch.device) -> None:
        from workbench.runtime.rank import chain_input

        self.rank, self.cfg, self.device = rank, cfg, device
        lay, plan = cfg.layout, cfg.plan
        self.coords = lay.coords(rank)
        pp, dp, _ = self.coords
        mesh = build_mesh(lay, device.type)
        if mesh_coords(mesh) != self.coords:
            raise RuntimeError(f"torch's mesh puts rank {rank} at (pp, dp, tp) {mesh_coords(mesh)}, the layout at "
                               f"{self.coords}")
        self.model, self.model_order = _rank_model(cfg, pp, mesh["tp"], device)
        model = self.model
        tied_layers = {n for t in model.tied for n in t.layers}
        self.modules = {}
        for s, seq in model.stages.items():
            st = plan.stages[s]
            tied_here = [j for j, l in enumerate(range(st.first, st.last + 1)) if model.layer_names[l] in tied_layers]
            self.modules[s] = shard_data_parallel(seq, lay.zero, mesh["dp"], lay.dp, tied_here, lay.tp)
        self.params = list({id(p): p for seq in model.stages.values() for p in seq.parameters()}.values())
        self.optimizer = make_layout_optimizer(cfg.optimizer, self.params, cfg.lr, lay.zero, lay.dp,
                                               mesh["dp"].get_group())
        self.plain = single_stage(plan)         # one stage: torchtitan's loop, no PipelineStage
        self.stages, self.schedule = [], None
        if not self.plain:
            x0 = chain_input(cfg.workload.batch(0)[0])
            self.stages = build_stages(plan, self.modules, model.shapes, x0, mesh["pp"].get_group(), device)
            self.schedule = make_schedule(plan, self.stages, cfg.micro_batches, model.loss, cfg.programs)
        self.first, self.last = 0 in model.stages, len(plan.stages) - 1 in model.stages
        self.block = -1
        self.load(0)
        self.ties = self._tie_groups()
        self.ddp = lay.dp > 1 and lay.zero in (0, 1) and lay.tp == 1
        self.steps_taken = 0

    def load(self, block: int) -> None:
        """The replica's micro-batches of the run's optimizer step ``block`` (only these are held)."""
        from workbench.runtime.rank import chain_input

        if block == self.block:
            return
        self.block, device = block, self.device
        self.x = self.y = None
        self.batches = []
        batches = [self.cfg.workload.batch(i)
                   for i in micro_batch_indices(self.cfg.layout, self.coords[1], self.cfg.micro_batches, block)]
        if self.plain:          # the micro-batches apart (torch's schedule splits one tensor into views)
            self.batches = [(chain_input(b[0]).to(device), b[1].to(device)) for b in batches]
        else:
            self.x = torch.cat([chain_input(b[0]) for b in batches]).to(device) if self.first else None
            self.y = torch.cat([b[1] for b in batches]).to(device) if self.last else None

    def _tie_groups(self) -> list[tuple[Any, str]]:
        """Per tie spanning pipeline coordinates: this rank's group (None without a copy) and the parameter."""
        device_of = {}
        for st in self.cfg.plan.stages:
            for l in range(st.first, st.last + 1):
                device_of[self.model.layer_names[l]] = st.device
        holders = [sorted({device_of[n] for n in t.layers}) for t in self.model.tied]
        groups = tie_groups(self.cfg.layout, holders, self.rank)
        return [(g, t.parameter) for g, t in zip(groups, self.model.tied) if g is not None]

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters by the model's names (a parameter two own layers share appears once)."""
        out: dict[str, torch.nn.Parameter] = {}
        for s in sorted(self.model.stages):
            for n, p in self.model.stages[s].named_parameters():
                out.setdefault(self.model.names[s][n], p)
        return out

    def step(self) -> None:
        """One optimizer step: the schedule, the tied gradients' all-reduce, the optimizer's step. The run's
        steps take the run's mini-batches in turn (step ``t`` those of step ``t mod k`` of a run of k)."""
        self.load(self.steps_taken % self.cfg.optimizer_steps)
        with loss_context(self.cfg.layout):         # lp=1: the loss on the vocabulary shards (torch's loss_parallel)
            if self.plain:
                self._plain_step()
            else:
                args = (self.x,) if self.first else ()
                self.schedule.step(*args, target=self.y, losses=[] if self.last else None, return_outputs=False)
        named = self.named_parameters()
        for group, name in self.ties:
            p = named[name]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad = _placed_as(p.grad, p)
            dist.all_reduce(local_tensor(p.grad), group=group)
        if self.optimizer is not None:
            self.optimizer.step()
        self.steps_taken += 1

    def _plain_step(self) -> None:
        """One stage's micro-batches as torchtitan's training loop runs them: each micro-batch's forward, loss
        and backward in turn, gradients summed; FSDP2 gathers, reshards and reduce-scatters layer by layer in
        every micro-batch (its defaults), DDP all-reduces in the last micro-batch's backward (``no_sync`` before)."""
        from contextlib import nullcontext

        module, loss_fn = self.modules[0], self.model.loss
        n = len(self.batches)
        for j, (x, y) in enumerate(self.batches):
            with module.no_sync() if j < n - 1 and hasattr(module, "no_sync") else nullcontext():
                loss_fn(module(x), y).backward()

    def zero(self) -> None:
        zero_grads(self.params, self.cfg.zero_grad)

    def gradients(self, keep: bool) -> dict[str, torch.Tensor]:
        """Every own parameter's gradient whole, by the model's names (kept only where ``keep``; every rank
        takes part in the gathers)."""
        out = {}
        for name, p in self.named_parameters().items():
            g = _whole(p.grad if p.grad is not None else torch.zeros_like(p))
            if keep:
                out[name] = self.model_order(name, g)
        return out

    def tied_copies(self, keep: bool) -> dict[str, dict[str, torch.Tensor]]:
        """Per tied parameter this rank holds a copy of: the copy's weight and gradient, whole."""
        named = self.named_parameters()
        out = {}
        for _, name in self.ties:
            p = named[name]
            copy = {"weight": _whole(p), "grad": _whole(p.grad if p.grad is not None else torch.zeros_like(p))}
            if keep:
                out[name] = {k: self.model_order(name, t) for k, t in copy.items()}
        return out

    def buckets(self) -> list[torch.Tensor]:
        """DDP's gradient buckets on this rank (none without DDP)."""
        return [b for m in self.modules.values() for b in ddp_buckets(m)]

    def measure(self) -> RankMemory:
        """One step under the memory trackers."""
        probe = RankMemory(self.device)
        self.load(self.steps_taken % self.cfg.optimizer_steps)
        batch = [t for b in self.batches for t in b] if self.plain else [t for t in (self.x, self.y) if t is not None]
        resident = receive_buffers(self.stages) + batch + self.buckets()
        dist.barrier()
        fsdp = any(is_fsdp(m) for m in self.modules.values())
        with probe.tracking(list(self.modules.values()), local_optimizer(self.optimizer), resident, fsdp):
            self.step()
        return probe


def run_layout_rank(rank: int, cfg: LayoutConfig) -> dict[str, Any]:
    """This rank's share of the run (the process group is up): its gradients, peak and times."""
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if cfg.device == "cuda" else torch.device("cpu")
    me = LayoutRank(rank, cfg, device)
    keep = me.coords[1] == 0 and me.coords[2] == 0      # one copy per pipeline coordinate is enough
    grads: dict[str, torch.Tensor] = {}
    seconds = 0.0
    for k in range(cfg.optimizer_steps):                # the run's steps, timed; gradients summed over them
        if k:
            me.zero()
        t0 = time.perf_counter()
        me.step()
        seconds += time.perf_counter() - t0
        for name, g in me.gradients(keep).items():
            grads[name] = grads[name] + g if name in grads else g
    seconds /= cfg.optimizer_steps
    if me.ddp:              # DDP rebuilds its gradient buckets in the second step's forward: measure the third
        me.zero()
        me.step()
    me.zero()
    probe = me.measure()
    for _ in range(cfg.extra_steps):
        me.zero()
        me.step()
    breakdown = probe.breakdown()
    return {"rank": rank, "coords": me.coords, "grads": grads, "tied": me.tied_copies(True),
            "memory_peak": probe.peak(), "memory_breakdown": breakdown,
            "collectives": collective_buffers(breakdown, receive_bytes=tensor_bytes(receive_buffers(me.stages)),
                                              bucket_bytes=tensor_bytes(me.buckets())),
            "step_seconds": seconds, "optimizer_steps": me.steps_taken}
