"""Run a rank's program on ``torch.distributed.pipelining``: torch's stages, torch's schedule runtime.

The plan is lowered to torch's schedule actions by the export
(:func:`~workbench.runtime.export.programs_to_actions`: each device's
operations in the plan's order, ``{stage}F{mb}`` / ``{stage}B{mb}``) and run
by torch's ``_PipelineScheduleRuntime``, which adds the sends and receives
itself, on one ``PipelineStage`` per stage of the rank (its layers as an
``nn.Sequential``). A ``step()`` runs one optimizer step's mini-batches as
torch's micro-batches, all with the same weights, then drains (a flush); the
optimizer steps after it. A flushed plan's step is its flush of its
micro-batches, so ``steps`` mini-batches are ``steps / micro_batches``
optimizer steps (mini-batch ``i`` of the run is micro-batch ``i mod m`` of step
``i // m``; a count that leaves a partial step is refused:
:func:`~workbench.schedules.program.optimizer_steps`); a periodic plan with one
weight version runs all ``steps`` in one step.

Timing keeps the trace's format (:mod:`workbench.model.trace`): :class:`TimedStage`
marks every forward (with the loss on the last stage, as the profiler counts
it) and backward, with the CPU time each took on its thread, and the time a send takes to post;
:class:`TimedSchedule` marks the time a forward or backward waits for its message (``recv``).

One run is a warm-up step (untimed), the timed steps (the trace, and the
gradients summed over them, checked against one process) and the memory step,
the first step's actions again under :class:`~workbench.runtime.rank.MemoryProbe`,
whose samples after each F/B are placed at the times of the first timed step's F/B.

What a rank holds per stage in this engine (docs/model.md, "Runtime"): the
stage's parameters and their gradient buffers, the optimizer's state, one
receive buffer per micro-batch for the stage's input and one for the gradient
of its output (torch preallocates them: ``_prepare_forward_infra``,
``_setup_backward_recv_info``), and, from a micro-batch's forward until its
backward, the stage's input and output and what autograd saved. Stage 0 holds
the whole step's input (its micro-batches), the last stage the targets.

Tied parameters (one ``nn.Parameter`` used by layers on several ranks, e.g. an
embedding and an LM head): every rank holding it adds its gradient with the
others' (``all_reduce`` in a group of those ranks) after the flush and before
the optimizer step, so every copy takes the same step and stays tied
(Megatron's treatment of shared embeddings). Stages of one rank share the
parameter object itself.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as ts

from workbench.runtime.policy_layers import StageOffloads
from workbench.runtime.rank import MemoryProbe, RankModel, Recorder, chain_input, make_optimizer, shared_origin
from workbench.schedules.registry import schedule_of

__all__ = ["TimedStage", "TimedSchedule", "run_torch_rank", "tie_groups", "torch_schedule"]


class TimedStage(PipelineStage):
    """torch's ``PipelineStage`` whose forwards, backwards and posted sends are timed (and memory sampled)."""

    recorder: Recorder
    probe: MemoryProbe | None = None
    samples: list[tuple[float, float, float]]

    #: the rank's offload stores (one per stage and micro-batch of a stage that offloads)
    offloads: StageOffloads

    def forward_one_chunk(self, fwd_chunk_id: int, args: Any, kwargs: Any = None, save_forward_output: bool = True):
        c0 = time.thread_time()
        t0 = self.recorder.now()
        with self.offloads.forward(self.stage_index, fwd_chunk_id):
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.recorder.add("F", self.stage_index, fwd_chunk_id, t0, self.recorder.now(), (time.thread_time() - c0, c0))
        if not self.is_last:
            self._sample()
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, loss=None, full_backward: bool = True,
                           last_backward: bool = False):
        with self.recorder.op("B" if full_backward else "I", self.stage_index, bwd_chunk_id), \
                self.offloads.backward(self.stage_index, bwd_chunk_id):
            out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                             last_backward=last_backward)
        self._sample()
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False):
        with self.recorder.op("W", self.stage_index, bwd_chunk_id):
            out = super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self._sample()
        return out

    def get_fwd_send_ops(self, fwd_chunk_id: int):
        with self.recorder.op("send", self.stage_index, fwd_chunk_id):
            return super().get_fwd_send_ops(fwd_chunk_id)

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        with self.recorder.op("send", self.stage_index, bwd_chunk_id):
            return super().get_bwd_send_ops(bwd_chunk_id)

    def _sample(self) -> None:
        if self.probe is not None:
            self.samples.append(self.probe.sample())


