"""One given activation policy per layer, for any planner (docs/model.md, "Activation policies").

A policy changes only its layer's profile columns, so a method plans the
*effective chain* (:func:`workbench.model.activations.apply_policies`) unchanged; the
plan records the policies, the chain's own lower bound and, when a layer offloads, the host link's
bandwidth (in its memory set-up, which check and simulate read). Flushed schedules
take keep or recompute only (offload needs a periodic plan, rule 8).

>>> from workbench.model.chain import Chain, Layer
>>> from workbench.model.target import Target
>>> from workbench.planners.dp.contiguous import plan_dp
>>> ch = Chain(tuple(Layer(f"l{i}", 1.0, 2.0, 0, 10, 100) for i in range(2)), input_bytes=10)
>>> plan_with_policies(ch, Target.of(2, memory_model="paper"), plan_dp, "dp", "recompute").activations
('recompute', 'recompute')
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from workbench.methods import names
from workbench.model.activations import apply_policies, is_keep, policy_vector
from workbench.model.chain import Chain
from workbench.model.plan import Plan, lower_bound
from workbench.model.target import Target

__all__ = ["plan_with_policies", "FLUSHED"]

#: flushed schedules simulate their memory; they take keep or recompute for every layer
FLUSHED = names(family="flushed")


def plan_with_policies(chain: Chain, platform: Target, planner: Callable[..., Plan], method: str,
                       activations: str | Sequence[str], **options: Any) -> Plan:
    """``planner`` (the function of ``method``) on the effective chain of ``activations`` (one policy
    for all layers or one per layer), the plan recording the policies and ``chain``'s lower bound."""
    pol = policy_vector(activations, len(chain))
    if is_keep(pol):
        return planner(chain, platform, **options)
    if method in FLUSHED and "offload" in pol:
        raise ValueError(f"method {method!r} (a flushed schedule) takes keep or recompute; offload needs a periodic "
                         "plan (the host link is scheduled there, rule 8)")
    result = planner(apply_policies(chain, pol), platform, **options)
    result = result.with_(activations=pol, lower_bound=lower_bound(chain, platform))
    if "offload" in pol:   # check and simulate read the host link the plan was made for
        result = result.with_(setup={**result.setup, "host_bandwidth": platform.host_bandwidth})
    return result
