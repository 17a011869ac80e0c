"""The FT elimination's memory is predicted before it is allocated (issue 15).

A hub op read by several leaves, eliminated last, combines every leaf's memory levels: one step sums
``K_hub x K^(leaves-1)`` combinations of looped levels with the ``K`` levels of the vectorised one.
That is how a T5 export's hull fill reached 5.3 GB under a 2 GB ``--max-memory`` (4.4e5 combinations
x 220 levels). :func:`planner.search.budget.frontier_step_bytes` predicts the step's peak before it
runs; the tests measure the real allocation with tracemalloc (numpy reports its buffers to it).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import planner.search.frontier as frontier_module
from planner.core.tables import CostTables, EdgeCost
from planner.search.budget import FRONTIER_BYTES_PER_SUM, SearchBudget, current_rss_bytes, frontier_step_bytes
from planner.search.degrade import frontier_within
from planner.search.exhaustive import exhaustive_frontier
from planner.search.frontier import FrontierTooCostly, pareto_frontier
from planner.search.hull import supported_frontier
from planner.search.synthetic import simple_space

HUB, LEAF, LEAVES = 4, 12, 4
# by hand: the hub's own unary set (one level per configuration) and LEAVES - 1 leaf sets are looped,
# the last leaf set (LEAF levels) is the vector
COMBINATIONS = HUB * LEAF ** (LEAVES - 1)
WIDTH = LEAF


def _hub(seed: int = 0, leaf: int = LEAF) -> CostTables:
    """Op 0 (HUB configurations) with an edge to each of LEAVES ops (LEAF configurations). Each
    op's time falls as its memory grows and edge times depend on the hub alone, so every
    configuration of a leaf is Pareto-optimal for every hub configuration: a memory level of its set."""
    rng = np.random.default_rng(seed)
    sizes = [HUB] + [leaf] * LEAVES
    return CostTables(
        configs=tuple(simple_space(s) for s in sizes),
        node_time_s=tuple(np.arange(s, 0, -1, dtype=np.float64) * 10 for s in sizes),
        node_memory_bytes=tuple(np.arange(1, s + 1, dtype=np.float64) * 4096 * (1 + i * s) for i, s in enumerate(sizes)),
        edges=tuple(
            EdgeCost(u=0, v=i, time_s=np.repeat(rng.integers(0, 50, size=(HUB, 1)).astype(np.float64), leaf, axis=1))
            for i in range(1, LEAVES + 1)
        ),
    )


_ORDER = [*range(1, LEAVES + 1), 0]  # the leaves first: the hub's step combines them all


class _Stop(Exception):
    pass


def _measure_hub_step(monkeypatch, **kwargs) -> tuple[int, int, int]:
    """Run the FT elimination up to the hub's bucketing; ``(combinations, width, peak bytes)`` of it."""
    original = frontier_module._output_buckets
    seen = []

    def measured(loops, vector, combos, *args, **kw):
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = original(loops, vector, combos, *args, **kw)
        peak = tracemalloc.get_traced_memory()[1] - before
        seen.append((len(combos), int(vector.pool.size), peak))
        if len(combos) > 1000:
            raise _Stop  # the step measured; its (slow) combination loop is not needed
        return result

    monkeypatch.setattr(frontier_module, "_output_buckets", measured)
    tracemalloc.start()
    try:
        with pytest.raises(_Stop):
            pareto_frontier(_hub(), epsilon=0.0, order=_ORDER, **kwargs)
    finally:
        tracemalloc.stop()
    return seen[-1]


def test_step_estimate_bounds_the_real_allocation(monkeypatch):
    combinations, width, peak = _measure_hub_step(monkeypatch)
    assert (combinations, width) == (COMBINATIONS, WIDTH)
    estimate = frontier_step_bytes(COMBINATIONS, WIDTH)
    assert estimate == COMBINATIONS * WIDTH * FRONTIER_BYTES_PER_SUM
    # an upper bound, and a tight one (measured 57.4 of the 64 bytes per sum)
    assert 0.8 * estimate <= peak <= estimate


def test_step_at_its_cap_runs(monkeypatch):
    combinations, _, _ = _measure_hub_step(monkeypatch, max_step_bytes=frontier_step_bytes(COMBINATIONS, WIDTH))
    assert combinations == COMBINATIONS


def test_step_over_its_cap_is_refused_before_allocating():
    estimate = frontier_step_bytes(COMBINATIONS, WIDTH)
    tracemalloc.start()
    try:
        with pytest.raises(FrontierTooCostly, match="over its memory cap"):
            pareto_frontier(_hub(), epsilon=0.0, order=_ORDER, max_step_bytes=estimate - 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < estimate / 4  # the leaves' small steps only


def _oracle(tables: CostTables) -> set[tuple[float, float]]:
    return {(p.time_s, p.memory_bytes) for p in exhaustive_frontier(tables).points}


def test_hull_fill_over_its_cap_keeps_the_vertices():
    tables = _hub()
    capped = supported_frontier(tables, fill_max_step_bytes=1.0)
    full = supported_frontier(tables)
    oracle = _oracle(tables)
    assert capped.order_name.endswith("(time limit)") and "fill" not in capped.order_name
    assert {(p.time_s, p.memory_bytes) for p in capped.points} <= oracle  # each vertex Pareto-optimal
    assert "fill" in full.order_name and len(full.points) > len(capped.points)


def test_frontier_within_degrades_at_a_small_ceiling():
    leaf = 24
    tables = _hub(leaf=leaf)
    # the default order eliminates the leaves but one, then the hub: HUB x leaf x leaf combinations
    # of leaf levels, 3.5 MiB; its exact DPs keep a few KiB. 2 MiB over what the process holds now:
    # the DPs fit, the FT elimination's hub step must not start
    assert frontier_step_bytes(HUB * leaf * leaf, leaf) > 3 * 2**20
    budget = SearchBudget(max_memory_bytes=current_rss_bytes() + 2 * 2**20)
    degraded = frontier_within(tables, budget)
    assert degraded.tier == "hull"
    assert any("weighted hull answered" in n for n in degraded.notes)
    assert {(p.time_s, p.memory_bytes) for p in degraded.result.points} <= _oracle(tables)
