"""The profile's memory columns as the memory model reads them (docs/model.md, "Memory", "Per layer"): each
measured or, where a profile lacks it, estimated (:data:`ESTIMATES`); and the training set-up checked against
the profile's dtype (:func:`validate_setup`). :mod:`workbench.model.memory` computes with them.

>>> from workbench.model.chain import Chain, Layer
>>> measured_columns(Chain((Layer("a", 1, 1, 10, 4),), input_bytes=2))[1][:2]
('grad_bytes', 'max_param_bytes')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # below chain: chain.py imports the memory model, which imports this
    from workbench.model.chain import Chain
    from workbench.model.target import Target

__all__ = ["ESTIMATES", "measured_columns", "validate_setup"]

#: how a missing profile column is estimated (a plan built on an estimate says so)
ESTIMATES = {
    "grad_bytes": "the parameters' bytes",
    "max_param_bytes": "all of the layer's parameters (an upper bound on its largest tensor)",
    "saved_input_bytes": "min(saved, input): the layer saves its input",
    "saved_output_bytes": "0: the layer does not save its output",
    "forward_peak_bytes": "what the layer keeps (saved beyond its input, and its output); no temporaries",
    "backward_peak_bytes": "output gradient + input gradient + one gradient of its parameters",
    "backward_fresh_peak_bytes": "the backward peak plus the layer's gradients (an upper bound; equal to the "
                                 "backward peak where that is itself estimated)",
}

def validate_setup(platform: Target, chain: Chain | None = None) -> str:
    """The precision the model computes with, after checking the set-up against the profile's dtype.

    ``fp32`` needs a float32 profile (or one that names no dtype, as PipeDream's);
    ``bf16`` and ``bf16-mixed`` need a bfloat16 profile (``profile --dtype bfloat16``).

    >>> from workbench.model.chain import Chain, Layer
    >>> from workbench.model.target import Target
    >>> validate_setup(Target.of(1), Chain((Layer("a", 1, 1),)))
    'fp32'
    >>> validate_setup(Target.of(1, precision="bf16"), Chain((Layer("a", 1, 1),), meta={"dtype": "float32"}))
    Traceback (most recent call last):
    ...
    ValueError: precision 'bf16' needs a bfloat16 profile; this profile (chain) was measured in float32 (profile it
    with --dtype bfloat16, or plan with --precision fp32)
    """
    dtype = str((chain.meta if chain is not None else {}).get("dtype", "") or "")
    precision = platform.setup.precision
    if precision is None:
        return "bf16" if dtype == "bfloat16" else "fp32"
    wants = "float32" if precision == "fp32" else "bfloat16"
    if platform.setup.memory_model == "full" and chain is not None and dtype and dtype != wants:
        other = "fp32" if dtype == "float32" else "bf16"
        raise ValueError(f"precision {precision!r} needs a {wants} profile; this profile ({chain.name}) was measured "
                         f"in {dtype} (profile it with --dtype {wants}, or plan with --precision {other})")
    return precision


def _column(chain: Chain, name: str, estimate: np.ndarray, missing: list[str]) -> np.ndarray:
    values = [getattr(l, name) for l in chain.layers]
    if all(v is not None for v in values):
        return np.array(values, dtype=float)
    missing.append(name)
    return np.array([estimate[i] if v is None else float(v) for i, v in enumerate(values)], dtype=float)


def measured_columns(chain: Chain) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The memory columns of the profile as arrays over the layers, each estimated
    (:data:`ESTIMATES`) where missing, with ``in``, ``out`` and ``saved``; and the names of
    the estimated columns (a chain made by :func:`workbench.model.activations.apply_policies` keeps
    those of the profile it came from).

    >>> from workbench.model.chain import Chain, Layer
    >>> cols, missing = measured_columns(Chain((Layer("a", 1, 1, 10, 4),), input_bytes=2))
    >>> float(cols["saved_input_bytes"][0]), missing[:1]
    (2.0, ('grad_bytes',))
    """
    L = len(chain)
    W = chain.weights
    saved = chain.saved_array
    cuts = chain.cuts
    inp = np.concatenate([[float(chain.input_bytes)], cuts[:-1]])
    out = np.array([float(l.activation_bytes) for l in chain.layers])
    missing: list[str] = []
    cols = {"grad_bytes": _column(chain, "grad_bytes", W, missing),
            "max_param_bytes": _column(chain, "max_param_bytes", W, missing)}
    si = _column(chain, "saved_input_bytes", np.minimum(saved, inp), missing)
    so = _column(chain, "saved_output_bytes", np.zeros(L), missing)
    cols["saved_input_bytes"], cols["saved_output_bytes"] = si, so
    cols["forward_peak_bytes"] = _column(chain, "forward_peak_bytes", np.maximum(saved - si, 0.0) + out, missing)
    bp_measured = np.array([l.backward_peak_bytes is not None for l in chain.layers])
    bp = _column(chain, "backward_peak_bytes", out + inp + cols["grad_bytes"], missing)
    cols["backward_peak_bytes"] = bp
    cols["backward_fresh_peak_bytes"] = _column(chain, "backward_fresh_peak_bytes",
                                                np.where(bp_measured, bp + cols["grad_bytes"], bp), missing)
    cols["in"], cols["out"], cols["saved"] = inp, out, saved
    inherited = [m for m in str(chain.meta.get("estimated_columns", "")).split(",") if m and m not in missing]
    return cols, tuple(missing + inherited)