class _TimedWait:
    """The receives a forward or backward waits for, timed as one ``recv`` row."""

    def __init__(self, works: list, recorder: Recorder, stage: int, batch: int) -> None:
        self.works, self.recorder, self.stage, self.batch = works, recorder, stage, batch

    def wait(self) -> None:
        with self.recorder.op("recv", self.stage, self.batch):
            for w in self.works:
                w.wait()


class _TimedRecvs(dict):
    """``fwd_recv_ops`` / ``bwd_recv_ops`` of the schedule: what is popped is waited for with a mark."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def pop(self, key, *default):
        works = super().pop(key, *default)
        return [_TimedWait(works, self.recorder, key[0], key[1])]


class _Timed:
    """What a timed schedule adds to torch's: receives marked as waits, the last stage's loss in its forward."""

    recorder: Recorder

    def timed_by(self, recorder: Recorder) -> "_Timed":
        self.recorder = recorder
        self.fwd_recv_ops = _TimedRecvs(recorder)
        self.bwd_recv_ops = _TimedRecvs(recorder)
        return self

    def _maybe_compute_loss(self, stage, output, target_mbs, mb_index, loss_kwargs=None):
        c0 = time.thread_time()
        super()._maybe_compute_loss(stage, output, target_mbs, mb_index, loss_kwargs)
        if stage.is_last and self.recorder.marks and self.recorder.marks[-1][0] == "F":
            kind, s, i, t0, _ = self.recorder.marks.pop()     # the forward's mark and CPU time take the loss in
            cpu, start = (self.recorder.cpu.pop()[4:] if self.recorder.cpu and self.recorder.cpu[-1][2:4] == (kind, i)
                          else (0.0, c0))
            self.recorder.add(kind, s, i, t0, self.recorder.now(), (cpu + time.thread_time() - c0, start))
            stage._sample()


class TimedSchedule(_Timed, ts._PipelineScheduleRuntime):
    """torch's schedule runtime with timed receives; the last stage's loss is part of its forward."""

    def __init__(self, *args: Any, recorder: Recorder, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timed_by(recorder)


def torch_schedule(name: str, stages: list[TimedStage], steps: int, loss_fn: Any, recorder: Recorder) -> Any:
    """torch's own schedule class of the workbench method ``name`` (``ScheduleInterleaved1F1B``, ...) on
    ``stages``, timed: the class computes its order itself, as it would outside the workbench."""
    cls = getattr(ts, schedule_of(name).torch_class)
    timed = type(f"Timed{cls.__name__}", (_Timed, cls), {})
    return timed(stages, steps, loss_fn=loss_fn, scale_grads=False).timed_by(recorder)


def tie_groups(model: RankModel, plan, world: int) -> list[tuple[Any, list[torch.Tensor]]]:
    """Per tie whose layers sit on several ranks: a process group of those ranks and this rank's copies.

    Every rank creates every group (``dist.new_group`` is collective), in the order of the ties.
    """
    device_of = {}
    for st in plan.stages:
        for l in range(st.first, st.last + 1):
            device_of[model.layer_names[l]] = st.device
    groups = []
    for t in model.tied:
        ranks = sorted({device_of[n] for n in t.layers})
        if len(ranks) < 2:
            continue
        group = dist.new_group(ranks)
        mine = [p for s in model.stages for n, p in model.parameters(s).items() if model.names[s][n] == t.parameter]
        groups.append((group, list({id(p): p for p in mine}.values())))
    return groups


def run_torch_rank(rank: int, world: int, cfg) -> dict[str, Any]:
    """This rank's share of the run on torch's engine; the result dict of :func:`~workbench.runtime.worker.run_rank`.

    A warm-up step (allocations, kernel choice, optimizer state), the timed step (trace, gradients)
    and the memory step (probe), as on the PipeDream engine.
    """
    plan = cfg.plan
    cuda = cfg.device == "cuda"
    dev = torch.device(f"cuda:{torch.cuda.current_device()}") if cuda else torch.device("cpu")
    model = RankModel.build(plan, cfg.workload, rank, dev)
    origin = time.perf_counter()
    rec = Recorder(rank, cuda)
    samples: list[tuple[float, float, float]] = []     # memory after each F/B, in the rank's order
    # torch's schedules want every rank of their group to hold a stage: devices without one stay out
    active = sorted({st.device for st in plan.stages})
    group = dist.new_group(active) if len(active) < world else None
    stages = _build_stages(model, cfg, dev, group, rec, samples)
    step = _TorchStep(model, cfg, stages, active, world, rec, dev)
    step.run()                                        # warm-up: allocations, kernel choice, optimizer state
    step.zero()
    rec.restart(shared_origin(origin, cfg.backend, dev))   # rank 0's clock origin; the warm-up's marks go
    grads = step.run_all()                            # the run's optimizer steps, timed
    taken = step.taken
    if cuda:
        torch.cuda.synchronize(dev)
    timed = list(rec.marks)
    cpu_rows = list(rec.cpu)
    step.zero()
    probe = _memory_step(step, stages, model, dev)
    rec.marks[:] = timed
    ends = sorted(rec.seconds(m[4]) for m in timed if m[0] in ("F", "B", "I", "W"))
    memory = [(rank, t, a, w, tot) for t, (a, w, tot) in zip(ends, samples)]
    return {"rank": rank, "ops": rec.rows(plan), "cpu": cpu_rows, "memory": memory, "grads": grads,
            "memory_peak": probe.peak(), "memory_breakdown": probe.breakdown(),
            "max_memory_allocated": torch.cuda.max_memory_allocated(dev) if cuda else None, "engine": "torch",
            "optimizer_steps": taken}


def _build_stages(model: RankModel, cfg, dev: torch.device, group, rec: Recorder,
                  samples: list[tuple[float, float, float]]) -> list[TimedStage]:
    """A :class:`TimedStage` per stage of this rank, recording into ``rec`` and ``samples``."""
    plan = cfg.plan
    stages = []
    offloads = StageOffloads(model.offload_stages)
    for s, seq in model.stages.items():
        st = plan.stages[s]
        # example input and output (meta tensors: shapes only); requires_grad says a gradient flows back
        x_in = (_meta(*model.shapes[st.first - 1]) if st.first > 0 else
                chain_input(cfg.workload.batch(0)[0]).to("meta"))
        stage = TimedStage(seq, s, len(plan.stages), dev, input_args=(x_in,),
                           output_args=(_meta(*model.shapes[st.last]),), group=group)
        stage.recorder, stage.samples = rec, samples
        stage.offloads = offloads
        stages.append(stage)
    return stages


class _TorchStep:
    """The plan's optimizer steps on torch's schedule runtime. One step (:meth:`run`) is the schedule over
    a step's micro-batches (a flushed plan's own count; a periodic plan's every mini-batch), the all-reduce of
    tied gradients across ranks and the optimizer's step; :meth:`zero` clears the gradients (the plan's loop)."""

    def __init__(self, model: RankModel, cfg, stages: list[TimedStage], active: list[int], world: int,
                 rec: Recorder, dev: torch.device) -> None:
        from workbench.runtime.export import programs_to_actions
        from workbench.schedules.program import optimizer_steps, programs_for

        plan = cfg.plan
        self.count, self.per_step = optimizer_steps(plan, cfg.steps)
        self.params = [p for s in model.stages for p in model.stages[s].parameters()]
        self.named = {model.names[s][n]: p for s in model.stages for n, p in model.parameters(s).items()}
        self.loop, self.rec, self.taken = cfg.zero_grad, rec, 0
        self.optimizer = make_optimizer(cfg.optimizer, list({id(p): p for p in self.params}.values()), cfg.lr)
        self.ties = tie_groups(model, plan, world)
        self.schedule = None
        if stages and schedule_of(plan.schedule).from_torch:       # torch's class, which computes its own order
            self.schedule = torch_schedule(plan.schedule, stages, self.per_step, model.loss, rec)
        elif stages:
            one = programs_for(plan, self.per_step)               # one step's order (a flush of a flushed plan)
            actions = {active.index(d): [ts._Action.from_str(a) for a in acts]        # keyed by rank in the group
                       for d, acts in programs_to_actions(one, plan).items() if d in active}
            self.schedule = TimedSchedule(stages, self.per_step, loss_fn=model.loss, scale_grads=False, recorder=rec)
            self.schedule._prepare_schedule_with_comms(actions)
        self.first, self.last = 0 in model.stages, (len(plan.stages) - 1) in model.stages
        batches = [cfg.workload.batch(i) for i in range(cfg.steps)] if (self.first or self.last) else []
        m = self.per_step
        self.x = [torch.cat([chain_input(b[0]) for b in batches[k * m:(k + 1) * m]]).to(dev) if self.first else None
                  for k in range(self.count)]
        self.y = [torch.cat([b[1] for b in batches[k * m:(k + 1) * m]]).to(dev) if self.last else None
                  for k in range(self.count)]

    def run(self, k: int = 0) -> None:
        """Optimizer step ``k`` (its mini-batches ``k * per_step`` on); its marks name the run's mini-batches."""
        marks, cpu = len(self.rec.marks), len(self.rec.cpu)
        if self.schedule is not None:
            args = (self.x[k],) if self.first else ()
            self.schedule.step(*args, target=self.y[k], losses=[] if self.last else None, return_outputs=False)
        if k:                   # torch numbers a step's micro-batches from 0
            shift = k * self.per_step
            self.rec.marks[marks:] = [(a, s, i + shift, t0, t1) for a, s, i, t0, t1 in self.rec.marks[marks:]]
            self.rec.cpu[cpu:] = [(r, s, a, i + shift, *rest) for r, s, a, i, *rest in self.rec.cpu[cpu:]]
        for group, copies in self.ties:
            for p in copies:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=group)
        if self.optimizer is not None:
            self.optimizer.step()
        self.taken += 1

    def run_all(self) -> dict[str, torch.Tensor]:
        """Every optimizer step of the run, the plan's loop between them; the gradients summed over them (by
        parameter name, on the CPU: what one process accumulates over the run's mini-batches)."""
        total: dict[str, torch.Tensor] = {}
        self.taken = 0
        for k in range(self.count):
            if k:
                self.zero()
            self.run(k)
            for name, p in self.named.items():
                g = p.grad.detach().cpu().clone() if p.grad is not None else torch.zeros_like(p, device="cpu")
                total[name] = total[name] + g if name in total else g
        return total

    def zero(self) -> None:
        """Between steps, the plan's loop: gradients set to None (``none``, torch's default) or zeroed in place."""
        for p in self.params:
            if self.loop == "none":
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


def _memory_step(step: _TorchStep, stages: list[TimedStage], model: RankModel, dev: torch.device) -> MemoryProbe:
    """One more step under the allocator-level probe (stages, optimizer and torch's receive buffers)."""
    probe = MemoryProbe(dev)
    for stg in stages:
        stg.probe = probe
    dist.barrier()
    # the receive buffers are passed, not kept: a V schedule's turn replaces them (torch frees the old ones)
    with probe.tracking(*[model.stages[s] for s in model.stages], step.optimizer,
                        *[t for stg in stages for t in _stage_buffers(stg)]):
        step.run()
    return probe


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta").requires_grad_(dtype.is_floating_point)


def _stage_buffers(stage: TimedStage) -> list[torch.Tensor]:
    """The receive buffers torch preallocated for a stage (input activations and output gradients)."""
    out = []
    for infos in list(getattr(stage, "args_recv_info", {}).values()):
        for info in infos:
            b = getattr(info, "buffer", None)
            if isinstance(b, torch.Tensor):
                out.append(b)
    for infos in list((getattr(stage, "grad_recv_info", None) or {}).values()):
        for info in infos:
            b = getattr(info, "buffer", None)
            if isinstance(b, torch.Tensor):
                out.append(b)
    return out
