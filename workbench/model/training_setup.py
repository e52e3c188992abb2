"""The training set-up a plan's memory assumes, as a value (docs/model.md, "JSON", ``memory_setup``).

:class:`TrainingSetup` is what a device holds besides the hardware: the memory model, the weight policy, the
optimizer, the precision, the training loop (``zero_grad``) and the paper's weight factor (a device's
data-parallel group is its target's layout's). A plan records it in its ``memory_setup`` beside the links it was
made for: :meth:`TrainingSetup.memory_setup` writes those keys, :meth:`TrainingSetup.from_memory_setup` reads them
back, every key filled (a plan that predates a key used what the workbench did then), :func:`recorded_link`
reads a link, with the default a plan without one is checked on (:data:`DEFAULT_BANDWIDTH`), and
:func:`recorded_data_parallel` a layout's data-parallel group (``dp``, ``zero``).

>>> s = TrainingSetup(optimizer="sgd", precision="bf16")
>>> TrainingSetup.from_memory_setup(s.memory_setup()) == s
True
>>> TrainingSetup.from_memory_setup({}).memory_model      # no set-up recorded: the paper's rule 7
'paper'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral
from typing import Any, Literal, Mapping, Sequence

__all__ = ["TrainingSetup", "DEFAULT_BANDWIDTH", "SETUP_KEYS", "SETUP_OPTIONS", "OPTIMIZERS", "PRECISIONS",
           "MEMORY_MODELS", "ZERO_GRADS", "WeightPolicy", "recorded_link", "recorded_data_parallel",
           "DATA_PARALLEL_KEYS"]

WeightPolicy = Literal["stash", "single"]
#: the set-ups the memory model knows (docs/model.md, "Memory"; its figures per optimizer:
#: :data:`workbench.model.memory.OPTIMIZER_STATES`); importing them needs no numpy (the command line's start)
OPTIMIZERS = ("none", "sgd", "momentum", "adam", "adamw")
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
MEMORY_MODELS = ("full", "paper")
#: the training loop: ``none`` (torch's default zero_grad: gradients set to None) or ``zeros`` (zeroed in place)
ZERO_GRADS = ("none", "zeros")

#: the link between two devices of a node that ``plan``, ``check``, ``simulate`` and ``run`` take when neither
#: an option, nor a named GPU, nor the plan gives one
DEFAULT_BANDWIDTH = "12GB/s"

#: the keys of ``memory_setup`` that :class:`TrainingSetup` holds (the others: the links and ``estimated``)
SETUP_KEYS = ("memory_model", "weights", "optimizer", "precision", "zero_grad", "weight_factor")
#: the keys of ``memory_setup`` that record a layout's data-parallel group (the target's layout holds them)
DATA_PARALLEL_KEYS = ("dp", "zero")


@dataclass(frozen=True)
class TrainingSetup:
    """A training set-up; the defaults are a run's without a plan (the full model, stashed weights, Adam in the
    profile's precision, torch's default loop: gradients set to None), one device per replica. The full model
    reads ``optimizer``, ``precision`` and ``zero_grad``; the paper's (``memory_model="paper"``)
    ``weight_factor`` instead. A device's data-parallel group is the target's layout's (``dp``, ``zero``:
    :class:`~workbench.model.target.Target`), not the set-up's."""

    memory_model: str = "full"
    #: ``stash`` (one version per in-flight mini-batch, PipeDream) or ``single``
    weights: WeightPolicy = "stash"
    optimizer: str = "adam"
    #: None: the profile's dtype
    precision: str | None = None
    #: the training loop (docs/model.md, "Memory"): ``none`` (torch's default ``zero_grad()``: gradients set to
    #: None between steps) or ``zeros`` (zeroed in place: a resident buffer)
    zero_grad: str = "none"
    #: the paper's phi: memory bytes per weight byte of the live version (``memory_model="paper"`` only)
    weight_factor: float = 1.0

    def __post_init__(self) -> None:
        phi = float(self.weight_factor)
        if phi < 0 or math.isnan(phi):
            raise ValueError(f"weight factor must be >= 0, got {self.weight_factor!r}")
        object.__setattr__(self, "weight_factor", phi)
        if self.weights not in ("stash", "single"):
            raise ValueError(f"weights must be 'stash' or 'single', got {self.weights!r}")
        for name, value, known in (("memory model", self.memory_model, MEMORY_MODELS),
                                   ("optimizer", self.optimizer, OPTIMIZERS),
                                   ("precision", self.precision, PRECISIONS + (None,)),
                                   ("zero-grad loop", self.zero_grad, ZERO_GRADS)):
            if value not in known:
                raise ValueError(f"unknown {name} {value!r}; known: {', '.join(k for k in known if k)}")
        if self.memory_model == "full" and phi != 1.0:
            raise ValueError(f"the weight factor ({phi:g}) belongs to the paper's memory model; the full model counts "
                             "parameters, gradients and optimizer state itself (use memory_model='paper')")

    @property
    def paper(self) -> bool:
        return self.memory_model == "paper"

    @property
    def stash(self) -> bool:
        """One weight version per in-flight mini-batch (PipeDream's stashing)."""
        return self.weights == "stash"

    def with_(self, **kw: Any) -> "TrainingSetup":
        return replace(self, **kw)

    @classmethod
    def from_memory_setup(cls, recorded: Mapping[str, Any] | None) -> "TrainingSetup":
        """The set-up a plan records (its ``memory_setup``; null: not recorded), every key filled: nothing
        recorded is the paper's rule 7 (a plan that predates the memory model); a full-model plan without
        ``zero_grad`` predates the setting and zeroed gradients in place.

        >>> TrainingSetup.from_memory_setup({"memory_model": "full", "optimizer": "sgd"}).zero_grad
        'zeros'
        """
        recorded = dict(recorded or {}) or {"memory_model": "paper", "weight_factor": 1.0}
        given = {k: recorded[k] for k in SETUP_KEYS if recorded.get(k) is not None}
        if given.get("memory_model", "full") == "full":
            given.setdefault("zero_grad", "zeros")
        return cls(**given)

    def memory_setup(self, estimated: Sequence[str] = ()) -> dict[str, Any]:
        """The keys a plan records of it (docs/model.md's table: each key where its model reads it), with the
        profile's memory columns that were ``estimated`` (the full model's).

        >>> TrainingSetup(memory_model="paper", weight_factor=2.0).memory_setup()
        {'memory_model': 'paper', 'weight_factor': 2.0, 'weights': 'stash'}
        """
        if self.paper:
            return {"memory_model": "paper", "weight_factor": self.weight_factor, "weights": self.weights}
        out = {"memory_model": "full", "optimizer": self.optimizer, "precision": self.precision,
               "weights": self.weights, "zero_grad": self.zero_grad, "estimated": list(estimated)}
        return out

    @classmethod
    def resolve(cls, args: Any, plan: Any = None) -> "TrainingSetup":
        """The set-up a command computes with: the plan's, where a plan is given (an option that contradicts it
        is an error naming both values: the plan's memory and schedule assume its own; a ``--precision`` the plan
        left to the profile is taken), else the options, else the defaults. ``args`` holds the options of
        :data:`SETUP_OPTIONS` as attributes (an argparse namespace; None: not given). Each command and each
        torchrun rank calls it once and passes the value on.

        >>> from types import SimpleNamespace
        >>> TrainingSetup.resolve(SimpleNamespace(optimizer="sgd")).optimizer
        'sgd'
        """
        recorded = cls() if plan is None else cls.from_memory_setup(getattr(plan, "setup", None))
        model = getattr(args, "memory_model", None) or recorded.memory_model
        given = {}
        for key, option, _ in SETUP_OPTIONS:
            value = getattr(args, key, None)
            if value is None:
                continue
            if key in ("optimizer", "precision", "zero_grad") and model == "paper":
                raise ValueError("--optimizer, --precision and --zero-grad belong to the full memory model, not "
                                 "--memory-model paper")
            if key == "weight_factor" and model != "paper":
                raise ValueError("--weight-factor belongs to the paper's memory model: add --memory-model paper "
                                 "(the full model counts gradients and optimizer state from --optimizer and "
                                 "--precision)")
            had = getattr(recorded, key)
            if plan is not None and value != had and not (key == "precision" and had is None):
                raise ValueError(f"{option} {value} contradicts the plan, made with {key.replace('_', ' ')} "
                                 f"{had} (re-plan with {option} {value}, or drop the option)")
            given[key] = value
        return replace(recorded, **given)


