"""One run as its user sees it, whoever starts the ranks (``python -m workbench run`` or
``torchrun -m workbench.runtime.engine``): the checks before, and the summary after.

Before (nothing has started): :func:`check_plan_against` refuses a plan made for another model
(layer count and names); :func:`check_plan_valid` refuses a plan that ``check`` rejects (the
validity rules of docs/model.md, on the profile's chain); :func:`platform_for_run` is the platform
the plan's memory set-up describes.

After (the ranks' :class:`~workbench.runtime.engine.RunResult`): :func:`conclude_run` checks the
gradients against one process (:func:`gradient_errors`; with dropout it says the check is none),
compares the trace with the prediction (:mod:`~workbench.runtime.compare`), builds the summary
(:func:`~workbench.runtime.summary.summarise`) and writes it with the traces (:func:`write_run`).

>>> dropout_modules(__import__("torch").nn.Sequential(__import__("torch").nn.Dropout(0.5)))
['0']
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from workbench.runtime.summary import jsonable, summarise

if TYPE_CHECKING:
    from workbench.model.training_setup import TrainingSetup

__all__ = ["cores_available", "dropout_modules", "check_plan_against", "check_plan_valid", "platform_for_run",
           "gradient_errors", "conclude_run", "write_run", "model_config_of", "profile_dtype", "workload_for"]


def cores_available() -> int:
    """The CPU cores this process may run on.

    >>> cores_available() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def dropout_modules(model) -> list[str]:
    """Names of the model's dropout modules with p > 0 (they make a gradient check meaningless).

    >>> import torch
    >>> dropout_modules(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1), torch.nn.Dropout(0.0)))
    ['1']
    """
    from torch import nn

    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def check_plan_against(plan, names: Sequence[str], chain=None, what: str = "the model") -> None:
    """Refuse a plan made for another model: the layer count, and the names the plan or the
    profile records (``plan.extra["layer_names"]``, the profile's layers), against ``names``.

    >>> from workbench.model.plan import Plan
    >>> check_plan_against(Plan(1.0, (0, 0, 1), (), 2), ["a", "b"])
    Traceback (most recent call last):
    ...
    ValueError: the plan has 3 layers but the model has 2 (a, b): the plan was made for another model
    """
    names = list(names)
    short = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    if len(plan.assignment) != len(names):
        raise ValueError(f"the plan has {len(plan.assignment)} layers but {what} has {len(names)} ({short}): "
                         "the plan was made for another model")
    for source, other in (("the plan", plan.extra.get("layer_names")),
                          ("the profile", [l.name for l in chain.layers] if chain is not None else None)):
        if other is None:
            continue
        if plan.chain_order is not None and source == "the profile":
            continue
        diff = [(i, a, b) for i, (a, b) in enumerate(zip(other, names)) if a != b]
        if len(other) != len(names) or diff:
            i, a, b = diff[0] if diff else (min(len(other), len(names)), "(none)", "(none)")
            raise ValueError(f"{source} names layer {i} {a!r} but {what} calls it {b!r}: the plan was made "
                             "for another model")


def check_plan_valid(plan, chain, platform, where: str = "the plan") -> None:
    """Refuse (ValueError) a plan that ``python -m workbench check`` rejects on this chain and platform,
    naming the first broken rule and how many there are."""
    from workbench.verify.check import check

    violations = check(plan, chain, platform)
    if violations:
        first = violations[0]
        raise ValueError(f"{where} breaks {len(violations)} validity rule(s) (python -m workbench check says "
                         f"which); first: {first}; nothing was run")


def platform_for_run(plan, *, optimizer: str | None = None, bandwidth: float | str | None = None,
                     latency: float = 0.0, weights: str | None = None, zero_grad: str | None = None,
                     setup: TrainingSetup | None = None):
    """The platform a run is predicted on: the plan's devices and memory limit, the training ``setup`` (default:
    the plan's, :meth:`~workbench.model.training_setup.TrainingSetup.from_memory_setup`; ``optimizer``, ``weights`` and
    ``zero_grad`` replace its own where given), one device per replica (a layout's run applies its data
    parallelism itself), and the links ``check`` takes for it: ``bandwidth``, else the plan's (its GPU's and
    nodes', where it records them), else :data:`~workbench.model.training_setup.DEFAULT_BANDWIDTH`.

    >>> from workbench.model.plan import Plan
    >>> platform_for_run(Plan(1.0, (0,), (), 1)).setup.optimizer, platform_for_run(Plan(1.0, (0,), (), 1)).bandwidth
    ('adam', 12000000000.0)
    """
    from dataclasses import replace

    from workbench.model.accelerators import DEFAULT_NODE_BANDWIDTH
    from workbench.model.chain import DEFAULT_HOST_BANDWIDTH, Platform
    from workbench.model.target import Target
    from workbench.model.training_setup import DEFAULT_BANDWIDTH, TrainingSetup, recorded_link

    setup = setup or TrainingSetup.from_memory_setup(plan.setup)
    chosen = {k: v for k, v in (("optimizer", optimizer), ("weights", weights), ("zero_grad", zero_grad)) if v}
    setup = replace(setup, **chosen)
    recorded = plan.setup or {}
    nodes = {} if recorded.get("devices_per_node") is None else {
        "devices_per_node": recorded["devices_per_node"],
        "node_bandwidth": recorded_link(recorded, "node_bandwidth", DEFAULT_NODE_BANDWIDTH)}
    return Target(Platform(plan.devices, memory=plan.memory_limit,
                           bandwidth=bandwidth or recorded_link(recorded, "bandwidth", DEFAULT_BANDWIDTH),
                           latency=latency or 0.0, **nodes,
                           host_bandwidth=recorded_link(recorded, "host_bandwidth", DEFAULT_HOST_BANDWIDTH)), setup)


