"""NSGA-II: never beats the exact frontier, deterministic per seed, valid choices."""

from __future__ import annotations

import numpy as np
import pytest

from planner.search.frontier import pareto_frontier
from planner.search.nsga2 import nsga2_frontier
from planner.search.pareto import dominated_by, hypervolume
from planner.search.restrict import restrict

from .random_tables import assert_valid_choice, random_tables


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_never_dominates_the_exact_frontier(seed: int) -> None:
    tables = random_tables(100 + seed, "dag")
    exact = pareto_frontier(tables, epsilon=0.0)
    approx = nsga2_frontier(tables, seed=seed, population=24, generations=15)
    assert approx.points and not approx.exact and approx.memory_bound_factor is None
    for p in approx.points:
        assert_valid_choice(tables, p.choice, p.time_s, p.memory_bytes)
    assert not dominated_by(exact.times_s, exact.memories_bytes, approx.times_s, approx.memories_bytes).any()
    reference = (max(exact.times_s.max(), approx.times_s.max()) + 1, max(exact.memories_bytes.max(), approx.memories_bytes.max()) + 1)
    assert hypervolume(approx.times_s, approx.memories_bytes, reference) <= hypervolume(
        exact.times_s, exact.memories_bytes, reference
    )


def test_same_seed_same_frontier() -> None:
    tables = random_tables(7, "skip")
    a = nsga2_frontier(tables, seed=3, population=20, generations=10)
    b = nsga2_frontier(tables, seed=3, population=20, generations=10)
    assert [(p.time_s, p.memory_bytes) for p in a.points] == [(p.time_s, p.memory_bytes) for p in b.points]
    assert all(np.array_equal(x.choice, y.choice) for x, y in zip(a.points, b.points))


def test_single_configuration_ops() -> None:
    tables = random_tables(2, "chain")
    sub = restrict(tables, [np.arange(t.size) == 0 for t in tables.node_time_s]).tables
    front = nsga2_frontier(sub, seed=0, population=4, generations=2)
    assert len(front.points) == 1
    assert front.points[0].choice.tolist() == [0] * sub.num_ops
