"""Memory formulas the tests compute on their own, from docs/model.md (no workbench code).

>>> from workbench.chain import Platform
>>> paper_stage_memory(Platform(1, weight_factor=2, memory_model="paper"), 10, 100, 3)   # 3 x 10 + 2 x 100 + 2 x 100
430.0
"""

from __future__ import annotations


def paper_stage_memory(platform, saved: float, weights: float, k: int) -> float:
    """The paper's rule 7 for one stage: ``k A + phi W + [stash] (k - 1) W``."""
    k = int(k)
    stashed = (k - 1) * weights if platform.weights == "stash" else 0.0
    return float(k * saved + platform.weight_factor * weights + stashed)
