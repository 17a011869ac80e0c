"""FT frontier against the exhaustive Pareto frontier; the epsilon bound; the per-cell cap."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.search.exhaustive import exhaustive_frontier
from planner.search.frontier import FrontierTooCostly, pareto_frontier
from planner.search.pareto import pareto_mask
from planner.search.synthetic import chain_tables

from .random_tables import assert_valid_choice, block_chain_tables, random_tables

SEEDS = range(240)


def _values(front) -> list[tuple[float, float]]:
    return [(p.time_s, p.memory_bytes) for p in front.points]


def _assert_clean(tables, front) -> None:
    """Valid choices, sorted by time, memory strictly decreasing (a Pareto set)."""
    for p in front.points:
        assert_valid_choice(tables, p.choice, p.time_s, p.memory_bytes)
    t, m = front.times_s, front.memories_bytes
    assert np.all(np.diff(t) > 0) and np.all(np.diff(m) < 0)


def _assert_covered(oracle, front, factor: float) -> None:
    """Every exact point has a listed point no slower and within ``factor`` in memory."""
    t, m = front.times_s, front.memories_bytes
    for p in oracle.points:
        ok = (t <= p.time_s) & (m <= factor * p.memory_bytes * (1 + 1e-12))
        assert ok.any(), (p.time_s, p.memory_bytes)


class TestExactFrontier:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_equals_oracle(self, seed: int) -> None:
        tables = random_tables(seed)
        ours = pareto_frontier(tables, epsilon=0.0)
        oracle = exhaustive_frontier(tables)
        assert _values(ours) == _values(oracle)
        assert ours.exact and ours.memory_bound_factor == 1.0
        _assert_clean(tables, ours)

    @pytest.mark.parametrize("seed", range(3, 240, 8))
    def test_infinite_costs(self, seed: int) -> None:
        tables = random_tables(seed, infinite=0.3)
        ours = pareto_frontier(tables, epsilon=0.0)
        assert _values(ours) == _values(exhaustive_frontier(tables))
        _assert_clean(tables, ours)

    @pytest.mark.parametrize("seed", range(0, 240, 24))
    def test_work_budget(self, seed: int) -> None:
        # a budget that suffices changes nothing; one that does not stops before any result
        tables = random_tables(seed)
        free = pareto_frontier(tables, epsilon=0.0)
        assert _values(pareto_frontier(tables, epsilon=0.0, max_work=1e15)) == _values(free)
        with pytest.raises(FrontierTooCostly, match="work budget"):
            pareto_frontier(tables, epsilon=0.0, max_work=1.0)

    def test_deterministic(self) -> None:
        tables = block_chain_tables(4, num_blocks=4)
        first = pareto_frontier(tables, epsilon=0.0)
        again = pareto_frontier(tables, epsilon=0.0)
        assert _values(first) == _values(again)
        assert all(np.array_equal(a.choice, b.choice) for a, b in zip(first.points, again.points))


class TestBucketedFrontier:
    @pytest.mark.parametrize("seed", range(0, 240, 3))
    @pytest.mark.parametrize("epsilon", [0.05, 0.5])
    def test_bound_holds(self, seed: int, epsilon: float) -> None:
        tables = random_tables(seed)
        ours = pareto_frontier(tables, epsilon=epsilon)
        oracle = exhaustive_frontier(tables)
        _assert_clean(tables, ours)
        factor = ours.memory_bound_factor
        assert 1.0 <= factor <= (1 + epsilon) ** ours.bucket_depth * (1 + 1e-12)
        _assert_covered(oracle, ours, factor)
        assert ours.exact == (factor == 1.0)
        if ours.exact:
            assert _values(ours) == _values(oracle)
        assert "frontier" in ours.bound_text()

    @pytest.mark.parametrize("seed", range(5, 240, 10))
    @pytest.mark.parametrize("max_points", [1, 2])
    def test_cap(self, seed: int, max_points: int) -> None:
        tables = random_tables(seed)
        ours = pareto_frontier(tables, epsilon=0.0, max_points=max_points)
        oracle = exhaustive_frontier(tables)
        _assert_clean(tables, ours)
        assert len(ours.points) <= max_points
        _assert_covered(oracle, ours, ours.memory_bound_factor)

    def test_points_are_pareto_among_themselves(self) -> None:
        tables = block_chain_tables(11, num_blocks=3)
        front = pareto_frontier(tables, epsilon=0.2)
        assert pareto_mask(front.times_s, front.memories_bytes).all()

    def test_bad_arguments(self) -> None:
        tables = chain_tables([2, 2])
        with pytest.raises(InputError):
            pareto_frontier(tables, epsilon=-0.1)
        with pytest.raises(InputError):
            pareto_frontier(tables, max_points=0)
