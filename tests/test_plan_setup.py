"""workbench.model.plan_setup: a plan's recorded set-up read back, options on top of it refused or taken."""

from types import SimpleNamespace

import pytest

from workbench.model.plan import Plan
from workbench.model.plan_setup import SETUP_OPTIONS, plan_setup, resolve_setup

FULL = {"memory_model": "full", "weights": "single", "optimizer": "sgd", "precision": "bf16", "zero_grad": "none"}


def _args(**given):
    return SimpleNamespace(**{key: given.get(key) for key, _, _ in SETUP_OPTIONS})


def test_plan_setup_fills_every_key():
    got = plan_setup(Plan(1.0, (0,), (), 1, setup=dict(FULL)))
    assert {k: got[k] for k in FULL} == FULL and set(got) == {k for k, _, _ in SETUP_OPTIONS}
    assert plan_setup(Plan(1.0, (0,), (), 1))["memory_model"] == "paper"     # no set-up recorded
    assert plan_setup(None)["zero_grad"] == "none"                          # no plan: torch's default loop


@pytest.mark.parametrize("key,option,value", [("weights", "--weights", "stash"), ("optimizer", "--optimizer", "adam"),
                                              ("zero_grad", "--zero-grad", "zeros")])
def test_a_contradicting_option_names_both_values(key, option, value):
    plan = Plan(1.0, (0,), (), 1, setup=dict(FULL))
    with pytest.raises(ValueError, match=f"{option} {value} contradicts the plan, made with .* {FULL[key]}"):
        resolve_setup(_args(**{key: value}), plan)


def test_an_agreeing_option_and_no_plan():
    plan = Plan(1.0, (0,), (), 1, setup=dict(FULL))
    assert resolve_setup(_args(weights="single"), plan)["weights"] == "single"
    assert resolve_setup(_args(optimizer="adam"))["optimizer"] == "adam"       # no plan: the option is taken
    with pytest.raises(ValueError, match="--weight-factor belongs to the paper"):
        resolve_setup(_args(weight_factor=2.0))