def gradient_errors(res, wl, steps: int, random_layers: list[str], check: bool,
                    say: Callable[..., None]) -> tuple[float, float]:
    """(absolute, relative) error of the run's gradients against one process; NaN when not checked."""
    import torch

    from workbench.runtime.gradients import grad_error, reference_gradients

    if random_layers:
        say(f"note: dropout in {', '.join(random_layers[:3])}{' ...' if len(random_layers) > 3 else ''}: the "
            "ranks and one process draw other masks, so the gradients differ by more than rounding; build the "
            "model with dropout 0 to check them", file=sys.stderr)
    if not check:
        return math.nan, math.nan
    say("reference gradients in one process ...", flush=True)
    torch.set_num_threads(1)
    # the reference runs where the run ran (same kernels: on GPUs, TF32 convolutions and all)
    return grad_error(res.grads, reference_gradients(wl, steps, device=res.meta["device"]))


def conclude_run(plan, chain, platform, wl, res, *, steps: int, batch_size: int, model_config: dict[str, Any],
                 cores: int, check_grads: bool = True, replan: bool = True, out: str | Path | None = None,
                 say: Callable[..., None] = print) -> dict[str, Any]:
    """The summary of a finished run (see the module docstring), written to ``out`` when given. ``chain`` is
    the plan's (:func:`~workbench.model.plan.chain_for_plan`); ``check_grads`` with a learning rate of 0."""
    from workbench.runtime.compare import calibration_report, compare, stage_times

    random_layers = dropout_modules(wl.build())
    abs_err, max_err = gradient_errors(res, wl, steps, random_layers, check_grads, say)
    on_cpu = str(res.meta.get("device", "cpu")).startswith("cpu")
    load = os.getloadavg()[0] if (on_cpu and hasattr(os, "getloadavg")) else None
    cmp = compare(plan, chain, platform, res.trace, cores=cores if on_cpu else None, load=load)
    cal = calibration_report(plan, chain, platform, res.trace, replan=replan)
    summary = summarise(plan, chain, platform, wl, res, cmp, cal, model_config=model_config, batch_size=batch_size,
                        steps=steps, grad_errors=(abs_err, max_err), dropout=random_layers, cores=cores)
    if out is not None:
        write_run(Path(out), plan, chain, platform, steps, res, cmp, summary)
    summary["result"] = res
    summary["comparison"] = cmp
    summary["stages"] = stage_times(plan, chain, res.trace)
    return summary


def write_run(out: Path, plan, chain, platform, steps: int, res, cmp, summary: dict[str, Any]) -> None:
    """``measured.csv``, ``predicted.csv``, ``comparison.csv``, ``measured.cpu.csv``, ``plan.json`` and
    ``summary.json`` (the JSON-able part) to ``out``, each written atomically."""
    from workbench.io import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    res.trace.save(out / "measured.csv")
    try:
        from workbench.schedules.simulate import simulate

        simulate(plan, chain, platform, steps).save(out / "predicted.csv")
    except Exception as e:  # pragma: no cover - the simulator is another module's business
        summary["simulate_error"] = repr(e)
    write_text_atomic(out / "comparison.csv", cmp.to_csv(index=False))
    write_text_atomic(out / "measured.cpu.csv", res.meta["cpu"].to_csv(index=False))
    write_text_atomic(out / "plan.json", plan.to_json() + "\n")
    write_text_atomic(out / "summary.json", json.dumps(jsonable(summary), indent=2) + "\n")


def model_config_of(chain, plan) -> dict[str, Any]:
    """The zoo model's configuration the profile or the plan records (``model_config``), or {}."""
    for src in (chain.meta.get("model_config") if chain is not None else None, plan.extra.get("model_config")):
        if src:
            cfg = json.loads(src) if isinstance(src, str) else dict(src)
            return {k: tuple(v) if isinstance(v, list) and k in ("blocks", "sizes") else v for k, v in cfg.items()}
    return {}


def profile_dtype(chain) -> str:
    """The precision a profile was measured in (its ``dtype`` metadata), float32 when it says none.

    >>> from workbench.model.chain import Chain, Layer
    >>> profile_dtype(Chain((Layer("a", 1, 1, 0, 0),), meta={"dtype": "bfloat16"}))
    'bfloat16'
    """
    from workbench.profiles.zoo import dtype_name

    text = (chain.meta.get("dtype") if chain is not None else None) or "float32"
    try:
        return dtype_name(text)
    except ValueError:
        return "float32"


def workload_for(args: Any, chain, plan, batch_size: int):
    """The workload of ``--module``, ``--model`` or the profile's metadata (``module`` / ``model``)."""
    from workbench.profiles.usermodel import resolve_spec, user_code
    from workbench.profiles.workload import Workload

    module = getattr(args, "module", None)
    if not module and chain is not None and chain.meta.get("module") and not getattr(args, "model", None):
        module = resolve_spec(chain.meta["module"], Path(str(chain.meta.get("source_file", "."))).parent)
    if module:       # cut where the profile was cut (--split-at), else the layers are found again
        with user_code(module):
            return Workload.module(module, split_at=chain.meta.get("split_at") if chain is not None else None)
    model = getattr(args, "model", None) or (chain.meta.get("model") if chain is not None else None)
    if not model:
        raise ValueError("say which model to run: --model NAME (zoo), --module FILE.py:FUNC, or a --profile "
                         "that records one")
    cfg = model_config_of(chain, plan)
    dtype = profile_dtype(chain) if chain is not None else (getattr(args, "dtype", None) or "float32")
    return Workload.zoo(model, batch_size, dtype=dtype, **cfg)
