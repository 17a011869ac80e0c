r"""The search problem handed from ``objectives`` to ``search``: cost tables over configurations.

Choose one configuration :math:`c_i \in \{0..K_i-1\}` per op :math:`i` to minimise

.. math::

    T(c) = T_0 + \sum_i t_i[c_i] + \sum_{(u,v)} t_{uv}[c_u, c_v], \qquad
    M(c) = M_0 + \sum_i m_i[c_i]

(time per training step in seconds, memory per device in bytes). Both objectives are sums, so the
same variable elimination carries a scalar (PaSE DP) or a Pareto set of (time, memory) pairs (FT).
Edges carry time only: redistribution buffers are transient and covered by the per-op workspace
allowance in memory.

Ops with identical cost behaviour share the *same* numpy arrays (``is``), and ``blocks`` lists the
repeated blocks, so search can reuse work across transformer layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.graph import BlockGroup

__all__ = ["EdgeCost", "CostTables"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeCost:
    """Time cost of the data flowing between two ops, for every pair of their configurations."""

    u: int
    """Index of the producer op."""
    v: int
    """Index of the consumer op (``u != v``; several tensors between u and v are summed here)."""
    time_s: np.ndarray
    """``(K_u, K_v)`` float64 seconds (forward + backward redistribution)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostTables:
    """Everything search needs; search never sees ops, tensors or clusters."""

    configs: tuple[ConfigSpace, ...]
    """Per op, its configurations."""
    node_time_s: tuple[np.ndarray, ...]
    """Per op, ``(K_i,)`` float64 seconds: compute + intra-op communication + gradient sync."""
    node_memory_bytes: tuple[np.ndarray, ...]
    """Per op, ``(K_i,)`` float64 bytes per device: parameter states + saved activations."""
    edges: tuple[EdgeCost, ...]
    """At most one per unordered op pair."""
    constant_time_s: float = 0.0
    constant_memory_bytes: float = 0.0
    blocks: tuple[BlockGroup, ...] = ()
    """Repeated blocks (from the op graph)."""

    @property
    def num_ops(self) -> int:
        return len(self.configs)

    def evaluate(self, choice: np.ndarray | list[int] | tuple[int, ...]) -> tuple[float, float]:
        """``(time_s, memory_bytes)`` of one configuration index per op."""
        picks = np.asarray(choice, dtype=np.int64)
        time_s = self.constant_time_s + sum(float(t[c]) for t, c in zip(self.node_time_s, picks))
        memory = self.constant_memory_bytes + sum(
            float(m[c]) for m, c in zip(self.node_memory_bytes, picks)
        )
        time_s += sum(float(e.time_s[picks[e.u], picks[e.v]]) for e in self.edges)
        return time_s, memory