#: the set-up as the command line names it: (key, option, default without a plan)
SETUP_OPTIONS = tuple((key, "--" + key.replace("_", "-"), getattr(TrainingSetup, key))
                      for key in ("memory_model", "weights", "optimizer", "precision", "zero_grad", "weight_factor"))


def recorded_link(recorded: Mapping[str, Any] | None, key: str, default: Any) -> Any:
    """A link a plan records in its ``memory_setup`` (``bandwidth``, ``node_bandwidth``, ``host_bandwidth``;
    null: infinite, JSON has no Infinity), checked, naming where it comes from; else ``default``.

    >>> recorded_link({"bandwidth": None}, "bandwidth", DEFAULT_BANDWIDTH), recorded_link({}, "bandwidth", 1.0)
    (inf, 1.0)
    >>> recorded_link({"node_bandwidth": 0}, "node_bandwidth", 1.0)
    Traceback (most recent call last):
    ...
    ValueError: the plan's memory_setup node_bandwidth must be positive, got 0
    """
    from workbench.model.units import parse_bandwidth

    if not recorded or key not in recorded:
        return default
    if recorded[key] is None:
        return float("inf")
    return parse_bandwidth(recorded[key], what=f"the plan's memory_setup {key}")


def recorded_data_parallel(recorded: Mapping[str, Any] | None) -> tuple[int, int]:
    """(dp, zero): the data-parallel group a plan's ``memory_setup`` records (a layout's with dp > 1; else
    (1, 0)), checked.

    >>> recorded_data_parallel({"dp": 4, "zero": 1}), recorded_data_parallel({}), recorded_data_parallel(None)
    ((4, 1), (1, 0), (1, 0))
    >>> recorded_data_parallel({"dp": 1, "zero": 2})
    Traceback (most recent call last):
    ...
    ValueError: the plan's memory_setup: zero=2 shards over the data-parallel group, but dp=1
    """
    recorded = recorded or {}
    dp, zero = recorded.get("dp", 1), recorded.get("zero", 0)
    for name, v in (("dp", dp), ("zero", zero)):
        if not isinstance(v, Integral) or isinstance(v, bool) or v < (name == "dp"):
            raise ValueError(f"the plan's memory_setup {name} must be a whole number >= {int(name == 'dp')}, "
                             f"got {v!r}")
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"the plan's memory_setup zero must be 0, 1, 2 or 3 (0 DDP ... 3 FSDP), got {zero}")
    if zero and dp == 1:
        raise ValueError(f"the plan's memory_setup: zero={zero} shards over the data-parallel group, but dp=1")
    return int(dp), int(zero)
