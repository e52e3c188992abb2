"""Two profiles of the same network side by side: what changes between, say, float32 and bfloat16.

:func:`layer_ratios` puts the layers of two profiles of one chain next to
each other (``other / base`` for every time and byte column);
:func:`profile_ratios` sums each column over the whole network first, and
:func:`ratio_table` does that for several networks, one row each. Times are
medians of measured repeats, so their ratios are measurements; byte
columns are counted, so with a change of dtype alone their ratios are the
ratio of element sizes (0.5 from float32 to bfloat16) except where a layer
keeps tensors of a fixed dtype (integer token ids, float32 statistics).

>>> from workbench.model.chain import Chain, Layer
>>> a = Chain((Layer("x", 2e-3, 4e-3, 8, 16, 32), Layer("y", 1e-3, 1e-3, 0, 16, 16)))
>>> b = Chain((Layer("x", 1e-3, 2e-3, 4, 8, 16), Layer("y", 1e-3, 1e-3, 0, 8, 8)))
>>> r = profile_ratios(a, b)
>>> round(r["compute_ratio"], 3), r["saved_ratio"], r["weight_ratio"]
(0.625, 0.5, 0.5)
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from workbench.model.chain import Chain

__all__ = ["layer_ratios", "profile_ratios", "ratio_table"]

def _columns(chain: Chain) -> dict[str, np.ndarray]:
    return {"forward": chain.forward, "backward": chain.backward, "weight": chain.weights,
            "activation": np.array([l.activation_bytes for l in chain.layers], dtype=float),
            "saved": chain.saved_array}


def _ratio(b: float, a: float) -> float:
    return b / a if a > 0 else (math.nan if b == 0 else math.inf)


def _check_same_chain(base: Chain, other: Chain) -> None:
    na, nb = [l.name for l in base.layers], [l.name for l in other.layers]
    if na != nb:
        raise ValueError(f"the profiles are not of the same chain: {len(na)} layers ({na[:3]}...) against "
                         f"{len(nb)} ({nb[:3]}...)")


def layer_ratios(base: Chain, other: Chain) -> pd.DataFrame:
    """Per layer: ``base`` and ``other`` forward + backward time (seconds) and ``other / base`` of every
    column (``compute_ratio``, ``forward_ratio``, ``backward_ratio``, ``weight_ratio``,
    ``activation_ratio``, ``saved_ratio``; nan where both are 0, e.g. a layer without weights)."""
    _check_same_chain(base, other)
    ca, cb = _columns(base), _columns(other)
    out = pd.DataFrame({"layer": [l.name for l in base.layers], "base_compute": ca["forward"] + ca["backward"],
                        "other_compute": cb["forward"] + cb["backward"]})
    out["compute_ratio"] = [_ratio(b, a) for a, b in zip(out["base_compute"], out["other_compute"])]
    for key in ca:
        out[f"{key}_ratio"] = [_ratio(b, a) for a, b in zip(ca[key], cb[key])]
    return out


def profile_ratios(base: Chain, other: Chain) -> dict[str, float]:
    """Whole-network sums of both profiles and their ratios ``other / base``.

    Keys: ``layers``, ``base_compute`` and ``other_compute`` (seconds, forward +
    backward of every layer), ``compute_ratio``, ``forward_ratio``,
    ``backward_ratio``, ``weight_ratio``, ``activation_ratio``, ``saved_ratio``
    (of the sums), and the spread of the per-layer compute ratios:
    ``layer_ratio_min``, ``layer_ratio_median``, ``layer_ratio_max``.
    """
    per = layer_ratios(base, other)
    ca, cb = _columns(base), _columns(other)
    out: dict[str, float] = {"layers": len(base), "base_compute": float(base.total_compute),
                             "other_compute": float(other.total_compute)}
    out["compute_ratio"] = _ratio(out["other_compute"], out["base_compute"])
    for key in ca:
        out[f"{key}_ratio"] = _ratio(float(cb[key].sum()), float(ca[key].sum()))
    out.update(layer_ratio_min=float(per["compute_ratio"].min()),
               layer_ratio_median=float(per["compute_ratio"].median()),
               layer_ratio_max=float(per["compute_ratio"].max()))
    return out


def ratio_table(pairs: Mapping[str, tuple[Chain, Chain]]) -> pd.DataFrame:
    """:func:`profile_ratios` of every ``name -> (base, other)``, one row per name (column ``network``)."""
    return pd.DataFrame([{"network": name, **profile_ratios(a, b)} for name, (a, b) in pairs.items()])
