"""The running frontier of one pipeline search (:class:`_Frontier`, :mod:`planner.search.pipeline`'s): the
plans priced so far that no other dominates, and the pruning questions the search asks of them (moved out of
that module, which stays under the size bar)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from planner.search.pipeline_bounds import _BOUND_SLACK

PipelinePoint = Any
"""``objectives.pipeline_cost.PipelinePoint``: a plan's point (``time_s``, ``memory_bytes``, its stages...)."""
Priced = Any
"""A priced plan: ``time_s``, ``memory_bytes``, ``fits`` and ``point()`` (its ``PipelinePoint``)."""


class _Frontier:
    """The Pareto set of the points priced so far (first of equal points), in the order found:
    the same set :func:`planner.search.pareto.pareto_mask` keeps from all of them at the end. A
    plan's point is built when :attr:`points` is read: most plans that join the frontier leave it again."""

    __slots__ = ("entries", "priced", "seeds", "fastest_only", "fastest_fit_s")

    def __init__(self, seeds: Sequence[tuple[float, float]] = (), *, fastest_only: bool = False) -> None:
        self.entries: list[Priced] = []  # each with its step time and memory, its point not built yet
        self.priced = 0
        self.seeds = tuple(seeds)
        """``(seconds, bytes)`` of points found elsewhere (another launcher's search): they prune
        like found points but are not this search's points."""
        self.fastest_only = fastest_only
        """Only the fastest plan that fits is asked of the search (the headroom search, which only informs:
        ``search_pipeline(informs=True)``): then every plan strictly slower than one found that fits is
        as good as dominated, whatever its memory (:meth:`beats`)."""
        self.fastest_fit_s = math.inf
        """With :attr:`fastest_only`, the step time of the fastest plan found that fits (``inf``: none yet)."""

    @property
    def points(self) -> list[PipelinePoint]:
        return [entry.point() for entry in self.entries]  # each built once (objectives.pipeline_price._Priced.point)

    @property
    def empty(self) -> bool:
        """Nothing found or seeded yet (nothing to prune with)."""
        return not self.entries and not self.seeds

    def add(self, priced: Priced) -> None:
        self.priced += 1
        t, m = priced.time_s, priced.memory_bytes
        if self.fastest_only and priced.fits:
            self.fastest_fit_s = min(self.fastest_fit_s, t)
        if any(q.time_s <= t and q.memory_bytes <= m for q in self.entries):
            return  # dominated, or equal to an earlier point
        self.entries = [q for q in self.entries if not (t <= q.time_s and m <= q.memory_bytes)]
        self.entries.append(priced)

    def ceiling(self, time_s: float) -> float:
        """Bytes at or above which a plan of ``time_s`` seconds or more is surely dominated by a point
        found (or seeded): the least memory of those faster by the bounds' slack, raised by it."""
        faster = [m for t, m in (*((q.time_s, q.memory_bytes) for q in self.entries), *self.seeds)
                  if t <= time_s * _BOUND_SLACK]
        return min(faster, default=math.inf) / _BOUND_SLACK

    def beats(self, time_s: float, memory_bytes: float) -> bool:
        """Whether a point found dominates every point at or above ``(time_s, memory_bytes)``; with
        :attr:`fastest_only`, also whether every such point is strictly slower than a plan found that fits:
        none of them is the fastest that fits (a tie in time is kept: the leaner of equal times is the pick)."""
        if time_s > self.fastest_fit_s:
            return True
        return any(
            t <= time_s and m <= memory_bytes and (t < time_s or m < memory_bytes)
            for t, m in (*((q.time_s, q.memory_bytes) for q in self.entries), *self.seeds)
        )
