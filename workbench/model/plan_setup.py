"""A plan's training set-up as a dict of its options, for code that reads it by key (docs/model.md, "JSON").

The set-up itself is :class:`workbench.model.training_setup.TrainingSetup`: :func:`plan_setup` is
:meth:`~workbench.model.training_setup.TrainingSetup.from_memory_setup` of a plan's ``memory_setup`` and
:func:`resolve_setup` is :meth:`~workbench.model.training_setup.TrainingSetup.resolve` (options on top of it, one that
contradicts it refused, naming both values), each as ``{key: value}`` for the keys of :data:`SETUP_OPTIONS`.

>>> from workbench.model.plan import Plan
>>> plan_setup(Plan(1.0, (0,), (), 1))["memory_model"]        # no set-up recorded: the paper's rule 7
'paper'
"""

from __future__ import annotations

from typing import Any

from workbench.model.training_setup import SETUP_OPTIONS, TrainingSetup

__all__ = ["SETUP_OPTIONS", "plan_setup", "resolve_setup"]


def _options(setup: TrainingSetup) -> dict:
    return {key: getattr(setup, key) for key, _, _ in SETUP_OPTIONS}


def plan_setup(plan) -> dict:
    """The training set-up a plan's memory was computed with (its ``memory_setup``), every key filled: a plan
    that predates a key used what the workbench did then (gradients zeroed in place, stashed weights; a plan
    without any set-up, the paper's rule 7); no plan: the defaults.

    >>> from workbench.model.plan import Plan
    >>> plan_setup(Plan(1.0, (0,), (), 1, setup={"memory_model": "full", "optimizer": "sgd"}))["zero_grad"]
    'zeros'
    """
    return _options(TrainingSetup() if plan is None else TrainingSetup.from_memory_setup(plan.setup))


def resolve_setup(args: Any, plan=None) -> dict:
    """The set-up to compute with (:meth:`TrainingSetup.resolve`) as a dict.

    >>> from workbench.model.plan import Plan
    >>> p = Plan(1.0, (0,), (), 1, setup={"memory_model": "full", "weights": "stash", "zero_grad": "none"})
    >>> from types import SimpleNamespace
    >>> resolve_setup(SimpleNamespace(weights="single"), p)
    Traceback (most recent call last):
    ...
    ValueError: --weights single contradicts the plan, made with weights stash (re-plan with --weights single, or drop
    the option)
    """
    return _options(TrainingSetup.resolve(args, plan))
