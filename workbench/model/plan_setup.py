"""A plan's training set-up, the one ``check``, ``simulate`` and ``run`` compute with (docs/model.md, "JSON").

A plan records what its memory assumes in ``memory_setup`` (:func:`workbench.model.plan.memory_setup`):
the memory model, weights, optimizer, precision and training loop. :func:`plan_setup` reads it back with
every key filled (a plan that predates a key used what the workbench did then); :func:`resolve_setup`
takes options on top of it and refuses one that contradicts it, naming both values.

>>> from workbench.model.plan import Plan
>>> plan_setup(Plan(1.0, (0,), (), 1))["memory_model"]        # no set-up recorded: the paper's rule 7
'paper'
"""

from __future__ import annotations

from typing import Any

__all__ = ["SETUP_OPTIONS", "plan_setup", "resolve_setup"]

#: a plan's set-up (``memory_setup``) as the command line names it: (key, option, default without a plan)
SETUP_OPTIONS = (("memory_model", "--memory-model", "full"), ("weights", "--weights", "stash"),
                 ("optimizer", "--optimizer", "adam"), ("precision", "--precision", None),
                 ("zero_grad", "--zero-grad", "none"), ("weight_factor", "--weight-factor", 1.0))


def plan_setup(plan) -> dict:
    """The training set-up a plan's memory was computed with (its ``memory_setup``), every key filled: a plan
    that predates a key used what the workbench did then (gradients zeroed in place, stashed weights; a plan
    without any set-up, the paper's rule 7).

    >>> from workbench.model.plan import Plan
    >>> plan_setup(Plan(1.0, (0,), (), 1, setup={"memory_model": "full", "optimizer": "sgd"}))["zero_grad"]
    'zeros'
    """
    setup = dict(getattr(plan, "setup", None) or {}) if plan is not None else {}
    if plan is not None and not setup:
        setup = {"memory_model": "paper", "weight_factor": 1.0}
    out = {key: default for key, _, default in SETUP_OPTIONS}
    if plan is not None:
        out["zero_grad"] = "zeros"          # what plans made before the loop was a setting assumed
    out.update({k: v for k, v in setup.items() if k in out and v is not None})
    return out


def resolve_setup(args: Any, plan=None) -> dict:
    """The set-up to compute with: the plan's, where a plan is given (an option that contradicts it is an error
    naming both values: the plan's memory and schedule assume its own), else the options, else the defaults.
    ``args`` holds the options as attributes (an argparse namespace; None: not given).

    >>> from workbench.model.plan import Plan
    >>> p = Plan(1.0, (0,), (), 1, setup={"memory_model": "full", "weights": "stash", "zero_grad": "none"})
    >>> from types import SimpleNamespace
    >>> resolve_setup(SimpleNamespace(weights="single"), p)
    Traceback (most recent call last):
    ...
    ValueError: --weights single contradicts the plan, made with weights stash (re-plan with --weights single, or drop
    the option)
    """
    recorded = plan_setup(plan)
    out = dict(recorded)
    model = getattr(args, "memory_model", None) or recorded["memory_model"]
    for key, option, _ in SETUP_OPTIONS:
        given = getattr(args, key, None)
        if given is None:
            continue
        if key in ("optimizer", "precision", "zero_grad") and model == "paper":
            raise ValueError("--optimizer, --precision and --zero-grad belong to the full memory model, not "
                             "--memory-model paper")
        if key == "weight_factor" and model != "paper":
            raise ValueError("--weight-factor belongs to the paper's memory model: add --memory-model paper (the "
                             "full model counts gradients and optimizer state from --optimizer and --precision)")
        if plan is not None and given != recorded[key] and not (key == "precision" and recorded[key] is None):
            raise ValueError(f"{option} {given} contradicts the plan, made with {key.replace('_', ' ')} "
                             f"{recorded[key]} (re-plan with {option} {given}, or drop the option)")
        out[key] = given
    return out
