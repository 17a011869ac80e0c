"""What the searches return: one minimum (:class:`DPResult`) or a frontier (:class:`FrontierResult`).

Every result carries full per-op choices (one configuration index per op), and its objective values
are those of :meth:`planner.core.tables.CostTables.evaluate` on that choice, bit for bit (see
:func:`planner.search.problem.evaluate_many`), so a result can always be checked independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["DPResult", "FrontierPoint", "FrontierResult", "MemoryFit", "FrontierMethod"]

FrontierMethod = Literal["elimination", "exhaustive", "nsga2", "hull"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DPResult:
    """The exact minimum of one objective (PaSE DP or the exhaustive oracle)."""

    choice: np.ndarray
    """``(num_ops,)`` int64: configuration index per op."""
    time_s: float
    """Time per training step of ``choice`` (seconds), from ``CostTables.evaluate``."""
    memory_bytes: float
    """Memory per device of ``choice`` (bytes), from ``CostTables.evaluate``."""
    value: float
    """The minimised objective as the search computed it: seconds (``time`` objective, including
    ``memory_weight_s_per_byte * memory_bytes``) or bytes (``memory`` objective). Equal to the value
    recomputed from ``time_s``/``memory_bytes`` up to float rounding."""
    order_name: str
    """Which elimination order was used (``"exhaustive"`` for the oracle)."""
    max_table_cells: int
    """Largest table the search built: configurations of the eliminated op times those of its
    dependent set (0 for the oracle)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class FrontierPoint:
    """One (time, memory) trade-off and the strategy that achieves it."""

    time_s: float
    """Seconds per training step."""
    memory_bytes: float
    """Bytes per device."""
    choice: np.ndarray
    """``(num_ops,)`` int64: configuration index per op."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class FrontierResult:
    """A Pareto set of (time, memory) points, fastest first (memory strictly decreasing)."""

    points: tuple[FrontierPoint, ...]
    """Sorted by time ascending; empty when no choice has finite cost."""
    epsilon: float
    """Relative width of the memory buckets (0: exact); ``nan`` for methods without buckets."""
    exact: bool
    """True when ``points`` is provably the exact Pareto frontier (every Pareto-optimal (time,
    memory) pair appears)."""
    max_table_cells: int
    """Largest table of the elimination (0 for other methods)."""
    order_name: str
    method: FrontierMethod = "elimination"
    memory_bound_factor: float | None = 1.0
    """Guarantee of an inexact elimination frontier: for every Pareto-optimal strategy with cost
    (T*, M*) there is a listed point with time <= T* and memory <= ``memory_bound_factor`` x M*
    (for M* > 0). ``None`` when the method gives no guarantee (NSGA-II)."""
    bucket_depth: int = 0
    """Longest chain of bucketed Pareto filters any point went through; the a-priori bound is
    ``(1 + epsilon) ** bucket_depth`` (``memory_bound_factor`` is the tighter measured one)."""

    @property
    def times_s(self) -> np.ndarray:
        """``(n,)`` seconds of every point."""
        return np.array([p.time_s for p in self.points], dtype=np.float64)

    @property
    def memories_bytes(self) -> np.ndarray:
        """``(n,)`` bytes of every point."""
        return np.array([p.memory_bytes for p in self.points], dtype=np.float64)

    def bound_text(self) -> str:
        """One line saying how far the listed frontier may be from the exact one."""
        if self.method == "nsga2":
            return "NSGA-II approximation: no optimality guarantee"
        if self.method == "hull" and not self.exact:
            return (
                "convex hull by exact weighted DPs: its vertices are Pareto-optimal; points between "
                "them are the best among the vertices' configurations, so non-convex parts may be missed"
            )
        if self.exact:
            return "exact Pareto frontier"
        text = (
            f"approximate frontier (epsilon={self.epsilon:g}): every Pareto-optimal strategy "
            f"(T*, M*) has a listed point with T <= T* and M <= {self.memory_bound_factor:.6g} x M*"
        )
        if not math.isnan(self.epsilon) and self.memory_bound_factor is not None:
            apriori = (1.0 + self.epsilon) ** self.bucket_depth
            if self.memory_bound_factor <= apriori:
                text += f" (a-priori bound (1+eps)^{self.bucket_depth} = {apriori:.6g})"
            else:
                text += " (the max_points cap merged memory levels; raise it for a tighter bound)"
        return text

    def __str__(self) -> str:
        lines = [
            f"{len(self.points)} points ({self.method}, order {self.order_name}, "
            f"max table {self.max_table_cells} cells); {self.bound_text()}"
        ]
        lines += [f"  {p.time_s:.6g} s  {p.memory_bytes:.6g} B" for p in self.points]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class MemoryFit:
    """The fastest frontier point within a memory limit, or why none fits."""

    feasible: bool
    point: FrontierPoint | None
    """The fastest point with ``memory_bytes <= memory_limit_bytes`` (``None`` if none fits)."""
    memory_limit_bytes: float
    smallest_memory_bytes: float
    """The least memory any point needs (``inf`` for an empty frontier)."""
    message: str
    """One line for users; when nothing fits it names the smallest memory reached and the fix."""
