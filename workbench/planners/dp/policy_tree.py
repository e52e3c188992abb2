"""The policy vectors of dp auto's stage versions, kept as a tree (:mod:`workbench.planners.dp.versions`).

A version costs a few numbers, not a vector of its length: each is a node whose parent is the same version one layer
shorter and whose own entry is its last layer's policy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PolicyTree"]


class PolicyTree:
    """Every kept version as a node: its parent (one layer shorter, -1 at the stage's first layer), its last policy.

    >>> t = PolicyTree()
    >>> a = t.add(np.array([-1]), 1)
    >>> b = t.add(a, 2)
    >>> t.vector(int(b[0]))
    (1, 2)
    """

    def __init__(self) -> None:
        self._parent: list[np.ndarray] = []
        self._policy: list[np.ndarray] = []
        self._n = 0
        self._flat: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, parents: np.ndarray, policies: np.ndarray | int) -> np.ndarray:
        """New nodes with these parents and policies (one for all, or one each); their ids."""
        ids = np.arange(self._n, self._n + len(parents), dtype=np.int64)
        self._parent.append(np.asarray(parents, dtype=np.int64))
        self._policy.append(np.broadcast_to(np.asarray(policies, dtype=np.int8), (len(parents),)).copy())
        self._n += len(parents)
        self._flat = None
        return ids

    def vector(self, node: int) -> tuple[int, ...]:
        """The policy vector of ``node`` (first layer first)."""
        if self._flat is None:
            self._flat = (np.concatenate(self._parent) if self._parent else np.zeros(0, np.int64),
                          np.concatenate(self._policy) if self._policy else np.zeros(0, np.int8))
        parent, policy = self._flat
        out = []
        while node >= 0:
            out.append(int(policy[node]))
            node = int(parent[node])
        return tuple(reversed(out))
